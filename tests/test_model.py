"""The whole GPU forward pass and generation loop against the NumPy reference (tests/reference.py)
on synthetic models: same GGUF file, independent implementations.

Tolerance: the GPU keeps K/V in f16 (relative rounding 2^-11 ~ 4.9e-4) and sums in a different
order; on these tiny models that moves logits by about 1e-4..1e-3 of their scale, so we allow
2e-3 x max|logit| (measured errors are printed on failure). Greedy tokens must match wherever the
reference's top-1/top-2 margin exceeds that tolerance (a near-tie may flip legitimately).
"""
from __future__ import annotations

import numpy as np
import pytest

import shaderlm
from shaderlm.errors import ContextFullError
from shaderlm.gpu.device import Device, get_device
from shaderlm.kernels import compiled, gemm
from shaderlm.options import Options

from reference import reference_logits

try:
    from neartie import first_divergence
except ImportError:  # tests/ imported as a package
    from tests.neartie import first_divergence
try:
    from synth_models import check_logits, logit_tol as _tol, model_cache, random_ids as _ids
except ImportError:  # tests/ imported as a package
    from tests.synth_models import check_logits, logit_tol as _tol, model_cache, random_ids as _ids

CASES = {
    "llama-Q4_1": dict(preset="tiny", arch="llama", quant="Q4_1"),
    "llama-F16": dict(preset="tiny", arch="llama", quant="F16", embed_type="F16"),
    "llama-Q8_0": dict(preset="tiny", arch="llama", quant="Q8_0"),
    "llama-Q4_K_M": dict(preset="tiny-k", arch="llama", quant="Q4_K_M"),
    "qwen2-Q5_0": dict(preset="tiny", arch="qwen2", quant="Q5_0"),
}


@pytest.fixture(scope="module")
def models(synth_gguf):
    return model_cache(synth_gguf, CASES)


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_reference(models, name):
    path, m = models(name)
    check_logits(path, m, name)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", ["llama-Q4_1", "llama-Q4_K_M", "qwen2-Q5_0"])
def test_greedy_decode_matches_reference(models, name, fuse):
    """Prefill + the decode path (N tokens per submit; with and without the decode fusions: norm in
    GEMV, RoPE+KV store in attention, gate/up activation) against the reference, teacher-forced."""
    path, m = models(name, fuse=fuse)
    assert m.net.fuse == fuse
    prompt = _ids(m.config.vocab_size, 7, 1)
    got = m.generate_tokens(prompt, 20, temperature=0.0, stop_at_eos=False)
    margins, want = [], []
    logits_all = reference_logits(path, prompt + got)  # teacher-forced on our tokens
    for i in range(len(got)):
        row = logits_all[len(prompt) - 1 + i]
        top2 = np.sort(row)[-2:]
        want.append(int(row.argmax()))
        margins.append(float(top2[1] - top2[0]))
    tol = _tol(logits_all)
    bad = first_divergence(want, margins, got, tol)
    assert bad is None, bad


# The int8 prefill GEMM (the GPU default) rounds each matmul's input to int8 per 16 values: on these
# random models that moves logits by 1.3-2% of their largest (lavapipe), against 0.04-0.07% for the f32
# path; a wrong scale, offset or element order moves them by their whole size.
INT8_PREFILL_TOL = 0.04


@pytest.mark.parametrize("name", ["llama-Q4_1", "llama-Q4_K_M", "qwen2-Q5_0"])
def test_int8_prefill_logits(models, name):
    path, m = models(name, exact_prefill=False)
    assert m.net.int8_prefill
    ids = _ids(m.config.vocab_size, 29, 0)
    ref = reference_logits(path, ids)
    got = m.logits(ids)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= INT8_PREFILL_TOL, f"{name}: int8 prefill logits off by {err:.3g} of max |logit|"


# The tensor-core GEMM (matmul_tc: x and W on 16-bit grids) is nearly exact (llama-Q4_1 0.04% of the
# largest logit, as the f32 path): a tenth of the int8 tolerance, which int8 activations miss.
TC_PREFILL_TOL = 0.004


@pytest.mark.parametrize("name", ["llama-Q4_1"])        # one: emulated, it is slow
def test_tensor_core_prefill_logits(synth_gguf, name, monkeypatch):
    """A prompt through the tensor-core GEMM (its matrix operations emulated where the adapter has
    none), the norm and the gated activation folded into its x pass, against the NumPy reference."""
    monkeypatch.setattr(gemm, "TC_EMULATE", not get_device().has_int8_matrix)
    path = synth_gguf(**CASES[name])
    # passes of up to 128 tokens: the tensor-core GEMM's least (prompts are shorter: the tiles' clamps)
    m = shaderlm.load(path, progress=False, ctx=gemm.TC_MIN_TOKENS, options=Options.from_env().replace(exact_prefill=False))
    if not gemm.tensor_cores(m.device):
        pytest.skip("the tensor-core GEMM's tiles do not fit this adapter")
    assert any(d.label.startswith("matmul_tc") for d in m.net.plan_prefill[False].dispatches)
    ids = _ids(m.config.vocab_size, 29, 0)
    ref = reference_logits(path, ids)
    err = np.abs(m.logits(ids) - ref).max() / np.abs(ref).max()
    assert err <= TC_PREFILL_TOL, f"{name}: tensor-core prefill logits off by {err:.3g} of max |logit|"


