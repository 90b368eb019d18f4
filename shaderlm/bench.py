"""`shaderlm bench`: llama-bench style prompt (pp) and generation (tg) throughput; `shaderlm profile`:
GPU time per kernel of a decode step."""
from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np

from .engine.generate import Sampling
from .errors import ContextFullError, ShaderLMError
from .kernels import gemm
from .models import PREFILL_CHUNK


def _random_ids(model, n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, model.net.vocab_size, n).tolist()


WARM_S = 1.0            # seconds of passes before a prompt's timed ones


def bench_prompt(model, n: int, reps: int, depth: int = 0) -> list[float]:
    """Prefill tok/s of n tokens after `depth` tokens already in the KV cache (llama-bench's -d)."""
    net = model.net
    ids = _random_ids(model, n)
    if depth:
        net.prefill(_random_ids(model, depth, 1), 0, sample=False)

    def once() -> float:
        t0 = time.perf_counter()
        net.prefill(ids, depth, sample=True)
        net.read_tokens(depth + n, 1)
        return time.perf_counter() - t0
    # warm pipelines, caches and the GPU's clocks: an idle GPU clocks down, and a small model's passes are
    # too short to bring them up in a single run
    t_end = time.perf_counter() + WARM_S
    once()
    while time.perf_counter() < t_end:
        once()
    return [n / once() for _ in range(reps)]


def bench_gen(model, n: int, reps: int, depth: int = 0) -> tuple[list[float], list[float]]:
    """Decode tok/s per repetition, and the CPU seconds per token spent encoding; with `depth`, the
    tokens are generated after a prompt of that many tokens (its prefill not timed)."""
    gen = model.generator
    prompt = _random_ids(model, depth, 1) if depth else [1]
    out, cpu = [], []
    for r in range(reps + 1):
        gen.reset()
        toks = list(gen.generate(prompt, n, Sampling(), stop_ids=(), keep_history=False))
        assert len(toks) == n
        s = gen.stats
        if r:
            out.append((s.decode_tokens - 1) / s.decode_s if s.decode_s else 0.0)
            cpu.append(s.encode_s / max(s.decode_tokens - 1, 1))
    return out, cpu


def bench_batch(model, batch: int, prompt: int, gen: int, reps: int) -> tuple[list[float], bool]:
    """Aggregate decode tok/s of `batch` sequences at once (llama-batched-bench's S_TG): each with a
    prompt of `prompt` tokens (prefilled first, not timed), then `gen` batched steps of every sequence.
    Also whether the steps ran on the int8 batch matmuls (models/serving.py)."""
    from .models.serving import Serving
    k = 8
    sv = Serving(model.net, slots=batch, seq_ctx=prompt + gen + 2 * k + 2, tokens_per_submit=k)
    for s in range(batch):
        sv.set_own_pages(s)
    out = []
    for r in range(reps + 1):
        for s in range(batch):
            sv.prefill(s, _random_ids(model, prompt, seed=s + 100 * r), 0, sample=True)
        sv.read_tokens(0, prompt, 1)
        pos, done, queued = prompt, 0, []
        t0 = time.perf_counter()
        while done < gen:
            while len(queued) < 2 and done + sum(b.k for b in queued) < gen:
                n = min(k, gen - done - sum(b.k for b in queued))
                b = sv.record(list(range(batch)), [pos] * batch, n)
                sv.submit(b)
                pos += n
                queued.append(b)
            b = queued.pop(0)
            sv.tokens_of(b)
            done += b.k
        dt = time.perf_counter() - t0
        if r:                                   # the first run builds the plan and warms the GPU
            out.append(batch * gen / dt)
    return out, sv.on_gemms(batch)


