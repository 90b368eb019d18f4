"""Per-adapter tuning of kernel shapes, measured on first use and cached on disk.

A dispatch whose shape can vary without changing its result (beyond f32 rounding: the order of
sums, or a decode GEMV's x24 x) carries a Tunable: a key naming what decides the best shape (kernel,
weight types, matrix shape, fusions), the shapes worth trying, and a way to rebuild it with another
shape. `tune_plan` groups a plan's dispatches by key and, one key at a time, times the whole plan
with all of that key's dispatches (a model's 32 o-projections, say) in each candidate shape, times
the fastest few again with longer samples, keeps the fastest of those and writes the choice to a
JSON file per adapter, driver and kernel source. Later loads build with the cached shapes and tune
nothing.

SHADERLM_TUNE: "auto" (default) tunes on GPUs and not on CPU adapters (lavapipe: slow, and its
shapes matter little), "1" tunes on any adapter, "0" uses neither the cache nor tuning (the built-in
heuristics only, for comparisons). SHADERLM_CACHE_DIR moves the cache (default ~/.cache/shaderlm).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
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

VERSION = 7          # 2: timed from a reset position (version 1 let the position run past the context); 3: x24;
                     # 4: GEMV row groups per workgroup; 5: the butterfly reduction; 6: row-group prefetch;
                     # 7: groups of 8 rows, and a finalists' round
# kernels whose source decides the tuned shapes: editing them invalidates the cache
KERNELS = ("gemv", "gemv_rows", "quant_common", "reduce")
NOISE = 0.01          # a candidate must beat the default shape by this fraction of a step to replace it
# how many of the first round's fastest shapes are timed again, longer, before the pick. One round over
# all of a key's candidates (about 75 for a Llama 8B GEMV) is noisy: on the H200 it put an 8B Q4_0
# gate+up shape 6% of a step ahead of the tuned one, and the two decoded within 0.3% of each other
# (tg128). Its fastest is partly its luckiest
FINALISTS = 4
COMPILE_THREADS = min(8, os.cpu_count() or 1)     # threads building a key's candidate plans


@dataclass
class Tunable:
    key: str
    candidates: Callable[[], list]          # shapes to try, the default one first
    rebuild: Callable[[tuple], list]        # the dispatch(es) again with another shape
    refine: Callable[[tuple], list] | None = None   # shapes to try against the best candidate after


def mode() -> str:
    m = os.environ.get("SHADERLM_TUNE", "auto").lower()
    return m if m in ("auto", "0", "1") else "auto"


def enabled(dev) -> bool:
    """Tune missing shapes on this adapter at load."""
    m = mode()
    return m == "1" or (m == "auto" and dev.adapter.info.get("adapter_type") != "CPU")


def cache_path(dev) -> Path:
    from ..kernels import KERNEL_DIR
    info = dev.adapter.info
    h = hashlib.sha256()
    for part in (info.get("vendor"), info.get("device"), info.get("backend_type"), info.get("description"),
                 str(dev.subgroup_size), str(VERSION)):
        h.update(str(part).encode() + b"\0")
    for k in KERNELS:
        h.update((KERNEL_DIR / f"{k}.wgsl").read_bytes())
    for f in sorted((KERNEL_DIR / "quant").glob("*.wgsl")):
        h.update(f.read_bytes())
    slug = re.sub(r"[^A-Za-z0-9]+", "-", str(info.get("device", "adapter"))).strip("-")[:48]
    root = Path(os.environ.get("SHADERLM_CACHE_DIR") or Path.home() / ".cache" / "shaderlm")
    return root / f"tune-{slug}-{h.hexdigest()[:16]}.json"


def load(dev) -> dict:
    """The adapter's cached shapes by key (Device.tuned starts as this). A file that does not parse
    is ignored with a warning, and rewritten by the next tuning."""
    path = cache_path(dev)
    if mode() == "0" or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        shapes = data["shapes"]
        ok = {k: tuple(v) for k, v in shapes.items()
              if isinstance(k, str) and isinstance(v, list) and len(v) == 7
              and all(isinstance(i, int) and 0 < i <= 4096 for i in v[:4]) and all(i in (0, 1) for i in v[4:])}
        if len(ok) != len(shapes):
            raise ValueError("entries that are not a [workgroup size, rows, steps, groups, x24, butterfly, "
                             "prefetch] list")
        return ok
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"shaderlm: ignoring the kernel tuning cache {path}: {e}", file=sys.stderr)
        return {}


def save(dev):
    path = cache_path(dev)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"version": VERSION, "adapter": dev.name,
                                   "shapes": {k: list(v) for k, v in sorted(dev.tuned.items())}}, indent=1))
        tmp.replace(path)
    except OSError as e:         # a read-only home: tuning still applies to this process
        print(f"shaderlm: could not write the kernel tuning cache {path}: {e}", file=sys.stderr)


def _groups(plan) -> dict:
    """key -> the plan's distinct Tunables of that key, in plan order."""
    groups: dict = {}
    for d in plan.dispatches:
        t = d.tune
        if t is not None and all(t is not u for u in groups.setdefault(t.key, [])):
            groups[t.key].append(t)
    return groups


