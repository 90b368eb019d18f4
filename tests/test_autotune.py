"""The per-adapter tuner (gpu/tuner.py, kernels/tuning.py): tunes a model's decode kernel shapes on
first use, caches them on disk, reuses the cache, and leaves results correct (NumPy reference on the
same file)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import shaderlm
from shaderlm.gpu import tuner
from shaderlm.kernels import gemm
from shaderlm.kernels import tuning as shape_cache

from synth_models import check_logits
from tuning_timers import preferring

CASE = dict(preset="tiny", quant="Q4_K_M")


@pytest.fixture
def tuning(monkeypatch, tmp_path):
    """Tuning forced on (also on lavapipe), fused decode (the tunable kernels), a private cache dir,
    and a timer that takes one short sample per candidate."""
    monkeypatch.setenv("SHADERLM_TUNE", "1")
    monkeypatch.setenv("SHADERLM_FUSE", "1")
    monkeypatch.setenv("SHADERLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuner, "_timer", _fast_timer(tuner._timer))
    from shaderlm.gpu.device import get_device
    yield get_device()


def cached_shapes(dev, cache_dir) -> dict:
    """The shapes of the adapter's cache file, each checked to carry its kernel's source stamp (a key whose
    first word tuning.TUNED_KERNELS does not know would never be dropped when its kernel changes)."""
    data = json.loads(shape_cache.cache_path(dev, str(cache_dir)).read_text())
    assert all(data["sources"].get(k) == shape_cache.key_stamp(k) != "" for k in data["shapes"]), data["sources"]
    return data["shapes"]


def _fast_timer(timer):
    """The real timer with one sample per candidate and no minimum duration (lavapipe is slow)."""
    calls = []

    def fast(dev, plans, reps, min_s, reset, max_repeat, n=1):
        calls.append(len(plans))
        return timer(dev, plans, 1, 0.0, reset, max_repeat, n=n)
    fast.calls = calls
    return fast


def test_tunes_once_then_uses_the_cache(tuning, synth_gguf, tmp_path):
    dev = tuning
    path = synth_gguf(seed=1, **CASE)
    m = shaderlm.load(path, progress=False, ctx=64)
    keys = {d.tune.key for d in m.net.plan_decode.dispatches if d.tune is not None}
    assert any(k.startswith("gemv") for k in keys)
    # per distinct key: one timing round of all candidates, the default and the fastest few again, then
    # where the best shape has an f32-x or subgroupAdd twin (refine: the integer-dot types'), the two (a third
    # round of 2: a first round has more)
    calls, rounds = tuner._timer.calls, []
    for n in calls:
        if rounds and (len(rounds[-1]) == 1 or (len(rounds[-1]) == 2 and n == 2)):
            rounds[-1].append(n)
        else:
            rounds.append([n])
    assert len(rounds) == len(keys) and any(len(r) == 3 for r in rounds), calls
    assert all(2 <= r[1] <= min(r[0], 1 + tuner.FINALISTS) for r in rounds), calls
    shapes = cached_shapes(dev, tmp_path)
    assert set(shapes) == keys
    # timing ran decode steps (each advances the position) from a reset start, never past the context
    pos = int(m.device.read(m.net.state, np.uint32, 0, 16)[0])
    assert 32 < pos < 64, pos
    # every dispatch of the plan now has its key's tuned shape, and the model is still right
    for d in m.net.plan_decode.dispatches:
        if d.tune is not None:
            assert list(shape_cache.tuned_shape(dev, d.tune.key)) == shapes[d.tune.key]
    check_logits(path, m, "tuned")

    # as a new process: the cache is read, nothing is timed, the plan is built with the cached shapes
    shape_cache.open_cache(dev, str(tmp_path), reload=True)
    n_timed = len(tuner._timer.calls)
    m2 = shaderlm.load(path, progress=False, ctx=64)
    assert len(tuner._timer.calls) == n_timed
    assert {k: list(v) for k, v in shape_cache.open_cache(dev, str(tmp_path)).shapes.items()} == shapes
    check_logits(path, m2, "from cache")


def test_bad_cache_is_ignored_and_replaced(tuning, synth_gguf, capsys, tmp_path):
    dev = tuning
    cache = shape_cache.cache_path(dev, str(tmp_path))
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text('{"version": 1, "shapes": {"gemv Q8_0 96x96": [64, "many"]}}')
    path = synth_gguf(seed=1, **CASE)
    m = shaderlm.load(path, progress=False, ctx=64)
    assert "ignoring the kernel tuning cache" in capsys.readouterr().err
    shapes = json.loads(cache.read_text())["shapes"]      # rewritten by the tuning that followed
    assert shapes and all(isinstance(v, list) and all(isinstance(i, int) for i in v) for v in shapes.values())
    check_logits(path, m, "after a bad cache")


def test_tune_off_uses_heuristics_only(tuning, synth_gguf, monkeypatch, tmp_path):
    monkeypatch.setenv("SHADERLM_TUNE", "0")
    dev = tuning
    shape_cache.open_cache(dev, str(tmp_path)).shapes["gemv Q4_K 96x96"] = (32, 1)   # a cache open before
    m = shaderlm.load(synth_gguf(seed=1, **CASE), progress=False, ctx=64)
    assert not shape_cache.cache_path(dev, str(tmp_path)).exists() and not tuner._timer.calls
    keys = {d.tune.key for d in m.net.plan_decode.dispatches if d.tune is not None}
    assert keys and all(shape_cache.tuned_shape(dev, k) is None for k in keys)


def test_candidate_plans_skip_what_cannot_build(tuning, synth_gguf):
    """tuner._plans builds a key's candidate plans (on several threads) in the order given, and
    skips, by name, a shape the weight cannot take."""
    m = shaderlm.load(synth_gguf(seed=1, **CASE), progress=False, ctx=64, tune=False)
    plan = m.net.plan_decode
    groups = tuner._groups(plan)
    key = next(k for k in groups if k.startswith("gemv "))
    good = groups[key][0].candidates()[:4]
    bad = (16, 2, 1, 64, 0)            # 64 groups of 2 rows: more rows than the 16 lanes
    logs = []
    plans = tuner._plans(m.device, plan, key, [good[0], bad, *good[1:]], logs.append)
    assert list(plans) == good
    assert len(logs) == 1 and str(bad) in logs[0] and "skipped" in logs[0], logs
    for shape, p in plans.items():
        assert len(p.dispatches) == len(plan.dispatches), shape


def test_prompt_gemm_tiles_tuned_and_used(tuning, synth_gguf, monkeypatch, tmp_path):
    """With the int8 prompt GEMM, tuning also picks each prompt GEMM's tile (timed over a whole pass of
    the model's prompt tokens), caches it, and every plan holding a prompt's GEMMs is rebuilt with it.
    A timer that prefers a tile other than the built-in one makes the pick visible; the prompt's logits
    are the same bits as with the built-in tiles (a token's int8 result does not depend on the tile)."""
    monkeypatch.setenv("SHADERLM_EXACT_PREFILL", "0")
    runs, picked = [], {}

    def prefer_last_tile(dev, plans, reps, min_s, reset, max_repeat, n=1):
        shapes = list(plans)
        runs.append(n)
        for p in plans.values():                     # every candidate builds and runs
            reset()
            p.run(n)
        if len(shapes[0]) != 5:                      # a GEMV's shapes: the built-in one stays
            return {s: 1.0 if i == 0 else 2.0 for i, s in enumerate(shapes)}
        target = picked.setdefault("tile", shapes[-1])
        return {s: 0.5 if s == target else 1.0 for s in shapes}
    monkeypatch.setattr(tuner, "_timer", prefer_last_tile)
    dev = tuning
    path = synth_gguf(seed=2, **CASE)
    m = shaderlm.load(path, progress=False, ctx=64, batch=48)
    net = m.net
    shapes = cached_shapes(dev, tmp_path)
    prompt_keys = {k for k in shapes if k.startswith("matmul_q8 ")}
    # keyed by the pass's 48 tokens rounded up to a power of 2
    assert prompt_keys and all(k.endswith(" t64") for k in prompt_keys), shapes
    tile = picked["tile"]
    assert tile != gemm.full_tile(gemm.Q8_TILES[0]) and all(tuple(shapes[k]) == tile for k in prompt_keys)
    assert 48 in runs                                # prompt candidates timed over the whole pass
    d = gemm.q8_defines(*tile)
    assert {x.tune.key for x in net.plan_prefill[False].dispatches if x.tune is not None} == prompt_keys
    for plan in (*net.plan_prefill.values(), *net.plan_prefill_sample.values(), net.plan_logits):
        q8 = [x for x in plan.dispatches if x.label.startswith("matmul_q8") and x.tune.key in prompt_keys]
        assert q8, plan
        for x in q8:          # (plan_logits' LM head over every row is no layer's: built-in)
            rows = int(x.tune.key.split()[2].split("x")[0])
            assert x.grid(48)[:2] == (-(-rows // d["BM"]), -(-48 // d["BN"])), (plan, x.tune.key)
    ids = np.random.default_rng(3).integers(0, m.config.vocab_size, 40).tolist()
    tuned = m.logits(ids)
    monkeypatch.setenv("SHADERLM_TUNE", "0")          # the built-in tiles
    builtin = shaderlm.load(path, progress=False, ctx=64, batch=48).logits(ids)
    assert np.array_equal(tuned.view(np.uint32), builtin.view(np.uint32))


def test_tensor_core_prompt_tiles_tuned_and_used(tuning, synth_gguf, monkeypatch, tmp_path):
    """On the tensor cores (their matrix operations emulated where the adapter has none), tuning picks each
    prompt GEMM's tile from gemm.TC_PROMPT_TILES over a whole pass, caches it under the pass's tokens, and
    every plan holding a prompt's GEMMs is rebuilt with it. K is not split at these sizes, so a prompt's
    logits are the same bits as in the built-in tile (sums are integers until each output is scaled)."""
    dev = tuning
    monkeypatch.setattr(gemm, "TC_EMULATE", not dev.has_int8_matrix)
    if not dev.has_int8_matrix and not dev.has_subgroups:
        pytest.skip("emulated once, on an adapter with subgroups")
    if not gemm.tensor_cores(dev):
        pytest.skip("the tensor-core GEMM's tiles do not fit this adapter")
    monkeypatch.setenv("SHADERLM_EXACT_PREFILL", "0")
    other = gemm.TC_PROMPT_TILES[-1]
    monkeypatch.setattr(gemm, "TC_PROMPT_TILES", (gemm.TC_TILE, other))     # two candidates: emulated is slow
    monkeypatch.setattr(gemm, "TC_MIN_TOKENS", 64)                          # passes of 64 tokens on them
    monkeypatch.setattr(tuner, "_timer", preferring(other))
    path = synth_gguf(seed=2, **CASE)
    n = 64
    m = shaderlm.load(path, progress=False, ctx=n, batch=n)
    shapes = cached_shapes(dev, tmp_path)
    keys = {k for k in shapes if k.startswith("matmul_tc ")}
    assert keys and all(k.endswith(f" t{n}") and tuple(shapes[k]) == other for k in keys), shapes
    net = m.net
    for plan in (net.plan_prefill[False], net.plan_prefill_sample[False], net.plan_logits):
        tc = [x for x in plan.dispatches if x.label.startswith("matmul_tc") and x.tune.key in keys]
        assert {x.tune.key for x in tc} == keys, plan      # (plan_logits' LM head over every row: built-in)
        for x in tc:
            rows = int(x.tune.key.split()[2].split("x")[0])
            assert x.grid(n) == (-(-rows // other[0]), n // other[1], 1), (plan, x.tune.key)
    ids = np.random.default_rng(3).integers(0, m.config.vocab_size, 60).tolist()
    tuned = m.logits(ids)
    monkeypatch.setenv("SHADERLM_TUNE", "0")          # the built-in tiles
    builtin = shaderlm.load(path, progress=False, ctx=n, batch=n).logits(ids)
    assert np.array_equal(tuned.view(np.uint32), builtin.view(np.uint32))


def test_editing_a_kernel_drops_only_its_shapes(tmp_path, monkeypatch):
    """Each cached shape carries the stamp of its kernel's sources, includes and all (wgsl.sources): on
    load, the shapes of a kernel whose sources changed are dropped, to be tuned again, and the others
    kept."""
    from shaderlm.gpu.device import get_device
    from shaderlm.kernels.wgsl import sources
    q8, gv = set(sources("matmul_q8")), set(sources("gemv"))
    assert {"matmul_q8", "q8_bindings", "epilogue", "quant_common", "quant/q4_k", "quant/runs4"} <= q8
    assert {"gemv", "gemv_rows", "reduce", "quant/q6_k"} <= gv
    assert "matmul_few" not in q8 | gv and "matmul_q8" not in gv
    dev = get_device()
    gemv_shape, tile = (64, 4, 1, 1, 1, 0, 0), gemm.full_tile(gemm.Q8_TILES[0])
    kept = {"gemv Q4_K 96x96": gemv_shape, "gemv_pair Q4_K+Q6_K 96+32x96": gemv_shape}
    cache = shape_cache.open_cache(dev, str(tmp_path), reload=True)
    cache.shapes.update({**kept, "matmul_q8 Q4_K 96x96 t64": tile})
    cache.save()
    assert shape_cache.open_cache(dev, str(tmp_path), reload=True).shapes == {**kept, "matmul_q8 Q4_K 96x96 t64": tile}
    stamp = shape_cache.source_stamp
    monkeypatch.setattr(shape_cache, "source_stamp", lambda k: stamp(k) + "+edit" * (k == "matmul_q8"))
    try:
        assert shape_cache.open_cache(dev, str(tmp_path), reload=True).shapes == kept
    finally:
        shape_cache.close_cache(dev)