def run(args):
    import shaderlm
    rows = []
    if args.peak:
        from .gpu.device import get_device
        from .kernels.peak import peak_gemm_tflops, peak_read_gbs
        from .options import Options
        opts = Options.from_env().replace(device=args.device)
        dev = get_device(opts.device, opts.subgroups)
        args.peak_gbs = peak_read_gbs(dev)
        print(f"peak streaming read (WGSL, {dev.name}): {args.peak_gbs:.0f} GB/s")
        if not dev.is_cpu:          # minutes on a CPU adapter
            i8, f32 = (peak_gemm_tflops(dev, int8) for int8 in (True, False))
            path = "tensor cores" if gemm.tensor_cores(dev) else "int8"
            print(f"prefill GEMM (Q4_0 14336x4096, 512 tokens): {path} {i8:.1f} TFLOP/s, f32 {f32:.1f} TFLOP/s")
    depth, prompt, gen = max(args.d), max(args.p + [0]), max(args.n + [0])
    need = depth + prompt + gen + 8
    batches = args.batch_sizes or []
    for path in args.model or [None]:
        model = shaderlm.load(path, device=args.device, ctx=max(need, 64),
                              batch=max(args.batch or PREFILL_CHUNK, *batches, 1),
                              tokens_per_submit=args.tokens_per_submit, progress=False,
                              int8_act=args.int8_act, exact_prefill=args.exact_prefill)
        if need > model.net.ctx:
            raise ContextFullError(f"bench: depth {depth} + prompt {prompt} + generated {gen} tokens do not "
                                   f"fit {model.path}'s context of {model.net.ctx} tokens")
        name = os.path.basename(model.path)
        size = model.net.weight_bytes
        quant = model.metadata.get("general.file_type", "")
        peak = args.peak_gbs
        extra = {"int8_act": model.net.int8_act, "int8_prefill": model.net.int8_prefill,
                 "tensor_cores": any(d.label.startswith("matmul_tc") for d in model.net.plan_prefill[False].dispatches)}
        for d in args.d:
            at = f" @ d{d}" if d else ""
            for p in args.p:
                if p and not batches:
                    tps = bench_prompt(model, p, args.r, d)
                    # a run is timed from the prompt's submit to its first token's id: the time to first token
                    rows.append(_row(name, size, quant, f"pp{p}{at}", tps, 0, peak,
                                     ttft_ms=1000 * p / statistics.median(tps), **extra))
            for n in args.n:
                if not n:
                    continue
                if batches:
                    for b in batches:
                        tps, gemms = bench_batch(model, b, max(args.p[0], 1), n, args.r)
                        rows.append(_row(name, size, quant, f"pp{args.p[0]}+tg{n} x{b}" + " gemm" * gemms, tps, 0,
                                         peak, batch=b, **extra))
                    continue
                tps, cpu = bench_gen(model, n, args.r, d)
                rows.append(_row(name, size, quant, f"tg{n}{at}", tps, model.net.decode_bytes(), peak,
                                 dispatches=len(model.net.plan_decode), per_submit=model.generator.k,
                                 cpu_ms_per_token=1000 * statistics.median(cpu), **extra))
        device = model.device.name
    if args.json:
        print(json.dumps({"device": device, "results": rows}, indent=1))
        return
    cols = ["model", "size", "quant", "test", "tok/s", "+/-", "ms/tok", "cpu ms/tok", "MB/tok", "GB/s", "%peak",
            "TTFT ms"]
    print(f"device: {device}")
    print(" | ".join(f"{c:>10}" for c in cols))
    for r in rows:
        exact = r["test"].startswith("pp") and not r["int8_prefill"]       # prompts through the f32 GEMM
        tc = r["test"].startswith("pp") and "batch" not in r and r.get("tensor_cores", False)   # matmul_tc
        vals = [r["model"][:28], f"{r['size'] / 1e6:.0f}MB", _quant_name(r["quant"]) + " i8x" * r["int8_act"],
                r["test"] + " f32" * exact + " tc" * tc,
                f"{r['tps']:.1f}", f"{r['spread']:.1f}",
                f"{1000 / r['tps']:.3f}" if r["tps"] else "-",
                f"{r['cpu_ms_per_token']:.3f}" if "cpu_ms_per_token" in r else "-",
                f"{r['bytes'] / 1e6:.1f}" if r["bytes"] else "-",
                f"{r['gbs']:.0f}" if r["bytes"] else "-", f"{r['pct_peak']:.0f}" if r.get("pct_peak") else "-",
                f"{r['ttft_ms']:.1f}" if "ttft_ms" in r else "-"]
        print(" | ".join(f"{v:>10}" for v in vals))