def _timer(dev, plans: dict, reps: int, min_s: float, reset, max_repeat: int, warm_s: float = 0.2) -> dict:
    """Median GPU seconds per run of each plan: CPU-timed from the submit of an already recorded
    command buffer to a readback, candidates interleaved so clock changes hit all alike. The first
    plan runs for warm_s before: compiling the candidates idled the GPU, and its clocks dropped.
    `reset()` puts the step back at its start position before every timed run: each decode step
    advances the position, and attention's cost with it (unreset, the position ran past the
    context and attention's growing loop swamped the shapes being compared)."""
    sync = dev.buffer(16)
    first, t_end = next(iter(plans.values())), time.perf_counter() + warm_s
    while time.perf_counter() < t_end:
        reset()
        first.run(1)
        dev.read(sync, np.uint32, 0, 16)

    def once(plan, repeat):
        cb = plan.record(1, repeat)
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


def tune_plan(dev, plan, *, reset, max_repeat: int = 64, force: bool = False, reps: int = 5,
              min_s: float = 0.02, log=None) -> list:
    """Tune the shapes of `plan`'s tunable dispatches not yet in dev.tuned (all with `force`), save
    the cache and rebuild those dispatches in the plan. `reset()` sets the step's start position
    (written before each timed run of up to max_repeat steps).

    Each candidate is timed in place: the whole plan runs with that key's dispatches (every layer's)
    rebuilt in the candidate shape and the others as they are. Timing the key's dispatches alone,
    chained, picked shapes that lost in whole decode steps (H200: Llama 8B Q4_K_M 197 -> 186 tok/s).
    Returns rows (key, default shape, plan us, best shape, plan us, dispatches) for what was timed."""
    groups = _groups(plan)
    todo = [k for k in groups if force or k not in dev.tuned]
    if not todo:
        return []
    if log:
        log(f"tuning {len(todo)} kernel shape(s) for {dev.name} (first use; cached in {cache_path(dev)})")
    report = []

    def fastest(plans: dict, sample_s: float) -> tuple:
        """(the fastest shape if it beats the first by NOISE, else the first; every shape's time)."""
        times = _timer(dev, plans, reps, sample_s, reset, max_repeat)
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
        dev.tuned[key] = best
        plan.replace(plans[best].dispatches)
        report.append((key, cands[0], times[cands[0]] * 1e6, best, times[best] * 1e6, len(groups[key])))
    save(dev)
    return report


def _plans(dev, plan, key: str, shapes, log) -> dict:
    """shape -> the plan with `key`'s dispatches rebuilt in it, for the shapes this adapter can build.

    Built on several threads where the WebGPU package allows it: compiling the candidates' kernels
    runs inside its calls, which let go of the GIL (H200, Llama 8B Q4_0: 50 of 111 s of tuning)."""
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
