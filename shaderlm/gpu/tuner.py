"""Per-adapter tuning of dispatch shapes: measured on first use, kept in a JSON file.

A dispatch whose shape can vary without changing its result (beyond rounding) carries a Tunable: a
key naming what decides the best shape, the shapes worth trying, and a way to rebuild the dispatch
in another shape. `tune_plan` groups a plan's dispatches by key and, one key at a time, times the
whole plan with all of that key's dispatches (a model's 32 o-projections, say) in each candidate
shape, times the fastest few again with longer samples and keeps the fastest of those. What a shape
is, and which shapes exist, is the kernels' business: here a shape is a tuple of ints.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .backend import parallel_compile_ok
from .plan import Plan

NOISE = 0.01          # a candidate must beat the default shape by this fraction of a step to replace it
# How many of the first round's fastest shapes are timed again, longer, before the pick: one round
# over all of a key's candidates is noisy, and its fastest is partly its luckiest.
FINALISTS = 4
COMPILE_THREADS = min(8, os.cpu_count() or 1)     # threads building a key's candidate plans


@dataclass
class Tunable:
    key: str
    candidates: Callable[[], list]          # shapes to try, the default one first
    rebuild: Callable[[tuple], list]        # the dispatch(es) again with another shape
    refine: Callable[[tuple], list] | None = None   # shapes to try against the best candidate after


class ShapeCache:
    """Tuned shapes by key for one adapter, read from and written to `path` (None: memory only).
    `valid(shape)` says whether a cached entry is a shape the kernels can build; `stamp(key)`, what the
    entry of `key` was tuned against (its kernel's sources): an entry stamped otherwise is dropped."""

    def __init__(self, path: Path | None, valid: Callable[[tuple], bool] = lambda s: True, tag: str = "",
                 stamp: Callable[[str], str] = lambda key: ""):
        self.path, self.tag, self.stamp = path, tag, stamp
        self.shapes: dict[str, tuple] = {}
        if path is not None and path.exists():
            self.shapes = self._read(path, valid, stamp)

    @staticmethod
    def _read(path: Path, valid, stamp) -> dict:
        """A file that does not parse is ignored with a warning, and rewritten by the next tuning."""
        try:
            data = json.loads(path.read_text())
            shapes, stamps = data["shapes"], data.get("sources", {})
            if not all(isinstance(v, list) and all(isinstance(i, int) for i in v) for v in shapes.values()):
                raise ValueError("entries that are not lists of integers")
            current = {k: tuple(v) for k, v in shapes.items() if stamps.get(k, "") == stamp(k)}
            ok = {k: v for k, v in current.items() if valid(v)}
            if len(ok) != len(current):
                raise ValueError("entries that are not shapes these kernels can build")
            return ok
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"shaderlm: ignoring the kernel tuning cache {path}: {e}", file=sys.stderr)
            return {}

    def get(self, key: str):
        return self.shapes.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.shapes

    def save(self):
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            keys = sorted(self.shapes)
            tmp.write_text(json.dumps({"adapter": self.tag, "shapes": {k: list(self.shapes[k]) for k in keys},
                                       "sources": {k: self.stamp(k) for k in keys}}, indent=1))
            tmp.replace(self.path)
        except OSError as e:         # a read-only home: tuning still applies to this process
            print(f"shaderlm: could not write the kernel tuning cache {self.path}: {e}", file=sys.stderr)


def _groups(plan) -> dict:
    """key -> the plan's distinct Tunables of that key, in plan order."""
    groups: dict = {}
    for d in plan.dispatches:
        t = d.tune
        if t is not None and all(t is not u for u in groups.setdefault(t.key, [])):
            groups[t.key].append(t)
    return groups


def _timer(dev, plans: dict, reps: int, min_s: float, reset, max_repeat: int, warm_s: float = 0.2, n: int = 1) -> dict:
    """Median GPU seconds per run of each plan over `n` tokens: CPU-timed from the submit of an already
    recorded command buffer to a readback, candidates interleaved so clock changes hit all alike. The
    first plan runs for warm_s before: compiling the candidates idled the GPU, and its clocks dropped.
    `reset()` puts the step back at its start position before every timed run: each decode step
    advances the position, and attention's cost with it."""
    sync = dev.buffer(16)
    first, t_end = next(iter(plans.values())), time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        reset()
        first.run(n)
        dev.read(sync, np.uint32, 0, 16)

    def once(plan, repeat):
        cb = plan.record(n, repeat)
        reset()
        t0 = time.perf_counter()
        dev.submit([cb])
        dev.read(sync, np.uint32, 0, 16)
        return (time.perf_counter() - t0) / repeat

    repeat = {c: max(1, min(max_repeat, math.ceil(min_s / max(once(p, 1), 1e-6)))) for c, p in plans.items()}
    samples = {c: [] for c in plans}
    for _ in range(reps):
        for c, p in plans.items():
            samples[c].append(once(p, repeat[c]))
    return {c: statistics.median(v) for c, v in samples.items()}