def _quant_name(file_type) -> str:
    """general.file_type (llama.cpp's LlamaFileType number) as its name, e.g. 15 -> Q4_K_M."""
    try:
        from gguf.constants import LlamaFileType
        return LlamaFileType(int(file_type)).name.replace("MOSTLY_", "").replace("ALL_", "")
    except (ValueError, TypeError, ImportError):
        return str(file_type or "-")


def _row(name, size, quant, test, tps_list, nbytes, peak, **extra):
    med = statistics.median(tps_list)
    spread = (max(tps_list) - min(tps_list)) / 2 if len(tps_list) > 1 else 0.0
    gbs = med * nbytes / 1e9
    r = {"model": name, "size": size, "quant": quant, "test": test, "tps": med, "spread": spread,
         "runs": tps_list, "bytes": nbytes, "gbs": gbs, **extra}
    if peak and nbytes:
        r["pct_peak"] = 100 * gbs / peak
    return r


def add_parsers(sub, add_precision):
    p = sub.add_parser("bench", help="prompt and generation throughput, llama-bench style")
    p.add_argument("--model", "-m", action="append", help="GGUF file (repeatable; default SmolLM2)")
    p.add_argument("--device")
    p.add_argument("-p", type=int, action="append", help="prompt lengths (default 512)")
    p.add_argument("-n", type=int, action="append", help="generated lengths (default 128)")
    p.add_argument("-r", type=int, default=5, help="repetitions (median reported)")
    p.add_argument("-d", type=int, action="append",
                   help="depths: tokens already in the KV cache before each test (default 0)")
    p.add_argument("--batch", type=int, help="prompt tokens a prefill pass (default the library's, 512)")
    p.add_argument("--tokens-per-submit", type=int, default=8)
    p.add_argument("--peak", action="store_true", help="first measure the adapter's streaming read bandwidth")
    p.add_argument("--peak-gbs", type=float, default=0.0, help="peak read bandwidth for the %%peak column")
    p.add_argument("--batch-sizes", "-B", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   metavar="1,4,16,64", help="batched decode instead (llama-batched-bench's S_TG): this many "
                   "sequences at once, each a prompt of -p tokens (not timed) then -n tokens")
    p.add_argument("--json", action="store_true")
    add_precision(p)
    p.set_defaults(fn=lambda a: run(_defaults(a)))

    p = sub.add_parser("profile", help="GPU time per kernel over one decode step (and a prefill)")
    p.add_argument("--model", "-m")
    p.add_argument("--device")
    p.add_argument("--context", type=int, default=128, help="tokens in the cache before the decode step")
    add_precision(p)
    p.add_argument("--prefill", type=int, default=0, help="also profile a prefill of this many tokens")
    p.add_argument("-r", type=int, default=5, help="decode repetitions (median per dispatch)")
    p.add_argument("--batch-sizes", "-B", type=lambda v: [int(x) for x in v.split(",")], default=None,
                   metavar="1,4,16", help="also profile the serving engine's decode step of this many sequences, "
                   "each after a prompt of --context tokens")
    p.set_defaults(fn=profile)


def _defaults(a):
    a.p = a.p if a.p is not None else [512]
    a.n = a.n if a.n is not None else [128]
    a.d = a.d if a.d is not None else [0]
    if any(v < 0 for v in a.d + a.p + a.n) or a.r < 1:
        raise ShaderLMError("bench: -d, -p and -n take 0 or more tokens, -r 1 or more")
    return a


