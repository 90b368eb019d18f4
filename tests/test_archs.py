"""Qwen3 and Gemma 3 against the NumPy reference (tests/reference.py): their new kernels on their own,
tiny synthetic models (two quant types each, fused and unfused decode, Gemma's sliding window well
past its length), and the real Gemma 3 270M Q4_K_M when its package is installed.

Tolerances on the synthetic models are test_model.py's: 2e-3 x max|logit| (f16 KV cache and summation
order move these logits by ~1e-4..1e-3 of their scale), and greedy tokens must match the teacher-forced
reference up to its first near-tie (top-1/top-2 margin below that tolerance).
"""
from __future__ import annotations

import numpy as np
import pytest

import shaderlm
from shaderlm.engine.generate import Generator
from shaderlm.gpu.device import get_device
from shaderlm.gpu.plan import Plan
from shaderlm.kernels import ops
from shaderlm.models import open_model
from shaderlm.models.gemma3 import Gemma3
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
    "qwen3-Q8_0": dict(preset="tiny", arch="qwen3", quant="Q8_0"),
    "qwen3-Q4_K_M": dict(preset="tiny-k", arch="qwen3", quant="Q4_K_M"),
    # mixtures of experts: Qwen3-MoE (renormalised top-k) and Mixtral (llama with experts), with the
    # experts' down matrices in another type than gate/up (Q4_K_M: Q6_K)
    "qwen3moe-Q8_0": dict(preset="tiny", arch="qwen3moe", quant="Q8_0"),
    "qwen3moe-Q4_K_M": dict(preset="tiny-k", arch="qwen3moe", quant="Q4_K_M", expert_ffn_dim=256),
    "mixtral-Q4_0": dict(preset="tiny", arch="llama", quant="Q4_0", n_experts=4, n_experts_used=2, expert_ffn_dim=96),
    "gemma3-Q8_0": dict(preset="tiny", arch="gemma3", quant="Q8_0"),
    "gemma3-Q4_K_M": dict(preset="tiny-k", arch="gemma3", quant="Q4_K_M"),
    # Gemma 3 270M's attention shape (head_dim 256, one KV head) at tiny size
    "gemma3-hd256-Q5_0": dict(preset="tiny", arch="gemma3", quant="Q5_0", head_dim=256, n_kv_heads=1),
}


@pytest.fixture(scope="module")
def models(synth_gguf):
    return model_cache(synth_gguf, CASES)


# ---- kernels -------------------------------------------------------------------------------------
def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _device():
    """The device models load on: SHADERLM_NO_SUBGROUPS (a CI configuration) takes subgroups away."""
    return get_device(None, Options.from_env().subgroups)


def _state(dev, n):
    return dev.upload(np.array([0, n, 0, 0, 0, 0, 0, 0], np.uint32))


@pytest.mark.parametrize("hd,n_heads,n_kv,n", [(24, 4, 2, 1), (6, 3, 1, 13), (100, 2, 2, 5), (256, 4, 1, 70),
                                               (130, 8, 4, 3)])