def test_chunked_prefill_equals_single_pass(models):
    """A prompt longer than the prefill batch runs in chunks over the KV cache: same logits."""
    path, m_small = models("llama-Q4_1", batch=16)
    _, m = models("llama-Q4_1")
    ids = _ids(m.config.vocab_size, 45, 2)
    a = m.generate_tokens(ids, 8, stop_at_eos=False)
    b = m_small.generate_tokens(ids, 8, stop_at_eos=False)
    assert a == b
    ref = reference_logits(path, ids)
    got = m_small.logits(ids)
    assert np.abs(got - ref).max() <= _tol(ref)


def test_split_weights_match(synth_gguf):
    """Every tensor split into several bindings (as on adapters with small binding limits)."""
    path = synth_gguf(seed=1, **CASES["llama-Q4_1"])
    dev = Device()
    dev.max_binding = 4096           # forces row chunks in every matrix and the embedding table
    from shaderlm.engine.generate import Generator
    from shaderlm.models import open_model
    m = open_model(path)
    net = m.arch(dev, m.source, m.args, ctx=32, batch=16, exact_prefill=True, int8_act=False)  # f32 tolerance
    assert len(net.tok_embd.chunks) > 1 and len(net.layers[0].down.chunks) > 1
    ids = _ids(m.args.vocab_size, 21, 3)
    got = Generator(net).logits(ids)
    ref = reference_logits(path, ids)
    assert np.abs(got - ref).max() <= _tol(ref)


def test_sampling_is_seeded_and_valid(models):
    _, m = models("llama-Q4_1")
    prompt = _ids(m.config.vocab_size, 5, 4)
    a = m.generate_tokens(prompt, 12, temperature=0.9, top_k=20, top_p=0.9, seed=7, stop_at_eos=False)
    b = m.generate_tokens(prompt, 12, temperature=0.9, top_k=20, top_p=0.9, seed=7, stop_at_eos=False)
    c = m.generate_tokens(prompt, 12, temperature=0.9, top_k=20, top_p=0.9, seed=8, stop_at_eos=False)
    assert a == b and a != c
    assert all(0 <= t < m.config.vocab_size for t in a)


def test_prompt_over_context_is_a_clear_error(models):
    _, m = models("llama-Q4_1", ctx=32)
    with pytest.raises(ContextFullError, match="context"):
        m.generate_tokens(list(range(3, 40)), 4)


def test_generation_stops_when_context_is_full(models):
    _, m = models("llama-Q4_1", ctx=32)
    out = m.generate_tokens(list(range(3, 23)), 100, stop_at_eos=False)
    assert len(out) == 32 - 20 + 1 and m.stats.stop_reason == "context"


def test_stop_with_batches_in_flight_keeps_the_cache(models):
    """A stop token ends generation while later decode batches are still queued on the GPU (2 tokens
    a submit, 2 submits in flight): the stop comes back with nothing after it, and a follow-up turn
    that reuses the cached prefix gives what a fresh run of the whole sequence gives."""
    _, m = models("llama-Q4_1", tokens_per_submit=2)
    gen = m.generator
    assert gen.depth == 2
    prompt = _ids(m.config.vocab_size, 6, 5)
    full = m.generate_tokens(prompt, 16, stop_at_eos=False)
    stop = full[5]
    cut = full[:full.index(stop)]
    gen.reset()
    got = list(gen.generate(prompt, 16, stop_ids={stop}, keep_history=True))
    assert got == cut and m.stats.stop_reason == "eos"
    assert gen.history == prompt + cut          # the stop token was sampled but never fed
    follow = prompt + cut + [3]
    again = list(gen.generate(follow, 6, keep_history=True))      # reuses the cached prefix
    gen.reset()
    fresh = list(gen.generate(follow, 6, keep_history=True))
    assert again == fresh and len(again) == 6


