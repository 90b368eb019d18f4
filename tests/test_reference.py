"""Sanity of the NumPy reference forward pass, and a cross-check against Hugging Face transformers."""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from reference import _rope, load_reference, reference_greedy, reference_logits
from shaderlm.formats.gguf import GGUFFile

PROMPT = [5, 77, 123, 9, 250, 31, 42, 199, 7, 64, 3, 180]


def test_tiny_logits_shape_and_finite(tiny_gguf):
    logits = reference_logits(tiny_gguf, PROMPT)
    assert logits.shape == (len(PROMPT), 300) and logits.dtype == np.float32
    assert np.isfinite(logits).all()
    assert logits.std() > 0.05                               # random weights still give distinct logits
    assert len(set(logits.argmax(-1).tolist())) > 1


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_causal(synth_gguf, arch):
    path = synth_gguf(preset="tiny", arch=arch)
    a = reference_logits(path, PROMPT)
    changed = PROMPT[:6] + [11, 12, 13, 14, 15, 16]
    b = reference_logits(path, changed)
    assert np.isfinite(a).all()
    np.testing.assert_allclose(a[:6], b[:6], rtol=0, atol=1e-5)
    assert np.abs(a[6:] - b[6:]).max() > 1e-3


def test_incremental_matches_full(tiny_gguf):
    m = load_reference(tiny_gguf)
    full = m.forward(PROMPT)
    cache = m.new_cache()
    parts = [m.forward(PROMPT[:5], cache), m.forward(PROMPT[5:6], cache), m.forward(PROMPT[6:], cache)]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=1e-5)   # float32 BLAS blocking


def test_greedy_matches_argmax_loop(tiny_gguf):
    out = reference_greedy(tiny_gguf, PROMPT[:4], 6)
    ids = list(PROMPT[:4])
    for _ in range(6):
        ids.append(int(np.argmax(reference_logits(tiny_gguf, ids)[-1])))
    assert out == ids[4:]


def test_gemma3_sliding_window(synth_gguf):
    # tiny gemma3: window 8 on layers 0-4, layer 5 global.  Changing token 0 must still change the logits
    # at position 20 (through the global layer), and the reference must stay causal.
    path = synth_gguf(preset="tiny", arch="gemma3")
    ids = list(range(3, 24))
    a = reference_logits(path, ids)
    b = reference_logits(path, [4] + ids[1:])
    assert np.abs(a[20] - b[20]).max() > 1e-6


def test_rope_properties():
    rng = np.random.default_rng(0)
    d = 16
    q, k = rng.standard_normal((1, 1, d)), rng.standard_normal((1, 1, d))
    for neox in (False, True):
        rot = functools.partial(_rope, rope_dim=d, base=10000.0, scale=1.0, neox=neox, freq_div=None)
        np.testing.assert_allclose(rot(q, np.array([0])), q)                      # position 0: identity
        r = rot(q, np.array([37]))
        np.testing.assert_allclose(np.linalg.norm(r), np.linalg.norm(q))         # a rotation
        # attention scores depend on the relative position only
        s1 = (rot(q, np.array([10])) * rot(k, np.array([7]))).sum()
        s2 = (rot(q, np.array([103])) * rot(k, np.array([100]))).sum()
        assert s1 == pytest.approx(s2, rel=1e-9)
    # pairing: normal rotates (0, 1), neox rotates (0, d/2)
    e0 = np.zeros((1, 1, d))
    e0[..., 0] = 1.0
    n = _rope(e0, np.array([1]), d, 10000.0, 1.0, False, None)
    x = _rope(e0, np.array([1]), d, 10000.0, 1.0, True, None)
    assert n[0, 0, 1] == pytest.approx(np.sin(1.0)) and x[0, 0, d // 2] == pytest.approx(np.sin(1.0))
    # rope_freqs divide the frequencies: a factor 2 at position 2 equals no factor at position 1
    div = np.full(d // 2, 2.0)
    np.testing.assert_allclose(_rope(q, np.array([2]), d, 10000.0, 1.0, False, div),
                               _rope(q, np.array([1]), d, 10000.0, 1.0, False, None))


def test_rope_freqs_tensor_is_used(synth_gguf):
    plain = synth_gguf(preset="tiny")
    scaled = synth_gguf(preset="tiny", rope_freqs=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                       original_context_length=16))
    assert "rope_freqs.weight" in GGUFFile(scaled).tensors
    a, b = reference_logits(plain, PROMPT), reference_logits(scaled, PROMPT)
    np.testing.assert_allclose(a[0], b[0], atol=1e-5)         # position 0 is never rotated
    assert np.abs(a[1:] - b[1:]).max() > 1e-4


# ---------------------------------------------------------------------------------- cross-check (optional)


@pytest.fixture(scope="module")
def hf():
    """transformers + torch, with gguf-py's reader sped up for this module (same parsing, faster slicing)."""
    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001 - absent (CI) or broken: the cross-check is optional
        pytest.skip(f"transformers/torch not usable: {e}")
    import gguf

    from shaderlm.formats.gguf import _FastReader

    saved = (gguf.gguf_reader.GGUFReader._get, gguf.get_tensor_name_map)
    gguf.gguf_reader.GGUFReader._get = _FastReader._get
    gguf.gguf_reader.GGUFReader._plain = _FastReader._plain
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass

    def logits(path, ids, **config_kwargs):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32, **config_kwargs)
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0].numpy()

    yield logits
    gguf.gguf_reader.GGUFReader._get, gguf.get_tensor_name_map = saved
    del gguf.gguf_reader.GGUFReader._plain


@pytest.mark.parametrize("arch,quant", [("llama", "Q4_1"), ("llama", "Q8_0"), ("qwen2", "Q5_0"),
                                        ("qwen3", "F16"), ("gemma3", "Q4_0")])
def test_tiny_against_transformers(hf, synth_gguf, arch, quant):
    path = synth_gguf(preset="tiny", arch=arch, quant=quant)
    ids = list(range(3, 23))             # 20 tokens: longer than the gemma3 tiny sliding window (8)
    hd = load_reference(path).cfg.head_dim
    # transformers does not read these from GGUF: Qwen3's head_dim (it defaults to 128) and Gemma 3's
    # query_pre_attn_scalar (default 256, which equals head_dim in real Gemma 3 models)
    kwargs = {"qwen3": {"head_dim": hd}, "gemma3": {"query_pre_attn_scalar": hd}}.get(arch, {})
    ref = reference_logits(path, ids)
    diff = np.abs(hf(path, ids, **kwargs) - ref).max()
    assert diff < 1e-4, diff


SMOLLM2_PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 2]   # "<|im_start|>system\nYou are a helpful ..."


def test_smollm2_against_transformers(hf, smollm2_path):
    ref = reference_logits(smollm2_path, SMOLLM2_PROMPT)
    out = hf(smollm2_path, SMOLLM2_PROMPT)
    assert np.abs(out - ref).max() < 1e-3
    assert (out.argmax(-1) == ref.argmax(-1)).all()