def test_head_norm_kernel(hd, n_heads, n_kv, n):
    """Every Q and K head of every token normalized in place with its own weights; V untouched; rows
    past n untouched. Odd sizes: head_dim not a multiple of the workgroup, over it, and tiny."""
    dev = _device()
    rng = np.random.default_rng(hd + n)
    eps = 1e-6
    W = (n_heads + 2 * n_kv) * hd
    qkv = (rng.standard_normal((n + 1, W)) * rng.uniform(0.1, 10, (n + 1, 1))).astype(np.float32)
    qw = rng.uniform(-2, 2, hd).astype(np.float32)
    kw = rng.uniform(-2, 2, hd).astype(np.float32)
    buf = dev.upload(qkv)
    Plan(dev, [ops.head_norm(dev, buf, dev.upload(qw), dev.upload(kw), _state(dev, n), n_heads=n_heads,
                             n_kv=n_kv, head_dim=hd, eps=eps)]).run(n)
    got = dev.read(buf, np.float32)[: (n + 1) * W].reshape(n + 1, W).astype(np.float64)
    x = qkv.astype(np.float64)
    want = x.copy()
    q = x[:n, : n_heads * hd].reshape(n, n_heads, hd)
    k = x[:n, n_heads * hd: (n_heads + n_kv) * hd].reshape(n, n_kv, hd)
    want[:n, : n_heads * hd] = _rms(q, qw, eps).reshape(n, -1)
    want[:n, n_heads * hd: (n_heads + n_kv) * hd] = _rms(k, kw, eps).reshape(n, -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dim,n,nxt", [(96, 3, False), (640, 5, True), (100, 1, True), (37, 9, True)])
def test_add_rmsnorm_kernel(dim, n, nxt):
    """x += rmsnorm(y) * w, and with NEXT also xn = rmsnorm(new x) * w2 (Gemma's post-norms)."""
    dev = _device()
    rng = np.random.default_rng(dim + n)
    eps = 1e-6
    x = rng.standard_normal((n + 1, dim)).astype(np.float32)
    y = (rng.standard_normal((n + 1, dim)) * rng.uniform(0.1, 10, (n + 1, 1))).astype(np.float32)
    w, w2 = rng.uniform(-2, 2, (2, dim)).astype(np.float32)
    xb, xnb = dev.upload(x), dev.upload(np.zeros((n + 1, dim), np.float32))
    kw = dict(next_w=dev.upload(w2), xn=xnb) if nxt else {}
    Plan(dev, [ops.add_rmsnorm(dev, dev.upload(y), dev.upload(w), xb, _state(dev, n), dim=dim, eps=eps,
                               **kw)]).run(n)
    want = x.astype(np.float64)
    want[:n] += _rms(y[:n].astype(np.float64), w, eps)
    got = dev.read(xb, np.float32)[: (n + 1) * dim].reshape(n + 1, dim)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if nxt:
        gotn = dev.read(xnb, np.float32)[: (n + 1) * dim].reshape(n + 1, dim)
        np.testing.assert_allclose(gotn[:n], _rms(want[:n], w2, eps), rtol=1e-5, atol=1e-5)
        assert not gotn[n].any()


# ---- tiny synthetic models -----------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_reference(models, name):
    """29 tokens: the Gemma window (8) is passed 3 times over in its sliding layers."""
    path, m = models(name)
    check_logits(path, m, name)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("name", list(CASES))
def test_greedy_decode_matches_reference(models, name, fuse):
    """A 21-token prompt and 20 decode steps (positions up to 40, five Gemma windows) against the
    reference teacher-forced on our tokens; and the decode path's logits at the last step, read back
    from the GPU, against the reference's (the tokens alone can miss a bug on a random model)."""
    path, m = models(name, fuse=fuse)
    assert m.net.fuse == fuse
    check_greedy_decode(path, m, name)


@pytest.mark.parametrize("name", ["gemma3-Q8_0", "gemma3-hd256-Q5_0", "qwen3-Q4_K_M"])
def test_split_attention_decode_matches_reference(synth_gguf, name, monkeypatch):
    """The fused decode with each head's keys split over up to 4 workgroups from the 4th key on
    (SHADERLM_ATTN): every layer's attention in a step merges its splits and leaves the shared count
    at 0 for the next, Gemma's window (8) limiting its sliding layers to 2 splits. The same checks
    as test_greedy_decode_matches_reference."""
    dev = _device()
    if not dev.has_subgroups:
        pytest.skip("the split decode attention kernel needs subgroups")
    monkeypatch.setenv("SHADERLM_ATTN", f"{ops.attention_shape(dev, 1)[0]},4,4,4")
    path = synth_gguf(seed=1, **CASES[name])
    m = shaderlm.load(path, progress=False, fuse=True)
    assert {d.workgroups(1)[1] for d in m.net.plan_decode.dispatches if d.label == "attention_decode"} == {4}
    check_greedy_decode(path, m, name)


def check_greedy_decode(path, m, name):
    prompt = _ids(m.config.vocab_size, 21, 1)
    n = 20
    got = m.generate_tokens(prompt, n, temperature=0.0, stop_at_eos=False)
    assert len(got) == n
    last = m.device.read(m.net.logit_buf, np.float32, 0, m.config.vocab_size * 4)
    logits_all = reference_logits(path, prompt + got)        # teacher-forced on our tokens
    rows = logits_all[len(prompt) - 1: len(prompt) - 1 + n]
    top2 = np.sort(rows, axis=1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0]).tolist()
    tol = _tol(logits_all)
    bad = first_divergence(rows.argmax(1).tolist(), margins, got, tol)
    assert bad is None, f"{name}: {bad}"
    # the last decode step fed got[n-2] at position len(prompt)+n-2; its logits chose got[n-1]
    err = np.abs(last - rows[n - 1]).max()
    assert err <= tol, f"{name}: decode logits max error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("name", ["gemma3-Q8_0", "qwen3-Q8_0"])
