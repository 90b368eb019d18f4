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
    plan.run(1)
    dev.read(out, np.uint32, 0, 16)
    if "timestamp-query-inside-passes" in dev.features:
        times = [time_dispatches(dev, plan, 1)[0] for _ in range(reps)]
    else:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            plan.run(1)
            dev.read(out, np.uint32, 0, 16)
            times.append(time.perf_counter() - t0)
    return size / statistics.median(times) / 1e9
