"""The serving engine on the GPU (lavapipe in CI): batched decode against single-stream decode, the
scheduler (continuous batching, prefix cache, cancellation, pages freed), and the real engine
behind the HTTP server with the official `openai` client."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import shaderlm
from shaderlm.kernels import gemm
from shaderlm.options import Options
from shaderlm.engine.requests import Request
from shaderlm.models.serving import Serving

from fake_engine import running_server
from tuning_timers import preferring

try:
    from synth_models import random_ids
except ImportError:  # tests/ imported as a package
    from tests.synth_models import random_ids

N = 14


def _generate_batched(sv: Serving, prompts: dict, n: int, k: int = 4) -> dict:
    """slot -> the n greedy tokens of its prompt, all slots decoded together."""
    for s, p in prompts.items():
        sv.set_own_pages(s)
        sv.prefill(s, p, 0, True)
    got = {s: sv.read_tokens(s, len(p), 1) for s, p in prompts.items()}
    pos = {s: len(p) for s, p in prompts.items()}
    while len(next(iter(got.values()))) < n:
        steps = min(k, n - len(next(iter(got.values()))))
        b = sv.record(list(prompts), [pos[s] for s in prompts], steps)
        sv.submit(b)
        for row, s in zip(sv.tokens_of(b), prompts):
            got[s] += row.tolist()
            pos[s] += steps
    return got


@pytest.mark.parametrize("arch,preset,quant", [("llama", "tiny-k", "Q4_K_M"), ("gemma3", "tiny", "Q8_0"),
                                               ("qwen3", "tiny", "Q4_1"), ("qwen3moe", "tiny", "Q8_0"),
                                               ("gpt-oss", "tiny", "Q8_0")])
@pytest.mark.parametrize("fuse,nt,exact", [(False, 1, True), (True, 1, True), (True, 2, True), (True, 1, False),
                                            (True, None, False)],
                         ids=["unfused", "fused", "fused-nt2", "fused-int8-prefill", "fused-int8"])
def test_batched_decode_is_single_stream_decode(synth_gguf, arch, preset, quant, fuse, nt, exact):
    """Sequences decoded in batches of other sizes and neighbours give the same greedy tokens as
    decoded alone (Model.generate_tokens), and bit-identical logits in every batch they are in; also
    with GEMV workgroups that share each weight load between nt tokens, with prompts through the int8
    GEMM, and with int8 activations in prefill and decode at their own default of 2 tokens a workgroup
    (the GPU default)."""
    path = synth_gguf(seed=2, preset=preset, arch=arch, quant=quant)
    int8 = nt is None
    m = shaderlm.load(path, progress=False, ctx=256, fuse=fuse, options=Options.from_env().replace(
        batch_tokens=nt, exact_prefill=exact, int8_act=int8))
    assert m.net.int8_prefill == (not exact) and m.net.int8_act == int8 and m.net.batch_tokens == (nt or 2)
    prompts = [random_ids(m.config.vocab_size, n, seed) for seed, n in enumerate((5, 19, 40, 11, 33))]
    want = [m.generate_tokens(p, N, stop_at_eos=False) for p in prompts]
    sv = Serving(m.net, slots=5, seq_ctx=128, tokens_per_submit=4)
    logits = {}
    for mix in ([0], [2, 0, 4], [1, 3, 0, 2, 4], [3, 1]):
        got = _generate_batched(sv, {s: prompts[i] for s, i in enumerate(mix)}, N)
        assert [got[s] for s in range(len(mix))] == [want[i] for i in mix], mix
        for s, i in enumerate(mix):
            logits.setdefault(i, []).append(sv.last_logits(len(mix))[s])
    for i, rows in logits.items():
        for r in rows[1:]:
            assert np.array_equal(r, rows[0]), f"prompt {i}: logits differ between batches"


@pytest.mark.parametrize("arch,preset,quant,exact", [("llama", "tiny-k", "Q4_K_M", True),
                                                     ("llama", "tiny-k", "Q4_K_M", False),
                                                     ("gemma3", "tiny", "Q8_0", False),
                                                     ("qwen3moe", "tiny", "Q8_0", False)])
def test_prompts_in_one_pass_are_each_alone(synth_gguf, arch, preset, quant, exact):
    """Several sequences' prompts in one prompt pass (each token at its own slot and position), one of
    them split over two passes (its second part after positions already in its pages), give each
    prompt's first-token logits bit for bit as a pass of it alone, and the same greedy tokens as the
    single-stream model (Model.generate_tokens)."""
    from shaderlm.models.serving import PromptPart
    path = synth_gguf(seed=3, preset=preset, arch=arch, quant=quant)
    m = shaderlm.load(path, progress=False, ctx=256, options=Options.from_env().replace(exact_prefill=exact))
    V = m.config.vocab_size
    prompts = [random_ids(V, n, 40 + n) for n in (13, 90, 5, 70)]      # over a 64-query attention tile too
    want = [m.generate_tokens(p, N, stop_at_eos=False) for p in prompts]
    sv = Serving(m.net, slots=4, seq_ctx=128, tokens_per_submit=4)
    alone = []
    for s, p in enumerate(prompts):
        sv.set_own_pages(s)
        sv.prefill(s, p, 0, True)
        alone.append(sv.last_logits(1)[0])
        assert sv.read_tokens(s, len(p), 1) == want[s][:1]
    a, b, c, d = prompts
    split = 17
    sv.prefill_pass([PromptPart(0, a, 0, True), PromptPart(1, b[:split], 0), PromptPart(2, c, 0, True)])
    first = sv.last_logits(2)
    sv.prefill_pass([PromptPart(3, d, 0, True), PromptPart(1, b[split:], split, True)])
    second = sv.last_logits(2)
    for got, s in ((first[0], 0), (first[1], 2), (second[0], 3), (second[1], 1)):
        assert np.array_equal(got, alone[s]), f"prompt {s}: its first logits differ from its pass alone"
    assert [sv.first_token(s)[0] for s in range(4)] == [w[0] for w in want]     # each slot's readback
    got = {s: sv.read_tokens(s, len(p), 1) for s, p in enumerate(prompts)}
    pos = {s: len(p) for s, p in enumerate(prompts)}
    while len(got[0]) < N:
        steps = min(4, N - len(got[0]))
        batch = sv.record(list(got), [pos[s] for s in got], steps)
        sv.submit(batch)
        for row, s in zip(sv.tokens_of(batch), list(got)):
            got[s] += row.tolist()
            pos[s] += steps
    assert [got[s] for s in range(4)] == want


def test_prompt_pass_refuses_what_it_cannot_hold(synth_gguf):
    """A pass over more tokens than the prefill batch, more stretches than slots, an empty stretch, two of one
    slot, or one outside the slots or their positions is refused with the reason, before anything is written."""
    from shaderlm.models.serving import PromptPart
    m = shaderlm.load(synth_gguf(seed=3, preset="tiny-k", arch="llama", quant="Q4_K_M"), progress=False, ctx=256)
    sv = Serving(m.net, slots=2, seq_ctx=128)
    ids = random_ids(m.config.vocab_size, m.net.batch + 1, 1)
    for parts in ([PromptPart(0, ids, 0, True)], [PromptPart(0, [1], 0), PromptPart(1, [1], 0), PromptPart(0, [1], 1)],
                  [PromptPart(0, [], 0, True)], [PromptPart(1, [1], 0), PromptPart(1, [2], 1, True)],
                  [PromptPart(2, [1], 0, True)], [PromptPart(1, [1, 2], 127)]):
        with pytest.raises(ValueError, match="prompt pass"):
            sv.prefill_pass(parts)


@pytest.mark.parametrize("fuse", [False, True], ids=["unfused", "fused"])
@pytest.mark.parametrize("int8", [False, True], ids=["x24", "int8"])
def test_serving_step_logits_are_the_single_streams(synth_gguf, fuse, int8):
    """A sequence decoded by the serving engine (paged cache, batch plan) gets the single-stream decode
    step's logits bit for bit, after an f32 or int8 prompt, unfused (CPU adapters: the LM head a GEMV a
    row in both) and fused, with 24-bit and int8 activations (int8 rounding would amplify any other
    rounding into a near-tie flip)."""
    path = synth_gguf(seed=2, preset="tiny-k", arch="llama", quant="Q4_K_M")
    m = shaderlm.load(path, progress=False, ctx=256, fuse=fuse, options=Options.from_env().replace(
        int8_act=int8, exact_prefill=not int8, tune="0"))
    net, V = m.net, m.config.vocab_size
    p = random_ids(V, 19, 1)
    sv = Serving(net, slots=2, seq_ctx=128, tokens_per_submit=1)
    sv.set_own_pages(1)
    sv.prefill(1, p, 0, True)
    net.set_sampling(0.0)
    net.prefill(p, 0, sample=True)
    assert net.read_tokens(len(p), 1) == sv.read_tokens(1, len(p), 1)
    for i in range(6):
        b = net.record_decode(len(p) + i, 1)
        net.submit_decode(b)
        want_tok = net.decoded_tokens(b)
        want = net.dev.read(net.logit_buf, np.float32, 0, 4 * V)
        bb = sv.record([1], [len(p) + i], 1)
        sv.submit(bb)
        assert sv.tokens_of(bb)[0].tolist() == want_tok
        assert np.array_equal(sv.last_logits(1)[0], want), f"step {i}"


def test_tuned_batch_shapes_keep_single_stream_tokens(synth_gguf, tmp_path):
    """Serving.tune times the batched GEMVs' shapes (their own keys, "... nt2") on a step of 4 rows, keeps
    them in the adapter's cache and rebuilds the steps with them; single-token keys are left alone, and
    sequences decoded in batches still give the tokens they give alone."""
    from shaderlm.kernels.gemv import batch_key
    from shaderlm.kernels.tuning import close_cache, open_cache
    path = synth_gguf(seed=2, preset="tiny-k", arch="llama", quant="Q4_K_M")
    m = shaderlm.load(path, progress=False, ctx=256, options=Options.from_env().replace(
        int8_act=True, exact_prefill=False, tune="0"))                 # the GPUs' defaults
    prompts = [random_ids(m.config.vocab_size, n, seed) for seed, n in enumerate((5, 19, 40))]
    want = [m.generate_tokens(p, N, stop_at_eos=False) for p in prompts]
    sv = Serving(m.net, slots=4, seq_ctx=128, tokens_per_submit=4)
    try:
        report = sv.tune(cache_dir=str(tmp_path), reps=1)
        keys = {d.tune.key for d in sv.decode_plan(4).dispatches if d.tune}
        assert report and {r[0] for r in report} == {k for k in keys if batch_key(k)} != set()
        cache = open_cache(m.net.dev, str(tmp_path), reload=True)
        assert all(batch_key(k) for k in cache.shapes) and cache.path.exists()
        # every step rebuilt in the tuned shapes, and the prompt passes' LM head (a batch GEMV)
        for d in sv.decode_plan(3).dispatches + sv.prompt_plan(2).dispatches:
            if d.tune and batch_key(d.tune.key) and cache.get(d.tune.key):
                assert d.tune.rebuild(cache.get(d.tune.key))[0].pipeline is d.pipeline
        got = _generate_batched(sv, dict(enumerate(prompts)), N)
        assert [got[s] for s in range(3)] == want
        # a cached batch shape whose lanes are not the single token's (tuned against another one) is ignored
        key = report[0][0]
        bad = list(cache.get(key))
        bad[0] *= 2                                     # another workgroup: other lanes
        cache.shapes[key] = tuple(bad)
        sv._build_decode()
        d = next(d for d in sv.decode_plan(4).dispatches if d.tune and d.tune.key == key)
        assert d.pipeline is d.tune.rebuild(d.tune.candidates()[0])[0].pipeline
    finally:
        close_cache(m.net.dev)


@pytest.mark.parametrize("path", ["tensor-cores", "int8", "few"])
def test_batch_gemm_tiles_tuned_per_matrix(synth_gguf, tmp_path, monkeypatch, path):
    """Serving.tune times each matrix's GEMM tile for decode batches (keys "... batch": the tensor cores'
    gemm.TC_BATCH_TILES, the split int8 GEMM's tiles, matmul_few's shapes) on the largest step up to 64
    rows (16 for matmul_few) that takes them, caches the pick and rebuilds the steps with it. Tensor cores
    and matmul_few: every step from TC_BATCH_ROWS (up to FEW_TOKENS) takes the matrix's tile (one key
    whatever the rows), so a token's logits are the same bits in steps of 8 and 12 rows, and within float
    rounding of the built-in tile's (the K slices, or the lanes summing K, differ). Int8: the tile leaves
    a token's bits as they were. A timer preferring another tile makes the pick visible (matrix
    operations emulated where the adapter has none; two candidates, as that is slow). Tuning forced, each
    key is timed on its own step only: matmul_few's on the 8-row step where FEW_TUNING_ROWS is 8, though
    the 12-row step runs matmul_few too; the tiles on the 12-row step."""
    from shaderlm.gpu import tuner
    from shaderlm.gpu.device import get_device
    from shaderlm.kernels.tuning import close_cache, key_stamp, open_cache
    dev = get_device()
    if path == "tensor-cores":
        monkeypatch.setattr(gemm, "TC_EMULATE", not dev.has_int8_matrix)
        if not dev.has_int8_matrix and not dev.has_subgroups:
            pytest.skip("emulated once, on an adapter with subgroups")
        if not gemm.tensor_cores(dev):
            pytest.skip("the tensor-core GEMM's tiles do not fit this adapter")
        monkeypatch.setattr(gemm, "TC_BATCH_ROWS", 8)        # steps of 8 and 12 rows on the tensor cores
        monkeypatch.setattr(gemm, "TC_MIN_SLICE", 64)        # K split, in slices that differ by tile
        other = (128, 64, 256)
        monkeypatch.setattr(gemm, "TC_BATCH_TILES", (gemm.TC_BATCH_TILE, other))
    elif path == "int8":
        monkeypatch.setattr(gemm, "tensor_cores", lambda dev: False)
        monkeypatch.setattr(gemm, "FEW_TOKENS", 4)           # steps of 8 and 12 rows on the split int8 GEMM
        other = gemm.full_tile(gemm.Q8_FEW_TILES[-1])
    else:
        monkeypatch.setattr(gemm, "tensor_cores", lambda dev: False)     # steps of 8 and 12 rows on matmul_few
        other = (2, 32, 64, 8)
        monkeypatch.setattr(gemm, "FEW_SHAPES", (other,))
        monkeypatch.setattr(gemm, "FEW_TUNING_ROWS", 8)
    timer, timed_rows = preferring(other), []

    def recording(dev, plans, reps, min_s, reset, max_repeat, n=1):
        timed_rows.append(n)
        return timer(dev, plans, reps, min_s, reset, max_repeat, n=n)
    monkeypatch.setattr(tuner, "_timer", recording)
    model = synth_gguf(seed=3, preset="tiny-k", arch="llama", quant="Q4_K_M")
    m = shaderlm.load(model, progress=False, ctx=256, options=Options.from_env().replace(
        int8_act=True, exact_prefill=False, tune="0"))
    prompts = {s: random_ids(m.config.vocab_size, 3 + 2 * s, s) for s in range(12)}
    sv = Serving(m.net, slots=12, seq_ctx=64, tokens_per_submit=2)
    try:
        def logits(rows: int) -> np.ndarray:
            _generate_batched(sv, {s: prompts[s] for s in range(rows)}, 2, k=1)
            return sv.last_logits(rows)
        before = logits(12)
        report = sv.tune(cache_dir=str(tmp_path), reps=1, force=True, rows=0)     # (rows=0: no GEMV shapes)
        assert set(timed_rows) == {8 if path == "few" else 12}, timed_rows
        keys = {d.tune.key for d in sv.decode_plan(12).dispatches if d.tune and gemm.batch_tile_key(d.tune.key)}
        assert keys and keys <= {r[0] for r in report}, report
        assert all(key_stamp(k) for k in keys)          # editing the kernel drops these shapes
        cache = open_cache(dev, str(tmp_path), reload=True)
        for rows in (12,) if path == "int8" else (8, 12):            # every such step rebuilt in its matrix's pick
            ds = [d for d in sv.decode_plan(rows).dispatches if d.tune and gemm.batch_tile_key(d.tune.key)]
            assert {d.tune.key for d in ds} == keys
            for d in ds:
                assert cache.get(d.tune.key) == other
                assert any(r.pipeline is d.pipeline for r in d.tune.rebuild(other))
        after = logits(12)
        assert np.array_equal(after[:8].view(np.uint32), logits(8).view(np.uint32))
        if path != "int8":
            assert np.abs(after - before).max() <= 1e-4 * np.abs(before).max()
            # other lanes on K: other sums (that the pick took effect)
            assert path != "few" or not np.array_equal(after.view(np.uint32), before.view(np.uint32))
        else:
            assert np.array_equal(after.view(np.uint32), before.view(np.uint32))
    finally:
        close_cache(dev)


@pytest.mark.parametrize("splits", [False, True], ids=["one-split", "splits"])
def test_attention_rounds_the_o_input(synth_gguf, monkeypatch, splits):
    """A decode batch on the int8 GEMMs: the decode attention also rounds its output into the o
    projection's x blocks (a quantize_q8 dispatch fewer a layer) with that pass's arithmetic, so the
    tokens and logits are bit-identical to steps with the pass, after prompts of 97-171 tokens (with
    `splits`, the last of a head's splits rounds the merged output)."""
    from shaderlm.kernels import ops
    from shaderlm.models.transformer import Transformer
    path = synth_gguf(seed=4, preset="tiny-k", arch="llama", quant="Q4_K_M")
    opts = Options.from_env().replace(exact_prefill=False, gemm_rows=2)
    m = shaderlm.load(path, progress=False, ctx=256, fuse=True, options=opts)
    a = m.net.args
    if not ops.rounds_attention_output(m.net.dev, True, a.n_heads, a.head_dim):
        pytest.skip("the subgroup decode attention does not run here")
    if splits:
        wg, unroll = ops.attention_shape(m.net.dev, a.n_heads)[:2]
        m = shaderlm.load(path, progress=False, ctx=256, fuse=True,
                          options=opts.replace(attention_shape=(wg, unroll, 4, 32)))
    prompts = {s: random_ids(m.config.vocab_size, n, 40 + n) for s, n in enumerate((150, 97, 171))}
    runs = {}
    for fold in (True, False):
        if not fold:
            monkeypatch.setattr(Transformer, "o_input_blocks", lambda self, i, step: None)
        sv = Serving(m.net, slots=3, seq_ctx=224, tokens_per_submit=4)
        labels = [d.label for d in sv.decode_plan(3).dispatches]
        toks = _generate_batched(sv, prompts, 6)
        runs[fold] = labels, toks, sv.last_logits(3)
    (with_fold, toks, logits), (plain, want, want_logits) = runs[True], runs[False]
    assert any(x.startswith("matmul_few") for x in with_fold)
    assert plain.count("quantize_q8") - with_fold.count("quantize_q8") == a.n_layers
    assert toks == want and np.array_equal(logits.view(np.uint32), want_logits.view(np.uint32))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_v_gemm_apart_from_qkv(synth_gguf, monkeypatch, arch):
    """A decode batch on the int8 GEMMs with V a GEMM of its own (Q4_K_M: Q+K Q4_K, V Q6_K): V writes a
    buffer of its own, which the decode attention reads, so no buffer both GEMMs write puts a barrier
    between them; the tokens and logits are bit-identical to steps with V in the qkv rows (Qwen3 with
    its per-head norms in the attention, Gemma 3 with its sliding windows)."""
    from shaderlm.kernels import ops
    from shaderlm.models.transformer import Transformer
    path = synth_gguf(seed=4, preset="tiny-k", arch=arch, quant="Q4_K_M")
    m = shaderlm.load(path, progress=False, ctx=256, fuse=True,
                      options=Options.from_env().replace(exact_prefill=False, gemm_rows=2))
    net, dev = m.net, m.net.dev
    if not ops.takes_v_apart(dev, True):
        pytest.skip("the subgroup decode attention does not run here")
    assert all(len(L.qkv) == 2 and L.qkv[1].rows == m.config.n_kv_heads * net.args.head_dim for L in net.layers)
    prompts = {s: random_ids(m.config.vocab_size, n, 40 + n) for s, n in enumerate((150, 97, 171))}
    runs = {}
    with dev.recording_bindings() as bound:
        for apart in (True, False):
            if not apart:
                monkeypatch.setattr(Transformer, "v_apart", lambda self, i, step: False)
            sv = Serving(net, slots=3, seq_ctx=224, tokens_per_submit=4)
            ds = sv.decode_plan(3).dispatches
            writers = [d for d in ds if any(r is net.v_new for r in bound[id(d.bind_group)].values())]
            toks = _generate_batched(sv, prompts, 6)
            runs[apart] = writers, toks, sv.last_logits(3)
    (writers, toks, logits), (none, want, want_logits) = runs[True], runs[False]
    gemms = [d for d in writers if d.label.startswith("matmul_few")]
    assert len(gemms) == net.args.n_layers and not none
    assert not any(r is net.qkv for d in gemms for r in bound[id(d.bind_group)].values())
    assert sum(d.label == "attention_decode" for d in writers) == net.args.n_layers
    assert toks == want and np.array_equal(logits.view(np.uint32), want_logits.view(np.uint32))


@pytest.mark.parametrize("arch,preset,quant", [("llama", "tiny-k", "Q4_K_M"), ("gemma3", "tiny", "Q8_0")])
@pytest.mark.parametrize("splits", [False, True], ids=["one-split", "splits"])
def test_paged_decode_after_long_prompts(synth_gguf, arch, preset, quant, splits):
    """Batched fused steps after prompts of 150-200 tokens (several trips of the subgroup decode attention
    over a sequence's pages; with `splits`, a head's keys over several workgroups as well) give each
    sequence the greedy tokens it gets alone from the contiguous cache; Gemma 3 with its sliding-window
    layers too."""
    from shaderlm.kernels import ops
    path = synth_gguf(seed=4, preset=preset, arch=arch, quant=quant)
    m = shaderlm.load(path, progress=False, ctx=256, fuse=True)       # the subgroup decode attention
    if splits:
        wg, unroll = ops.attention_shape(m.net.dev, m.config.n_heads)[:2]
        m = shaderlm.load(path, progress=False, ctx=256, fuse=True,
                          options=Options.from_env().replace(attention_shape=(wg, unroll, 4, 32)))
    prompts = [random_ids(m.config.vocab_size, n, 40 + n) for n in (150, 197, 171)]
    want = [m.generate_tokens(p, 12, stop_at_eos=False) for p in prompts]
    sv = Serving(m.net, slots=3, seq_ctx=224, tokens_per_submit=4)
    got = _generate_batched(sv, dict(enumerate(prompts)), 12)
    assert [got[s] for s in range(3)] == want


@pytest.mark.parametrize("arch,preset,quant", [("llama", "tiny-k", "Q4_K_M"), ("gemma3", "tiny", "Q8_0"),
                                               ("qwen3", "tiny", "Q4_1")])
def test_batches_on_the_prompt_gemms(synth_gguf, arch, preset, quant):
    """Steps of gemm_rows rows or more run int8 GEMMs over the batch (up to gemm.FEW_TOKENS rows matmul_few)
    instead of the decode GEMVs: a sequence's tokens and logits are then bit-identical in every such
    batch, whatever its neighbours and size, and greedy decode follows the reference
    (teacher-forced on our tokens) wherever its top-1/top-2 margin is clear of int8 rounding (5% of the
    logit scale, as tests/test_model.py's int8 tests)."""
    from reference import reference_logits
    from neartie import first_divergence
    path = synth_gguf(seed=2, preset=preset, arch=arch, quant=quant)
    m = shaderlm.load(path, progress=False, ctx=256, options=Options.from_env().replace(exact_prefill=False,
                                                                                         gemm_rows=2))
    prompts = [random_ids(m.config.vocab_size, n, seed) for seed, n in enumerate((5, 19, 40, 11, 33))]
    sv = Serving(m.net, slots=5, seq_ctx=128, tokens_per_submit=4)
    assert sv.gemm_rows == 2 and Options.from_env({"SHADERLM_GEMM_ROWS": "2"}).gemm_rows == 2
    labels = {rows: [d.label for d in sv.decode_plan(rows).dispatches] for rows in (1, 2)}
    assert any(x.startswith("gemv") for x in labels[1]) and not any(x.startswith("matmul_q8") for x in labels[1])
    assert any(x.startswith("matmul_few") for x in labels[2]) and not any(x.startswith(("gemv", "matmul_q8"))
                                                                          for x in labels[2])
    seen = {}
    for mix in ([0, 2], [2, 0, 4], [1, 3, 0, 2, 4], [3, 1]):
        got = _generate_batched(sv, {s: prompts[i] for s, i in enumerate(mix)}, N)
        for s, i in enumerate(mix):
            seen.setdefault(i, []).append((got[s], sv.last_logits(len(mix))[s]))
    for i, runs in seen.items():
        toks, logits = runs[0]
        for t, lg in runs[1:]:
            assert t == toks and np.array_equal(lg, logits), f"prompt {i}: differs between batches"
        ref = reference_logits(path, prompts[i] + toks)
        rows = ref[len(prompts[i]) - 1:len(prompts[i]) - 1 + len(toks)]
        top2 = np.sort(rows, axis=1)[:, -2:]
        bad = first_divergence(rows.argmax(1).tolist(), (top2[:, 1] - top2[:, 0]).tolist(), toks,
                               0.05 * float(np.abs(ref).max()))
        assert bad is None, (i, bad)


def test_float_weights_keep_the_gemvs_up_to_few_rows(synth_gguf):
    """Float weights have no int8 kernel for a few rows (matmul_few): a model with them keeps the decode
    GEMVs in steps of up to gemm.FEW_TOKENS rows, whatever gemm_rows says, so its tokens are those of a
    sequence decoded alone; past that, the GEMM steps."""
    path = synth_gguf(seed=2, preset="tiny", arch="llama", quant="F16")
    m = shaderlm.load(path, progress=False, ctx=256, options=Options.from_env().replace(exact_prefill=False,
                                                                                         gemm_rows=2))
    prompts = [random_ids(m.config.vocab_size, n, seed) for seed, n in enumerate((5, 19, 11))]
    want = [m.generate_tokens(p, N, stop_at_eos=False) for p in prompts]
    sv = Serving(m.net, slots=3, seq_ctx=128, tokens_per_submit=4)
    assert not m.net.quantized_matmuls() and not sv.on_gemms(3) and sv.on_gemms(gemm.FEW_TOKENS + 1)
    labels = [d.label for d in sv.decode_plan(3).dispatches]
    assert "gemv.F16" in labels and not any(x.startswith(("matmul_few", "matmul_q8", "matmul_tiled"))
                                            for x in labels), labels
    got = _generate_batched(sv, dict(enumerate(prompts)), N)
    assert [got[s] for s in range(3)] == want


@pytest.fixture(scope="module")
def engine(synth_gguf):
    path = synth_gguf(seed=3, preset="tiny", arch="llama", quant="Q8_0")
    e = shaderlm.serve_engine(path, parallel=4, ctx=160, queue_size=12, progress=False)
    yield e
    e.close()


def _settled(engine):
    """Wait until the engine has nothing running, then check that every page and slot is free."""
    import time
    for _ in range(200):
        s = engine.stats()
        if s["running"] == 0 and s["waiting"] == 0 and not engine.draining and not engine.in_flight:
            break
        time.sleep(0.05)
    assert engine.pool.used == 0 and engine.pool.reserved == 0, (engine.pool.used, engine.pool.reserved)
    assert sorted(engine.free_slots) == list(range(engine.parallel))


def test_engine_continuous_batching_and_stops(engine):
    """More requests than slots, of different lengths and settings: each gets what it gets alone."""
    m = engine.model
    prompts = [random_ids(m.config.vocab_size, n, 10 + n) for n in (4, 30, 9, 17, 25, 6)]
    want = [m.generate_tokens(p, 10 + i, stop_at_eos=False) for i, p in enumerate(prompts)]
    streams = [engine.submit(Request(p, max_tokens=10 + i, stop_at_eos=False)) for i, p in enumerate(prompts)]
    for s, w in zip(streams, want):
        events = list(s)
        assert [t for ev in events for t in ev.token_ids] == w
        assert events[-1].finish_reason == "length" and events[-1].completion_tokens == len(w)
    # a stop string ends a completion before it, and seeded sampling repeats
    text = engine.generate([Request(prompts[1], max_tokens=12, stop_at_eos=False)])[0]
    assert len(text) > 3
    stop = text[2:4]
    cut = engine.generate([Request(prompts[1], max_tokens=12, stop_at_eos=False, stop=[stop])])[0]
    assert cut == text[:text.index(stop)]
    a, b = engine.generate([Request(prompts[2], max_tokens=10, temperature=0.9, top_k=20, seed=5, stop_at_eos=False)
                            for _ in range(2)])
    assert a == b
    _settled(engine)


def test_engine_with_three_batches_in_flight(engine):
    """An engine that keeps three decode batches queued on the GPU (batches_in_flight=3: a sequence may
    run three batches past its end) gives each sequence the tokens it gets alone, and frees every page."""
    from shaderlm.engine.scheduler import Engine
    m = engine.model
    e = Engine(m.path, parallel=4, ctx=160, queue_size=12, progress=False, batches_in_flight=3)
    queued, submit = [], e.runner.submit
    e.runner.submit = lambda b: (queued.append(len(e.in_flight)), submit(b))
    try:
        prompts = [random_ids(m.config.vocab_size, n, 20 + n) for n in (4, 30, 9, 17, 25)]
        want = [m.generate_tokens(p, 30 + i, stop_at_eos=False) for i, p in enumerate(prompts)]
        streams = [e.submit(Request(p, max_tokens=30 + i, stop_at_eos=False)) for i, p in enumerate(prompts)]
        for s, w in zip(streams, want):
            assert [t for ev in s for t in ev.token_ids] == w
        assert max(queued) == 2, queued          # a third batch was submitted behind two
        _settled(e)
    finally:
        e.close()


def test_decode_batches_ramp_up_from_an_idle_gpu(engine, monkeypatch):
    """From an idle engine a sequence's decode batches take 1, 2, 4, .. steps up to tokens_per_submit
    (the first tokens stream sooner), and its tokens are those it gets alone."""
    m = engine.model
    _settled(engine)
    prompt = random_ids(m.config.vocab_size, 7, 21)
    want = m.generate_tokens(prompt, 20, stop_at_eos=False)
    real, steps = engine.runner.record, []

    def record(slots, positions, k, **kw):
        steps.append(k)
        return real(slots, positions, k, **kw)
    monkeypatch.setattr(engine.runner, "record", record)
    out = [t for ev in engine.submit(Request(prompt, max_tokens=20, stop_at_eos=False)) for t in ev.token_ids]
    assert out == want
    ramp = [min(1 << i, engine.k) for i in range(len(steps))]
    assert steps[:3] == ramp[:3] and all(a <= b for a, b in zip(steps, ramp)), steps
    assert sum(steps) >= 19, steps          # the prompt's step sampled the first token
    _settled(engine)


def test_decode_steps_queued_behind_the_prompt(engine, monkeypatch):
    """A request on an idle engine has its first decode batch submitted behind its prefill, before its
    first token is read (the GPU need not wait for the host between them); a first token that ends the
    request (its stop string) then leaves those steps unused: nothing more streams, every page comes back.
    Where reads wait for everything submitted (no indexed reads: Dawn), the first token is read first."""
    m = engine.model
    if not engine.runner.reads_by_submission:
        pytest.skip("wgpu-native's indexed reads only")
    _settled(engine)
    prompt = random_ids(m.config.vocab_size, 9, 31)
    calls, runner = [], engine.runner
    for name in ("submit", "first_token"):
        real = getattr(runner, name)
        monkeypatch.setattr(runner, name, lambda *a, _n=name, _f=real, **kw: (calls.append(_n), _f(*a, **kw))[1])
    events = list(engine.submit(Request(prompt, max_tokens=6, stop_at_eos=False)))
    assert calls[0] == "submit" and "first_token" in calls, calls
    first = events[0].text
    assert first and events[0].token_ids == m.generate_tokens(prompt, 1, stop_at_eos=False)
    calls.clear()
    cut = list(engine.submit(Request(prompt, max_tokens=6, stop_at_eos=False, stop=[first])))
    assert calls[0] == "submit" and "first_token" in calls, calls
    assert "".join(ev.text for ev in cut) == "" and cut[-1].finish_reason == "stop"
    _settled(engine)
    monkeypatch.setattr(engine.runner.dev, "indexed", None)
    calls.clear()
    again = list(engine.submit(Request(prompt, max_tokens=6, stop_at_eos=False)))
    assert calls[0] == "first_token" and "submit" in calls, calls
    assert [t for ev in again for t in ev.token_ids] == [t for ev in events for t in ev.token_ids]
    _settled(engine)


def test_prefix_cache(engine):
    """A prompt that begins like an earlier one takes that one's full pages from the cache, and
    computes the same tokens."""
    m = engine.model
    shared = random_ids(m.config.vocab_size, 50, 7)
    p1, p2 = shared + [5, 6, 7], shared + [9, 8]
    want = m.generate_tokens(p2, 8, stop_at_eos=False)
    engine.generate([Request(p1, max_tokens=4, stop_at_eos=False)])
    before = engine.stats()["cached_prompt_tokens_total"]
    out = [t for ev in engine.submit(Request(p2, max_tokens=8, stop_at_eos=False)) for t in ev.token_ids]
    assert engine.stats()["cached_prompt_tokens_total"] - before == 48      # 3 whole pages of 16
    assert out == want
    _settled(engine)


def test_gpu_fault_fails_its_request_and_the_engine_goes_on(engine, monkeypatch):
    """A GPU error in a step (out of memory here; a lost device reads the same) ends the requests in
    it with an error naming what failed; their pages come back and the next request is served."""
    import wgpu
    m = engine.model
    dev = m.net.dev
    if dev.indexed is None:
        pytest.skip("the fault is injected at wgpu-native's indexed submit")
    prompt = random_ids(m.config.vocab_size, 12, 4)
    want = m.generate_tokens(prompt, 6, stop_at_eos=False)
    real, failed = dev.indexed.submit, []

    def submit_once_out_of_memory(command_buffers):
        if not failed:
            failed.append(True)
            raise wgpu.GPUOutOfMemoryError("Out of memory")
        return real(command_buffers)
    monkeypatch.setattr(dev.indexed, "submit", submit_once_out_of_memory)
    events = list(engine.submit(Request(prompt, max_tokens=6, stop_at_eos=False)))
    assert events[-1].finish_reason == "error"
    assert "submitting GPU work failed" in events[-1].error and "GPUOutOfMemoryError" in events[-1].error
    _settled(engine)
    out = [t for ev in engine.submit(Request(prompt, max_tokens=6, stop_at_eos=False)) for t in ev.token_ids]
    assert out == want
    _settled(engine)


def _ends(stream, timeout=60.0) -> list:
    """The stream's events, or a failure if it has not ended within `timeout` seconds (a hang)."""
    import threading
    out = []
    th = threading.Thread(target=lambda: out.extend(stream), daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), "the stream never ended"
    return out


def test_fault_while_prompts_join_a_step_fails_all_of_them(engine, monkeypatch):
    """Three prompts in one prompt pass, the pass failing: each of the three ends with an error, their
    pages come back, and the engine goes on."""
    m = engine.model
    prompts = [random_ids(m.config.vocab_size, n, 20 + n) for n in (7, 9, 11)]
    real, calls = engine.runner.prefill_pass, []

    def pass_failing(parts):
        calls.append([p.slot for p in parts])
        raise RuntimeError("injected prefill failure")
    monkeypatch.setattr(engine.runner, "prefill_pass", pass_failing)
    with engine._cv:               # all three wait before the engine's next step
        streams = [engine.submit(Request(p, max_tokens=4, stop_at_eos=False)) for p in prompts]
    for s in streams:
        events = _ends(s)
        assert events[-1].finish_reason == "error" and "injected prefill failure" in events[-1].error
    assert len(calls) == 1 and len(calls[0]) == 3
    _settled(engine)
    monkeypatch.setattr(engine.runner, "prefill_pass", real)
    want = m.generate_tokens(prompts[0], 4, stop_at_eos=False)
    assert [t for ev in _ends(engine.submit(Request(prompts[0], max_tokens=4, stop_at_eos=False)))
            for t in ev.token_ids] == want
    _settled(engine)


def test_logprobs(engine):
    """Each token's logprob and its top n against a softmax of the model's logits (NumPy): a request
    alone asking for none of the most likely tokens, then one asking for 3 in the same batches as one
    asking for none (each row gives as many as its own request asks for); more than the rows hold is refused."""
    m = engine.model

    def check(p, stream, top):
        events = list(stream)
        toks = [t for ev in events for t in ev.token_ids]
        lps = [lp for ev in events for lp in ev.logprobs]
        ref = m.logits(p + toks).astype(np.float64)
        ref = ref - ref.max(1, keepdims=True)
        ref -= np.log(np.exp(ref).sum(1, keepdims=True))
        assert len(lps) == len(toks) == 5
        for j, (t, lp) in enumerate(zip(toks, lps)):
            row = ref[len(p) - 1 + j]
            assert lp.token == t and abs(lp.logprob - row[t]) < 1e-3
            assert [i for i, _ in lp.top] == np.argsort(-row, kind="stable")[:top].tolist()
            assert np.allclose([v for _, v in lp.top], np.sort(row)[::-1][:top], atol=1e-3)

    prompts = [random_ids(m.config.vocab_size, n, 3 + n) for n in (9, 14)]
    check(prompts[0], engine.submit(Request(prompts[0], max_tokens=5, stop_at_eos=False, logprobs=0)), 0)
    streams = [engine.submit(Request(p, max_tokens=5, stop_at_eos=False, logprobs=top)) for p, top in zip(prompts, (3, 0))]
    for p, s, top in zip(prompts, streams, (3, 0)):
        check(p, s, top)
    with pytest.raises(ValueError, match="logprobs 21"):
        engine.submit(Request(prompts[0], max_tokens=5, logprobs=engine.runner.max_top_logprobs + 1))
    _settled(engine)


def test_openai_client_against_the_engine(engine, capsys):
    """The official client, streamed and not: the greedy reply is `shaderlm run --temp 0`'s."""
    from openai import OpenAI

    from shaderlm.cli import main
    prompt = "the quick brown fox"
    assert main(["run", "-m", engine.model.path, "--raw", "--temp", "0", "-n", "12", "-c", "160", prompt]) == 0
    want = capsys.readouterr().out[:-1]              # run ends the completion with a newline
    with running_server(engine) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        r = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=12, temperature=0)
        assert r.choices[0].text == want and r.usage.completion_tokens <= 12
        chunks = client.completions.create(model=engine.model_name, prompt=prompt, max_tokens=12, temperature=0,
                                           stream=True)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want
        chat = client.chat.completions.create(model=engine.model_name, max_tokens=6,
                                              messages=[{"role": "user", "content": "hello"}])
        assert chat.choices[0].finish_reason in ("stop", "length")
    _settled(engine)