def test_chunked_prefill_equals_single_pass(models, name):
    """Prompts longer than the batch run in chunks over the KV cache (windows span chunk borders)."""
    path, m_small = models(name, batch=16)
    _, m = models(name)
    ids = _ids(m.config.vocab_size, 45, 2)
    assert m.generate_tokens(ids, 8, stop_at_eos=False) == m_small.generate_tokens(ids, 8, stop_at_eos=False)
    ref = reference_logits(path, ids)
    assert np.abs(m_small.logits(ids) - ref).max() <= _tol(ref)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_gemma3_final_logit_softcap(synth_gguf, fuse):
    """A config with final_logit_softcapping: logits = cap * tanh(logits / cap), in the logits plan
    and before the sampler (greedy is unchanged by a monotonic cap, so check the values)."""
    path = synth_gguf(seed=1, **CASES["gemma3-Q8_0"])
    m = open_model(path)
    ids = _ids(m.args.vocab_size, 13, 5)
    ref = reference_logits(path, ids).astype(np.float64)
    cap = 0.3 * float(np.abs(ref).max())              # low enough to bend the top logits
    cfg = m.args.replace(final_logit_softcap=cap)
    net = Gemma3(_device(), m.source, cfg, ctx=64, batch=32, fuse=fuse, exact_prefill=True, int8_act=False)  # as conftest
    gen = Generator(net)
    want = np.tanh(ref / cap) * cap
    got = gen.logits(ids)
    assert np.abs(got - want).max() <= _tol(ref)
    out = list(gen.generate(ids, 3, keep_history=False))
    last = net.dev.read(net.logit_buf, np.float32, 0, cfg.vocab_size * 4)
    want_last = np.tanh(reference_logits(path, ids + out)[-2].astype(np.float64) / cap) * cap
    assert np.abs(last - want_last).max() <= _tol(ref)


# ---- an architecture is one class --------------------------------------------------------------
def test_a_new_architecture_is_one_class(synth_gguf, tmp_path):
    """A Transformer subclass with its own names, registered, is all an architecture needs: synth
    writes its files, the loader finds it by its GGUF and Hugging Face names, and (this one being
    Llama under another name) it computes what Llama computes on the same weights."""
    from shaderlm.models import architectures, for_hf, register
    from shaderlm.models.llama import Llama
    from shaderlm.synth import write_synthetic_gguf

    class Copy(Llama):
        gguf_arch = "llamacopy"
        hf_architectures = ("LlamaCopyForCausalLM",)
        hf_model_types = ("llamacopy",)
        presets = {"llamacopy-tiny": dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                                          vocab_size=300, context_length=128)}
    register(Copy)
    try:
        assert for_hf("LlamaCopyForCausalLM", None) is Copy
        ours = shaderlm.load(write_synthetic_gguf(tmp_path / "c.gguf", preset="llamacopy-tiny", quant="Q8_0"),
                             progress=False, ctx=64)
        assert ours.arch == "llamacopy" and isinstance(ours.net, Copy)
        llama = shaderlm.load(write_synthetic_gguf(tmp_path / "l.gguf", preset="llamacopy-tiny", arch="llama",
                                                   quant="Q8_0"), progress=False, ctx=64)
        ids = _ids(300, 11, 3)
        assert np.array_equal(ours.logits(ids), llama.logits(ids))
    finally:
        architectures().pop("llamacopy")
