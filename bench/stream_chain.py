"""How fast can a dispatch the size of one decode GEMV stream its bytes? peak_read.wgsl over distinct
buffers of a GEMV's size (so L2 does not help), chained as in a decode step (each writes the same
output, so each waits for the last), timed from the CPU. Compare its GB/s with gemv_sweep.py's at the
same size: the gap is what the GEMV's own structure costs.

    python bench/stream_chain.py [--mb 9.4,33,66,430]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from shaderlm.gpu.device import get_device            # noqa: E402
from shaderlm.gpu.plan import Dispatch, Plan          # noqa: E402


def chain(dev, mb: float, threads_per_vec: int, unroll: int, total_mb: int = 1024, reps: int = 5):
    size = int(mb * 1e6) // 16 * 16
    copies = max(2, min(64, int(total_mb * 1e6 // size)))
    pipe = dev.pipeline("peak_read", UNROLL=unroll)
    groups = max(1, size // 16 // threads_per_vec // 256)
    out = dev.buffer(groups * 256 * 4)
    bufs = [dev.buffer(size) for _ in range(copies)]
    plan = Plan(dev, [Dispatch(pipe, dev.bind_group(pipe, [b, out]), (groups, 1, 1)) for b in bufs])
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        plan.run(1)
        dev.read(out, np.uint32, 0, 16)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        plan.run(1, repeat=3)
        dev.read(out, np.uint32, 0, 16)
        ts.append((time.perf_counter() - t0) / (3 * copies))
    us = statistics.median(ts) * 1e6
    return us, size / us / 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", default="9.4,33,48,66,430")
    a = ap.parse_args()
    dev = get_device()
    print(f"device: {dev.name}")
    configs = [(1, 1), (4, 4), (16, 4), (64, 4)]   # (vec4 loads per thread, unroll)
    print(f"{'MB':>7} | " + " | ".join(f"{t:>3}/thr u{u}: us  GB/s" for t, u in configs))
    for mb in (float(v) for v in a.mb.split(",")):
        cells = [chain(dev, mb, t, u) for t, u in configs]
        print(f"{mb:7.1f} | " + " | ".join(f"{us:8.1f} {gbs:6.0f}      " for us, gbs in cells), flush=True)


if __name__ == "__main__":
    main()