def test_many_clients_cancels_and_bad_requests(engine):
    """16 concurrent streams (more than slots and queue), a third closed early, with malformed and
    oversize requests among them: every request is answered (or refused with 429), the server still
    answers after, and every KV page and slot is free again."""
    import httpx
    from openai import AsyncOpenAI, RateLimitError

    async def one(client, i):
        try:
            stream = await client.chat.completions.create(
                model=engine.model_name, max_tokens=40, temperature=0.5, seed=i, stream=True,
                messages=[{"role": "user", "content": f"tell me about {i} foxes"}])
            got = 0
            async for chunk in stream:
                got += 1
                if i % 3 == 0 and got == 3:           # the client goes away mid-stream
                    await stream.close()
                    return "cancelled"
            return "done"
        except RateLimitError:
            return "429"

    async def bad(url):
        async with httpx.AsyncClient() as c:
            codes = [(await c.post(f"{url}/v1/chat/completions", content=b"{not json")).status_code,
                     (await c.post(f"{url}/v1/chat/completions", json={"messages": "hi"})).status_code,
                     (await c.post(f"{url}/v1/completions", json={"prompt": "a " * 400, "max_tokens": 4})).status_code]
        return codes

    async def main(url):
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        results = await asyncio.gather(*[one(client, i) for i in range(16)], bad(url))
        return results[:-1], results[-1]

    with running_server(engine) as url:
        results, codes = asyncio.run(main(url))
        assert codes == [400, 400, 400]
        assert set(results) <= {"done", "cancelled", "429"} and results.count("done") >= 4, results
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        _settled(engine)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "the dog", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    _settled(engine)


