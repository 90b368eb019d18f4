"""Whole decode steps with one GEMV key's dispatches in each of many shapes: wider than the tuner's
candidates, to see whether its search leaves speed behind (and how far a key is from a pure stream).

    python bench/shape_sweep.py -m model.gguf --key 128256 [--hoist-grid] [--shape 128,4,1,8,1,1,1 ...]

The model loads with the adapter's tuned shapes (tune it first: `shaderlm tune`); every key whose
name contains --key is swept in turn. Shapes are full_shape tuples (workgroup size, rows, steps,
groups, x24, butterfly, prefetch). --hoist-grid adds every row-group shape of 1-8 rows, 2-16 groups,
with and without the prefetch, for the lane counts covering a row in 1 or 2 steps. Each step is
timed as the tuner's first round times it (autotune._timer: median of 5, interleaved), at position
--context. One round is noisy (bench/NOTES.md, round 14: a gate+up shape 6% of a step ahead in the
sweep decoded 0.2% slower): check a pick in tg128 with the cache edited before believing it.
"""
from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import shaderlm                                          # noqa: E402
from shaderlm.formats.quants import QUANT_TYPES          # noqa: E402
from shaderlm.gpu import autotune                        # noqa: E402
from shaderlm.kernels import ops                         # noqa: E402
from kernel_chain import streamed                        # noqa: E402


def hoist_grid(dev, key: str, tuned: tuple) -> list:
    """Row-group shapes in the tuned one's x24 and butterfly choice: the tuner's lane counts
    (ops.hoist_lanes, for 1 or 2 steps), by 1-8 rows and 2-16 groups, with and without the prefetch.
    The key names the types and K ("gemv Q4_0 128256x4096 norm", "gemv_pair Q4_K+Q6_K ...")."""
    types, k = key.split()[1].split("+"), int(key.split()[2].split("x")[1])
    chunks = max(ops.gemv_chunks(SimpleNamespace(qtype=QUANT_TYPES[t], cols=k)) for t in types)
    glu = key.split()[3:4] == ["glu"]
    x24, bfly = tuned[4:6]
    out = []
    for st in (1, 2):
        g = ops.hoist_lanes(dev, chunks, st)
        for r in (1, 2, 4, 8):
            for groups in (2, 4, 8, 16):
                for pf in (1, 0):
                    if groups * r <= g:
                        out.append((g, r, st, groups, x24, int(bfly and ops.bfly_ok(dev, r, glu)), pf))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--key", required=True, help="sweep the GEMV keys containing this")
    ap.add_argument("--shape", action="append", default=[], help="a full_shape, comma-separated")
    ap.add_argument("--hoist-grid", action="store_true")
    ap.add_argument("--context", type=int, default=128)
    a = ap.parse_args()
    model = shaderlm.load(a.model, ctx=a.context + 16, progress=False)
    net, gen, dev = model.net, model.generator, model.device
    ids = list(np.random.default_rng(0).integers(0, net.cfg.vocab_size, a.context))
    gen._prefill(ids, 0, sample=True)
    gen._read_tokens(len(ids), 1)

    def reset():
        net.set_state(len(ids), 1, 0)

    plan = net.plan_decode
    groups = autotune._groups(plan)
    for key in [k for k in groups if a.key in k]:
        tuned = ops.full_shape(dev.tuned.get(key) or groups[key][0].candidates()[0])
        shapes = [tuned] + [ops.full_shape(tuple(int(v) for v in s.split(","))) for s in a.shape]
        if a.hoist_grid:
            shapes += hoist_grid(dev, key, tuned)
        shapes = list(dict.fromkeys(shapes))
        skipped = []
        plans = autotune._plans(dev, plan, key, shapes, skipped.append)
        ds = [d for d in plan.dispatches if d.tune is not None and d.tune.key == key]
        stream = {"stream": streamed(dev, net, plan.dispatches, set(map(id, ds)), 4, {})}
        times = autotune._timer(dev, {**plans, **stream}, 5, 0.02, reset, 64)
        base = times[tuned]
        print(f"{key}: {len(ds)} dispatch(es), tuned {tuned}, {len(skipped)} shape(s) this weight cannot "
              f"run skipped; whole step us (per call against the tuned)")
        for s, t in sorted(times.items(), key=lambda kv: kv[1]):
            mark = " (tuned)" if s == tuned else ""
            print(f"  {str(s):>28} | {t * 1e6:8.1f} | {(t - base) * 1e6 / len(ds):+8.2f}{mark}")


if __name__ == "__main__":
    main()
