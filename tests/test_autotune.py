"""The per-adapter autotuner (gpu/autotune.py): tunes a model's decode kernel shapes on first use,
caches them on disk, reuses the cache, and leaves results correct (NumPy reference on the same file)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import shaderlm
from shaderlm.gpu import autotune

from synth_models import check_logits

CASE = dict(preset="tiny", quant="Q4_K_M")


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """Tuning forced on (also on lavapipe), fused decode (the tunable kernels), a private cache, and
    a fresh tuning table on the shared device."""
    monkeypatch.setenv("SHADERLM_TUNE", "1")
    monkeypatch.setenv("SHADERLM_FUSE", "1")
    monkeypatch.setenv("SHADERLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(autotune, "_timer", _fast_timer(autotune._timer))
    from shaderlm.gpu.device import get_device
    dev = get_device()
    saved, saved_fused = dict(dev.tuned), dev.prefer_fused
    dev.tuned.clear()
    dev.prefer_fused = True
    yield dev
    dev.tuned.clear()
    dev.tuned.update(saved)
    dev.prefer_fused = saved_fused


def _fast_timer(timer):
    """The real timer with one sample per candidate and no minimum duration (lavapipe is slow)."""
    calls = []

    def fast(dev, plans, reps, min_s, reset, max_repeat):
        calls.append(len(plans))
        return timer(dev, plans, 1, 0.0, reset, max_repeat)
    fast.calls = calls
    return fast


def test_tunes_once_then_uses_the_cache(tuning, synth_gguf):
    dev = tuning
    path = synth_gguf(seed=1, **CASE)
    m = shaderlm.load(path, progress=False, ctx=64)
    keys = {d.tune.key for d in m.net.plan_decode.dispatches if d.tune is not None}
    assert any(k.startswith("gemv") for k in keys)
    # per distinct key: one timing round of all candidates, the default and the fastest few again, then
    # the best shape against its f32-x twin (all are x24 types)
    calls = autotune._timer.calls
    assert len(calls) == 3 * len(keys) and calls[2::3] == [2] * len(keys), calls
    assert all(2 <= n <= 1 + autotune.FINALISTS and n < first for first, n in zip(calls[::3], calls[1::3])), calls
    cache = autotune.cache_path(dev)
    shapes = json.loads(cache.read_text())["shapes"]
    assert set(shapes) == keys
    # timing ran decode steps (each advances the position) from a reset start, never past the context
    pos = int(m.device.read(m.net.state, np.uint32, 0, 16)[0])
    assert 32 < pos < 64, pos
    # every dispatch of the plan now has its key's tuned shape, and the model is still right
    check_logits(path, m, "tuned")

    # a new process: the cache is read, nothing is timed, the plan is built with the cached shapes
    dev.tuned.clear()
    dev.tuned.update(autotune.load(dev))
    n_timed = len(autotune._timer.calls)
    m2 = shaderlm.load(path, progress=False, ctx=64)
    assert len(autotune._timer.calls) == n_timed
    assert {k: list(v) for k, v in dev.tuned.items()} == shapes
    check_logits(path, m2, "from cache")


def test_bad_cache_is_ignored_and_replaced(tuning, synth_gguf, capsys):
    dev = tuning
    cache = autotune.cache_path(dev)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text('{"version": 1, "shapes": {"gemv Q8_0 96x96": [64, "many"]}}')
    dev.tuned.update(autotune.load(dev))              # as a new process opening the device would
    path = synth_gguf(seed=1, **CASE)
    m = shaderlm.load(path, progress=False, ctx=64)
    assert "ignoring the kernel tuning cache" in capsys.readouterr().err
    shapes = json.loads(cache.read_text())["shapes"]      # rewritten by the tuning that followed
    assert shapes and all(isinstance(v, list) and all(isinstance(i, int) for i in v) for v in shapes.values())
    check_logits(path, m, "after a bad cache")


def test_tune_off_uses_heuristics_only(tuning, synth_gguf, monkeypatch):
    monkeypatch.setenv("SHADERLM_TUNE", "0")
    dev = tuning
    cache = autotune.cache_path(dev)
    shaderlm.load(synth_gguf(seed=1, **CASE), progress=False, ctx=64)
    assert not cache.exists() and not dev.tuned and not autotune._timer.calls


def test_candidate_plans_skip_what_cannot_build(tuning, synth_gguf):
    """autotune._plans builds a key's candidate plans (on several threads) in the order given, and
    skips, by name, a shape the weight cannot take."""
    m = shaderlm.load(synth_gguf(seed=1, **CASE), progress=False, ctx=64, tune=False)
    plan = m.net.plan_decode
    groups = autotune._groups(plan)
    key = next(k for k in groups if k.startswith("gemv "))
    good = groups[key][0].candidates()[:4]
    bad = (16, 2, 1, 64, 0)            # 64 groups of 2 rows: more rows than the 16 lanes
    logs = []
    plans = autotune._plans(m.device, plan, key, [good[0], bad, *good[1:]], logs.append)
    assert list(plans) == good
    assert len(logs) == 1 and str(bad) in logs[0] and "skipped" in logs[0], logs
    for shape, p in plans.items():
        assert len(p.dispatches) == len(plan.dispatches), shape
