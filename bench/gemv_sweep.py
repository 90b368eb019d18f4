"""Decode GEMV variants on real shapes: GPU time per matrix and achieved read bandwidth.

    python bench/gemv_sweep.py                      # the yardstick models' shapes, default variants
    python bench/gemv_sweep.py --variants old,auto,128x4,256x8 --case Q4_K:4096x4096

Each case uploads enough copies of a random matrix (valid blocks, synth.py's generator) that one pass
over them is several times the GPU's L2, runs them as a chain of dispatches in one compute pass
(each writes the same output buffer, so each waits for the last, as in a decode step), and times
the chain from the CPU (no timestamps between dispatches: they serialize and cost time themselves).
Variants: `old` (matmul.wgsl, the generic kernel), `auto` (gemv.wgsl in its default or tuned shape),
`WGxROWS[xSTEPS[xGROUPS]]` (gemv.wgsl in that shape); `+X24` takes x as 24-bit fixed point (the
default in models; without it the variant has f32 x), `+INT8_X` flags the weights for int8 x, as
--int8-act does. Output: a table, and each variant's max relative difference from the first.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from shaderlm.gpu.device import get_device
from shaderlm.gpu.plan import Plan
from shaderlm.kernels import gemv, ops
from shaderlm.kernels.peak import peak_read_gbs
from shaderlm.kernels.weights import upload_weight
from shaderlm.synth import _random_float_rows, _random_quant_rows

# (type, rows, K, what): the matrices of one decode step of the yardstick models
DEFAULT_CASES = [
    ("Q4_K", 4096, 4096, "8B q/o"), ("Q4_K", 28672, 4096, "8B gate+up"), ("Q6_K", 4096, 14336, "8B down"),
    ("Q6_K", 128256, 4096, "8B lm head"), ("Q4_0", 4096, 4096, "8B q4_0 q/o"), ("Q4_0", 4096, 14336, "8B q4_0 down"),
    ("Q8_0", 2048, 2048, "1B q8 q/o"), ("Q8_0", 16384, 2048, "1B q8 gate+up"), ("Q8_0", 2048, 8192, "1B q8 down"),
    ("Q4_K", 3072, 2048, "1B qkv"), ("Q6_K", 2048, 8192, "1B down"), ("Q6_K", 128256, 2048, "1B head"),
    ("Q4_1", 960, 576, "135M qkv"), ("Q4_1", 3072, 576, "135M gate+up"), ("Q4_1", 576, 1536, "135M down"),
    ("Q8_0", 49152, 576, "135M head"), ("Q8_0", 32, 64, "floor"),
]


def make(dev, qtype, rows, k, seed):
    rng = np.random.default_rng(seed)
    if qtype in ("F16", "BF16", "F32"):
        raw = _random_float_rows(qtype, rows, k, 0.02, rng)
    else:
        raw = _random_quant_rows(qtype, rows, k, 0.02, np.random.PCG64(seed), rng)
    return upload_weight(dev, f"w{seed}", qtype, (rows, k), np.ascontiguousarray(raw).reshape(-1))


def run_case(dev, qtype, rows, k, variants, min_bytes, reps, warm_s=0.5):
    w0 = make(dev, qtype, rows, k, 0)
    copies = max(1, min(64, -(-min_bytes // w0.nbytes)))
    ws = [w0] + [make(dev, qtype, rows, k, i) for i in range(1, copies)]
    x = dev.upload(np.random.default_rng(9).standard_normal(k).astype(np.float32))
    y = dev.buffer(rows * 4)
    st = dev.upload(np.array([0, 1, 0, 0], np.uint32))
    out, plans, ref = {}, {}, None
    for v in variants:
        shape_v, *flags = v.split("+")
        for w in ws:
            w.int8_x = "INT8_X" in flags and w.qtype.int8_dot
            w.x24 = "X24" in flags
        try:
            if shape_v == "old":       # via from_state_row (out_row0 = 0 here), which the wide GEMV does not take
                ds = [d for w in ws for d in ops.matmul(dev, w, x, y, st, tt=1, y_stride=rows, from_state_row=True)]
                shape = None
            else:
                shape = gemv.default_shape(dev, w0) if shape_v == "auto" else \
                    gemv.GemvShape.of(int(s) for s in shape_v.split("x"))
                shape = shape._replace(int_x=int("X24" in flags or "INT8_X" in flags))
                ds = [d for w in ws for d in gemv.gemv(dev, w, x, y, y_stride=rows, shape=shape)]
            plan = Plan(dev, ds)
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
            out[v] = (float("nan"), float("nan"), f"error: {str(e)[:60]}")
            continue
        Plan(dev, plan.dispatches[:len(plan) // copies]).run(1)
        got = dev.read(y, np.float32)[:rows]
        ref = got if ref is None else ref
        err = float(np.max(np.abs(got - ref)) / (np.max(np.abs(ref)) + 1e-30))
        plans[v] = (plan, f"{err:.1e}" + (" " + shape.label() if shape else ""))
    # CPU-timed chains of all copies, one submit each (no timestamps between dispatches: they
    # serialize and cost time themselves); variants interleaved so that clock changes hit all alike
    times = {v: [] for v in plans}
    t_warm = time.perf_counter()           # keep the GPU busy until its clocks are up (an idle GPU
    while time.perf_counter() - t_warm < warm_s:   # during data generation drops to ~400 MHz)
        for plan, _ in plans.values():
            plan.run(1)
        dev.read(y, np.float32, 0, 16)
    for rep in range(reps + 1):
        for v, (plan, _) in plans.items():
            t0 = time.perf_counter()
            plan.run(1, repeat=3)
            dev.read(y, np.float32, 0, 16)
            if rep:
                times[v].append((time.perf_counter() - t0) / (3 * len(plan)))
    for v, (plan, note) in plans.items():
        us = statistics.median(times[v]) * 1e6
        out[v] = (us, w0.nbytes / (us * 1e-6) / 1e9, note)
    return w0.nbytes, out


def warm_up(dev, seconds: float):
    """Keep the GPU streaming for a while first: an idle GPU's low clocks made the first numbers 2-3x off."""
    t0, gbs = time.perf_counter(), 0.0
    while time.perf_counter() - t0 < seconds:
        gbs = peak_read_gbs(dev, reps=10)
    print(f"warm-up {seconds:.0f} s, then peak read {peak_read_gbs(dev, reps=10):.0f} GB/s (last warm-up {gbs:.0f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--case", action="append", help="TYPE:ROWSxK (repeatable; default: the yardsticks' matrices)")
    ap.add_argument("--variants", default="old,auto+X24", help="comma-separated (see above)")
    ap.add_argument("--min-mb", type=int, default=512, help="bytes of distinct copies per pass (beat the L2)")
    ap.add_argument("-r", type=int, default=5, help="timed repetitions (median)")
    ap.add_argument("--warm-s", type=float, default=4.0)
    ap.add_argument("--case-warm-s", type=float, default=0.5, help="GPU busy time before each case's timing")
    a = ap.parse_args()
    dev = get_device()
    cases = DEFAULT_CASES
    if a.case:
        cases = []
        for c in a.case:
            t, shape = c.split(":")
            r, k = shape.split("x")
            cases.append((t, int(r), int(k), c))
    variants = a.variants.split(",")
    print(f"device: {dev.name}, subgroup {dev.subgroup_size}")
    warm_up(dev, a.warm_s)
    rows_out = []
    for t, r, k, what in cases:
        nbytes, res = run_case(dev, t, r, k, variants, a.min_mb << 20, a.r, a.case_warm_s)
        rows_out.append((what, t, r, k, nbytes, res))
        line = " | ".join(f"{v} {res[v][0]:7.1f}us {res[v][1]:6.0f}GB/s ({res[v][2]})" for v in variants)
        print(f"{what:>14} {t} {r}x{k} {nbytes / 1e6:7.2f}MB | {line}", flush=True)
    print("\nGB/s per variant")
    print(f"{'case':>16} | {'MB':>7} | " + " | ".join(f"{v:>12}" for v in variants))
    for what, t, r, k, nbytes, res in rows_out:
        print(f"{what:>16} | {nbytes / 1e6:7.2f} | " + " | ".join(
            f"{res[v][1]:6.0f} {res[v][0]:5.1f}" for v in variants))


if __name__ == "__main__":
    main()
