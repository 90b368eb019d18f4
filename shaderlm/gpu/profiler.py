"""Per-dispatch GPU time of a plan from timestamp queries written between dispatches.

Each interval [t_i, t_i+1] covers dispatch i including its launch and the barrier before it, which
is what a dependent chain of small kernels really costs. Without timestamp queries inside passes
(Dawn), each dispatch gets a pass of its own with timestamps at its start and end (the passes'
boundaries are not counted); without timestamp queries at all, each dispatch is submitted and waited
for alone and timed on the CPU (with a warning: that adds submit and sync overhead to every number).
"""
from __future__ import annotations

import sys
import time
from collections import OrderedDict

import numpy as np

from .backend import BufferUsage, native_api


def _timestamp_period(dev) -> float:
    api = native_api()
    if api is None:          # other WebGPU packages report nanoseconds
        return 1.0
    try:
        return float(api[1].wgpuQueueGetTimestampPeriod(dev.queue._internal))
    except Exception:  # noqa: BLE001 - a wgpu-native without the call: nanoseconds
        return 1.0


def time_dispatches(dev, plan, n: int = 1) -> list[float]:
    """Seconds per dispatch of `plan` run once with n tokens."""
    singles = [type(plan)(dev, [d]) for d in plan.dispatches]
    if "timestamp-query-inside-passes" in dev.features:
        def record(enc, qs):
            cpass = enc.begin_compute_pass()
            cpass._write_timestamp(qs, 0)
            for i, one in enumerate(singles):
                one.encode(cpass, n)
                cpass._write_timestamp(qs, i + 1)
            cpass.end()
        return list(np.diff(_timestamps(dev, len(singles) + 1, record)))
    if dev.has_timestamps:
        def record(enc, qs):
            for i, one in enumerate(singles):
                cpass = enc.begin_compute_pass(timestamp_writes={
                    "query_set": qs, "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
                one.encode(cpass, n)
                cpass.end()
        ts = _timestamps(dev, 2 * len(singles), record)
        return list(ts[1::2] - ts[0::2])
    print("shaderlm profile: no timestamp queries on this adapter; timing each dispatch on the CPU "
          "(includes submit and sync)", file=sys.stderr)
    out = []
    for one in singles:
        t0 = time.perf_counter()
        one.run(n)
        dev.read(plan_state_probe(dev), np.uint32)
        out.append(time.perf_counter() - t0)
    return out


def _timestamps(dev, count: int, record) -> np.ndarray:
    """Seconds of `count` timestamps that `record(encoder, query_set)` writes, run once."""
    qs = dev.device.create_query_set(type="timestamp", count=count)
    resolve = dev.device.create_buffer(size=8 * count, usage=BufferUsage.QUERY_RESOLVE | BufferUsage.COPY_SRC)
    enc = dev.encoder()
    record(enc, qs)
    enc.resolve_query_set(qs, 0, count, resolve, 0)
    dev.submit([enc.finish()])
    ts = np.frombuffer(dev.queue.read_buffer(resolve), np.uint64).astype(np.float64)
    return ts * _timestamp_period(dev) * 1e-9


_probe = {}


def plan_state_probe(dev):
    if dev not in _probe:
        _probe[dev] = dev.buffer(16)
    return _probe[dev]


def summarize(plan, seconds: list[float]) -> list[dict]:
    """Per kernel label: calls, total us, share, bytes and achieved GB/s."""
    rows: "OrderedDict[str, dict]" = OrderedDict()
    total = sum(seconds) or 1e-12
    for d, s in zip(plan.dispatches, seconds):
        r = rows.setdefault(d.label, {"kernel": d.label, "calls": 0, "us": 0.0, "bytes": 0})
        r["calls"] += 1
        r["us"] += s * 1e6
        r["bytes"] += d.bytes
    for r in rows.values():
        r["share"] = r["us"] / (total * 1e6)
        r["gbs"] = r["bytes"] / (r["us"] * 1e-6) / 1e9 if r["bytes"] and r["us"] else 0.0
    return sorted(rows.values(), key=lambda r: -r["us"])