@pytest.mark.parametrize("name", ["llama-Q4_K_M", "llama-Q8_0", "llama-F16"])
def test_int8_act_decode(models, name):
    """int8_act=True (--int8-act): decode GEMVs of the types with an int8 decoder take x rounded to
    int8 (tests/test_kernels.py::test_gemv_int8_x checks the kernels exactly). Here the wiring: the
    decode plan's GEMVs are the int8 ones exactly where the type allows, and greedy decode follows the
    reference wherever its top-1/top-2 margin is clear of the rounding (5% of the logit scale, against
    0.2% for the exact path); F16, which has no int8 decoder, gives the exact path's tokens."""
    path, m = models(name, fuse=True, int8_act=True)
    gemvs = [d for d in m.net.plan_decode.dispatches if d.label.startswith("gemv.")]
    int8 = [d for d in gemvs if "int8x" in d.tune.key]
    if name == "llama-F16":
        assert gemvs and not int8
        _, exact = models(name, fuse=True)
        prompt = _ids(m.config.vocab_size, 7, 1)
        assert m.generate_tokens(prompt, 12, stop_at_eos=False) == exact.generate_tokens(prompt, 12, stop_at_eos=False)
        return
    assert int8 and all(d.label.split(".", 1)[1].split("+")[0] in ("Q4_K", "Q6_K", "Q8_0") for d in int8)
    prompt = _ids(m.config.vocab_size, 7, 1)
    got = m.generate_tokens(prompt, 20, temperature=0.0, stop_at_eos=False)
    logits_all = reference_logits(path, prompt + got)
    rows = logits_all[len(prompt) - 1:len(prompt) - 1 + len(got)]
    top2 = np.sort(rows, axis=1)[:, -2:]
    bad = first_divergence(rows.argmax(1).tolist(), (top2[:, 1] - top2[:, 0]).tolist(), got,
                           0.05 * float(np.abs(logits_all).max()))
    assert bad is None, bad


@pytest.mark.parametrize("env,want", [({}, None), ({"SHADERLM_INT8_ACT": "1"}, True),
                                      ({"SHADERLM_INT8_ACT": "0"}, False), ({"SHADERLM_INT8_ACT": ""}, None)])
def test_int8_act_setting(env, want):
    """SHADERLM_INT8_ACT: 1 forces int8 decode activations, 0 forces 24-bit ones, unset leaves it to the adapter."""
    assert Options.from_env(env).int8_act is want


def test_precision_follows_the_adapter(synth_gguf, monkeypatch):
    """Left unset, a GPU (here the adapter made to report itself as one, then as a CPU) takes int8
    activations in decode and prefill and shares each batched GEMV weight load between 2 tokens; a CPU
    adapter takes the exact paths (24-bit decode activations, the f32 GEMM), and so does any adapter told
    int8_act=False and exact_prefill=True (the CLI's --exact)."""
    for name in ("SHADERLM_INT8_ACT", "SHADERLM_EXACT_PREFILL", "SHADERLM_BATCH_NT"):      # conftest's
        monkeypatch.delenv(name, raising=False)
    path = synth_gguf(seed=1, **CASES["llama-Q4_K_M"])

    def precision(m):
        keys = [d.tune.key for d in m.net.plan_decode.dispatches if d.label.startswith("gemv.")]
        return m.net.int8_act, m.net.int8_prefill, m.net.batch_tokens, sum("int8x" in k for k in keys), len(keys)

    monkeypatch.setattr(Device, "is_cpu", property(lambda self: True))
    cpu = precision(shaderlm.load(path, progress=False, tune="0"))
    assert cpu[:4] == (False, False, 1, 0) and cpu[4] > 0
    monkeypatch.setattr(Device, "is_cpu", property(lambda self: False))
    gpu = precision(shaderlm.load(path, progress=False, tune="0"))
    assert gpu[:3] == (True, True, 2) and gpu[3] == gpu[4] > 0        # every GEMV's type has an int8 decoder
    exact = precision(shaderlm.load(path, progress=False, tune="0", int8_act=False, exact_prefill=True))
    assert exact[:4] == (False, False, 1, 0)


@pytest.mark.parametrize("name", ["llama-Q4_K_M", "llama-Q8_0", "llama-Q4_1"])
def test_x24_decode_is_the_default_and_follows_f32(models, monkeypatch, name):
    """The decode GEMVs of types with an integer-dot decoder take x as 24-bit fixed point by default on
    CPU adapters (and with --exact on GPUs; kernels/gemv.py int_x_ok; tests/test_kernels.py::test_gemv_x24
    checks the kernels' accuracy). SHADERLM_NO_X24=1 builds them with f32 x instead; greedy decode is
    the same token for token (x24 is as accurate as f32 x; here 24 steps with no near-tie allowance)."""
    if not Options.from_env().x24:
        pytest.skip("SHADERLM_NO_X24 is set (a CI configuration): this test compares the default with it")
    path, m = models(name, fuse=True)
    defines = {id(p): dict(k[1]) for k, p in compiled(m.device).items() if k[0] == "gemv"}

    def x24_flags(model):
        return [defines.get(id(d.pipeline), {}).get("X24") for d in model.net.plan_decode.dispatches
                if d.label.startswith("gemv.")]
    assert x24_flags(m) and all(x24_flags(m))
    monkeypatch.setenv("SHADERLM_NO_X24", "1")
    f32 = shaderlm.load(path, progress=False, fuse=True)
    defines.update({id(p): dict(k[1]) for k, p in compiled(f32.device).items() if k[0] == "gemv"})
    assert x24_flags(f32) and not any(x24_flags(f32))
    prompt = _ids(m.config.vocab_size, 7, 2)
    assert m.generate_tokens(prompt, 24, stop_at_eos=False) == f32.generate_tokens(prompt, 24, stop_at_eos=False)