def run_load_script(*args):
    """bench/load.py run with `args` in a process of its own: the finished process (its output as text)."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "bench" / "load.py"
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("procs", [1, 2])
def test_load_script(engine, procs):
    """bench/load.py against a live server: every completion checked, each token of each stream
    timed (with --logprobs, as many as usage counts), and the slowest stream's longest wait placed
    within it; also with the streams shared by two client processes."""
    with running_server(engine) as url:
        r = run_load_script("--url", url, "-c", "6", "--requests", "8", "-n", "10", "--logprobs", "--procs", str(procs))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "completed 8, failed 0" in r.stdout and "TTFT ms (8 requests" in r.stdout, r.stdout
    rate = float(r.stdout.split("decode tok/s a stream: p50 ")[1].split()[0])
    assert rate > 0, r.stdout
    after, of = r.stdout.split("slowest stream: longest wait ")[1].split("after its token ")[1].split(";")[0].split(" of ")
    assert 1 <= int(after) < int(of) <= 10, r.stdout
    _settled(engine)


def test_load_script_fails_fast_when_a_client_process_dies(free_tcp_port):
    """bench/load.py with client processes that cannot reach a server: each dies before the start barrier,
    and the script says so and exits, instead of the others waiting at the barrier for ever."""
    r = run_load_script("--url", f"http://127.0.0.1:{free_tcp_port}", "-c", "2", "--requests", "2", "--procs", "2")
    assert r.returncode == 2 and "a client process exited with code 1 before reporting" in r.stderr, r.stderr


def test_real_model_chat_equals_run(smollm2_path, capsys):
    """The real SmolLM2 through the server: a greedy chat reply is what `shaderlm run --temp 0` prints."""
    from openai import OpenAI

    from shaderlm.cli import main
    prompt = "What is the capital of France?"
    assert main(["run", "-m", smollm2_path, "--temp", "0", "-n", "12", "-c", "256", prompt]) == 0
    want = capsys.readouterr().out[:-1]
    e = shaderlm.serve_engine(smollm2_path, parallel=2, ctx=256, progress=False)
    try:
        with running_server(e) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
            r = client.chat.completions.create(model=e.model_name, max_tokens=12, temperature=0,
                                               messages=[{"role": "user", "content": prompt}])
            assert r.choices[0].message.content == want
    finally:
        e.close()
