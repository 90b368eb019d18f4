"""Steady-state cost of each dispatch of a model's decode step, without timestamps in between.

Per-dispatch timestamps serialize the GPU and add their own cost; here each dispatch of the decode
plan is repeated N times in one compute pass (one submit, CPU-timed to the readback), so the number is
what the dispatch costs back to back with itself, launch and barrier included. The table groups
dispatches by label and shape; the last line times the whole decode plan the same way. The clock
starts after encoding, at the submit: these are GPU times.
--ablate also times whole steps with each group's dispatches left out (wrong results, right timing):
the step's time minus that is what the group costs where it sits, in the step.

    python bench/kernel_chain.py -m model.gguf [-n 300] [--ablate]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import OrderedDict

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import shaderlm                              # noqa: E402
from shaderlm.gpu.plan import Plan           # noqa: E402


def timed(dev, plan, n, sync_buf):
    """GPU seconds per repeat of `plan` (encoding done before the clock starts)."""
    def encoded(k):
        enc = dev.encoder()
        cp = enc.begin_compute_pass()
        for _ in range(k):
            plan.encode(cp, 1)
        cp.end()
        return enc.finish()
    dev.submit([encoded(2)])
    dev.read(sync_buf, np.uint32, 0, 16)
    cb = encoded(n)
    t0 = time.perf_counter()
    dev.submit([cb])
    dev.read(sync_buf, np.uint32, 0, 16)
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", action="append")
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--ablate", action="store_true")
    a = ap.parse_args()
    for path in a.model or [None]:
        model = shaderlm.load(path, ctx=a.context + 16, progress=False)
        net, gen, dev = model.net, model.generator, model.device
        ids = list(np.random.default_rng(0).integers(0, net.cfg.vocab_size, a.context))
        gen._prefill(ids, 0, sample=True)
        gen._read_tokens(len(ids), 1)
        net.set_state(len(ids), 1, 0)
        groups: "OrderedDict[tuple, list]" = OrderedDict()
        for d in net.plan_decode.dispatches:
            groups.setdefault((d.label, d.workgroups(1), d.bytes), []).append(d)
        print(f"{os.path.basename(model.path)} on {dev.name}: per-dispatch cost, each repeated {a.n}x back to back")
        print(f"{'kernel':>22} | {'grid':>16} | {'MB':>7} | {'calls':>5} | {'us':>7} | {'GB/s':>6} | {'us x calls':>10}")
        total = 0.0
        for (label, grid, nbytes), ds in groups.items():
            # the sampler advances the position: time it at the same state every time
            us = timed(dev, Plan(dev, [ds[0]]), a.n, net.state) * 1e6
            net.set_state(len(ids), 1, 0)
            total += us * len(ds)
            gbs = nbytes / (us * 1e-6) / 1e9 if nbytes else 0
            print(f"{label:>22} | {str(grid):>16} | {nbytes / 1e6:7.2f} | {len(ds):>5} | {us:7.2f} | {gbs:6.0f} | "
                  f"{us * len(ds):10.1f}")
        step = timed(dev, net.plan_decode, 20, net.state) * 1e6
        net.set_state(len(ids), 1, 0)
        print(f"sum {total:.0f} us; whole decode step back to back: {step:.0f} us (= {1e6 / step:.0f} tok/s), "
              f"{len(net.plan_decode)} dispatches")
        if a.ablate:
            print(f"{'left out':>22} | {'grid':>16} | {'calls':>5} | {'step us':>8} | {'saved us':>8} | {'per call':>8}")
            for (label, grid, nbytes), ds in groups.items():
                drop = set(map(id, ds))
                rest = Plan(dev, [d for d in net.plan_decode.dispatches if id(d) not in drop])
                us = timed(dev, rest, 20, net.state) * 1e6
                net.set_state(len(ids), 1, 0)
                print(f"{label:>22} | {str(grid):>16} | {len(ds):>5} | {us:8.0f} | {step - us:8.1f} | "
                      f"{(step - us) / len(ds):8.2f}")


if __name__ == "__main__":
    main()