def tune_plan(dev, plan, cache: ShapeCache, *, reset, max_repeat: int = 64, force: bool = False, reps: int = 5,
              min_s: float = 0.02, log=None, n: int = 1, only: Callable[[str], bool] | None = None) -> list:
    """Tune the shapes of `plan`'s tunable dispatches not yet in `cache` (all with `force`; with `only`,
    those whose key it accepts), save the cache and rebuild those dispatches in the plan. `reset()` sets
    the step's start position (written before each timed run of up to max_repeat steps); `n`: the tokens
    a run (a prompt pass's).

    Each candidate is timed in place: the whole plan runs with that key's dispatches (every layer's)
    rebuilt in the candidate shape and the others as they are; timing a key's dispatches alone,
    chained, picked shapes that lost in whole decode steps. Returns rows (key, default shape, plan
    us, best shape, plan us, dispatches) for what was timed."""
    groups = _groups(plan)
    todo = [k for k in groups if (only is None or only(k)) and (force or k not in cache)]
    if not todo:
        return []
    if log:
        log(f"tuning {len(todo)} kernel shape(s) for {dev.name} (first use; cached in {cache.path})")
    report = []

    def fastest(plans: dict, sample_s: float) -> tuple:
        """(the fastest shape if it beats the first by NOISE, else the first; every shape's time)."""
        times = _timer(dev, plans, reps, sample_s, reset, max_repeat, n=n)
        first = next(iter(plans))
        best = min(times, key=times.get)
        return (best if times[best] <= times[first] * (1 - NOISE) else first), times

    for key in todo:
        tunable = groups[key][0]
        cands = tunable.candidates()
        plans = _plans(dev, plan, key, cands, log)
        if cands[0] not in plans:
            continue
        _, times = fastest(plans, min_s)
        # the default and the first round's FINALISTS fastest again, with samples 3x as long
        finalists = dict.fromkeys([cands[0]] + sorted(times, key=times.get)[:FINALISTS])
        best, times = fastest({c: plans[c] for c in finalists}, 3 * min_s)
        extra = _plans(dev, plan, key, [c for c in (tunable.refine(best) if tunable.refine else [])
                                        if c not in plans], log)
        if extra:          # a third round: the best against its variants, on the finalists' scale
            alt, more = fastest({best: plans[best], **extra}, 3 * min_s)
            plans.update(extra)
            times[alt], best = more[alt] * times[best] / more[best], alt
        cache.shapes[key] = best
        plan.replace(plans[best].dispatches)
        report.append((key, cands[0], times[cands[0]] * 1e6, best, times[best] * 1e6, len(groups[key])))
    cache.save()
    return report


def _plans(dev, plan, key: str, shapes, log) -> dict:
    """shape -> the plan with `key`'s dispatches rebuilt in it, for the shapes this adapter can build.
    Built on several threads where the WebGPU package allows it: compiling the candidates' kernels
    runs inside its calls, which let go of the GIL."""
    def build(c):
        try:
            return Plan(dev, _substituted(plan, key, c))
        except Exception as e:  # noqa: BLE001 - a shape this adapter cannot build is skipped, not fatal
            return e
    with ThreadPoolExecutor(max_workers=COMPILE_THREADS if parallel_compile_ok() else 1) as pool:
        built = list(pool.map(build, shapes))
    out = {}
    for c, p in zip(shapes, built):
        if not isinstance(p, Exception):
            out[c] = p
        elif log:
            log(f"  {key}: shape {c} skipped: {p}")
    return out


def _substituted(plan, key: str, shape: tuple) -> list:
    """The plan's dispatches with those of `key` (each Tunable's run of them) rebuilt in `shape`."""
    out, done = [], []
    for d in plan.dispatches:
        t = d.tune
        if t is None or t.key != key:
            out.append(d)
        elif all(t is not u for u in done):
            done.append(t)
            out.extend(t.rebuild(shape))
    return out
