"""The adapter's streaming read bandwidth: what the decode GEMVs' GB/s are measured against."""
from __future__ import annotations

import statistics
import time

import numpy as np

from ..gpu.plan import Dispatch, Plan
from ..gpu.profiler import time_dispatches
from . import pipeline


def peak_read_gbs(dev, reps: int = 10) -> float:
    """Streaming read bandwidth (GB/s) of a WGSL kernel over a buffer much larger than any cache."""
    size = min(dev.max_binding, 1 << 30) // 16 * 16
    src = dev.buffer(size)
    dev.write(src, np.arange(min(size, 1 << 24) // 4, dtype=np.uint32))   # not all zeros
    pipe = pipeline(dev, "peak_read", UNROLL=4)
    groups = 4096
    out = dev.buffer(groups * 256 * 4)
    plan = Plan(dev, [Dispatch(pipe, dev.bind_group(pipe, [src, out]), (groups, 1, 1), label="peak_read",
                               bytes=size)])
    return size / _median_seconds(dev, plan, 1, out, reps) / 1e9


def _median_seconds(dev, plan, n: int, out, reps: int) -> float:
    """Median GPU seconds of plan run with n tokens (after a warm-up run): its dispatches' timestamps,
    or the CPU clock around run and a read of `out` where the adapter has no timestamps."""
    plan.run(n)
    dev.read(out, np.uint32, 0, 16)
    times = []
    for _ in range(reps):
        if dev.has_timestamps:
            times.append(sum(time_dispatches(dev, plan, n)))
            continue
        t0 = time.perf_counter()
        plan.run(n)
        dev.read(out, np.uint32, 0, 16)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def peak_gemm_tflops(dev, int8: bool, rows: int = 14336, k: int = 4096, tokens: int = 512, reps: int = 5) -> float:
    """TFLOP/s (2 per multiply-add) of the prefill GEMM on a Q4_0 matrix of an 8B model's FFN shape
    (random bytes: the speed does not depend on the values), the int8 or the f32 path."""
    from .ops import matmul
    from .weights import upload_weight
    raw = np.random.default_rng(0).integers(0, 256, rows * k // 32 * 18, dtype=np.uint8)
    raw.reshape(-1, 18)[:, 1] &= 0x3B                # f16 scales finite: NaN/Inf-free sums
    w = upload_weight(dev, "peak", "Q4_0", (rows, k), raw)
    x, y = dev.buffer(tokens * k * 4), dev.buffer(tokens * rows * 4)
    st = dev.upload(np.array([0, tokens, 0, 0, 0, 0, 0, 0], np.uint32))
    plan = Plan(dev, matmul(dev, w, x, y, st, tt=tokens, y_stride=rows, int8=int8))
    return 2.0 * rows * k * tokens / _median_seconds(dev, plan, tokens, y, reps) / 1e12