def profile(args):
    """`shaderlm profile`: GPU time per kernel over one decode step (and a prefill)."""
    import shaderlm
    from .gpu.profiler import time_dispatches
    from .models.serving import bucket
    if any(b < 1 for b in args.batch_sizes or []):
        raise ShaderLMError(f"profile: -B takes batches of 1 sequence or more, not {args.batch_sizes}")
    ctx = max(args.context + args.prefill + 8, 64)
    rows = [bucket(b) for b in args.batch_sizes or []]          # activation rows a serving step needs
    # prompt passes of the usual size, whose GEMM tiles `bench` and `run` have tuned (not a few rows')
    model = shaderlm.load(args.model, device=args.device, ctx=ctx, batch=max(args.prefill, *rows, PREFILL_CHUNK),
                          progress=False, int8_act=args.int8_act, exact_prefill=args.exact_prefill)
    net = model.net
    ids = np.random.default_rng(0).integers(0, net.vocab_size, max(args.context, 1)).tolist()
    net.prefill(ids, 0, sample=True)
    net.read_tokens(len(ids), 1)
    runs = []
    for _ in range(args.r):
        net.set_state(len(ids), 1, 0)
        runs.append(time_dispatches(model.device, net.plan_decode, 1))
    per = list(np.median(np.array(runs), axis=0))
    _print_profile(f"decode step at position {len(ids)} ({model.device.name})", net.plan_decode, per)
    if args.prefill:
        plan = net.prefill_plan(args.prefill, True)
        for _ in range(2):                      # the first run warms the GPU and its caches
            net.set_state(0, args.prefill, args.prefill - 1)
            per = time_dispatches(model.device, plan, args.prefill)
        _print_profile(f"prefill of {args.prefill} tokens", plan, per, tokens=args.prefill)
    for batch in args.batch_sizes or []:
        _profile_batch(model, batch, ids, args.r)


def _profile_batch(model, batch: int, ids: list[int], reps: int):
    """The serving engine's decode step of `batch` sequences, each after the prompt `ids`."""
    from .gpu.profiler import time_dispatches
    from .models.serving import Serving, bucket
    sv = Serving(model.net, slots=batch, seq_ctx=len(ids) + reps + 24, tokens_per_submit=1)
    for s in range(batch):
        sv.set_own_pages(s)
        sv.prefill(s, ids, 0, sample=True)
    step = sv.record(list(range(batch)), [len(ids)] * batch, 1)    # writes the batch's rows; warms the plan
    sv.submit(step)
    sv.tokens_of(step)
    rows = bucket(batch)
    plan = sv.decode_plan(rows)
    per = list(np.median(np.array([time_dispatches(model.device, plan, rows) for _ in range(reps)]), axis=0))
    how = "int8 GEMMs" if sv.on_gemms(batch) else "GEMVs"
    _print_profile(f"serving decode step of {batch} sequences at position {len(ids) + 1} ({rows} rows, {how})",
                   plan, per, tokens=batch)


def _print_profile(title, plan, seconds, tokens: int = 1):
    """A plan's GPU time by kernel; `tokens`: what one run of it computes (a step's sequences)."""
    from .gpu.profiler import summarize
    total = sum(seconds)
    print(f"{title}: {len(plan)} dispatches, GPU {total * 1e6:.1f} us"
          + (f" (= {tokens / total:.0f} tok/s if GPU-bound)" if total else ""))
    print(f"{'kernel':>22} | {'calls':>5} | {'total us':>9} | {'share':>6} | {'GB/s':>7}")
    for r in summarize(plan, seconds):
        print(f"{r['kernel']:>22} | {r['calls']:>5} | {r['us']:>9.1f} | {100 * r['share']:>5.1f}% | "
              f"{r['gbs']:>7.0f}")
