"""Write a GGUF file from a Hugging Face checkpoint folder (llama.cpp's conventions), streaming: one
tensor, and of it a bounded chunk of rows, at a time, so memory stays small for any model size.

    python -m shaderlm.formats.convert path/to/folder out.gguf --outtype F16|BF16|F32|Q8_0|Q4_K|auto

What llama.cpp's convert_hf_to_gguf.py does that matters to the numbers, done the same way here:
llama's Q/K rows are permuted from HF's rotate_half pairs (i, i + d/2) to interleaved pairs (2i, 2i+1)
(the GGUF is read back with llama's "normal" RoPE); Gemma's norm weights are stored with the +1;
Llama 3.1 RoPE scaling becomes the rope_freqs tensor, Phi-3 LongRoPE the rope_factors_long/short
tensors and rope.scaling.attn_factor / original_context_length.  The tokenizer is written for
byte-level BPE tokenizer.json files (GPT-2 / Llama 3 / Qwen / SmolLM kinds); others are refused.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

import gguf
from gguf.constants import GGMLQuantizationType

from ..errors import ShaderLMError, UnsupportedError
from .hf import HFCheckpoint, _rows_f32
from .gguf import write_tensor_data
from .quantize import encode_rows, n_bytes, target_type

__all__ = ["write_gguf", "permute_llama_rows"]


def permute_llama_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate_half layout -> llama.cpp's interleaved layout (rows of each head reordered: row
    (h, j, i) -> (h, i, j) for j in 0..1, i in 0..d/2)."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _bpe_pre_name(pre: dict | None) -> str:
    """llama.cpp's tokenizer.ggml.pre for a byte-level tokenizer.json pre-tokenizer."""
    from .tokenizer import _GPT2, _LLAMA3, _QWEN2

    def parts(node):
        if not isinstance(node, dict):
            return []
        if node.get("type") == "Sequence":
            return [x for p in node.get("pretokenizers") or [] for x in parts(p)]
        return [node]

    ps = parts(pre)
    regexes = [((p.get("pattern") or {}).get("Regex") or (p.get("pattern") or {}).get("String")) for p in ps
               if p.get("type") == "Split"]
    digits = any(p.get("type") == "Digits" and p.get("individual_digits") for p in ps)
    bytelevel_regex = any(p.get("type") == "ByteLevel" and p.get("use_regex", True) for p in ps)
    if regexes:
        r = regexes[0]
        if r == _LLAMA3:
            return "llama-bpe"
        if r == _QWEN2:
            return "qwen2"
        if r == _GPT2:
            return "smollm" if digits else "gpt2"
        if "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in r and r"\p{N}{1,3}" in r:
            return "llama-bpe"
        if "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in r and r"\p{N}" in r:
            return "qwen2"
    if bytelevel_regex:
        return "smollm" if digits else "gpt2"
    warnings.warn("tokenizer.json pre-tokenizer not recognised: writing tokenizer.ggml.pre = 'gpt2'", stacklevel=3)
    return "gpt2"


def _tokenizer_kv(ck: HFCheckpoint) -> dict:
    import json
    tok = ck.tokenizer()
    if tok.kind != "gpt2":
        raise UnsupportedError(f"{ck.path}: writing a GGUF needs a byte-level BPE tokenizer.json; this one is "
                               f"SentencePiece-style (use llama.cpp's convert_hf_to_gguf.py)")
    with open(os.path.join(ck.path, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    merges = (spec.get("model") or {}).get("merges") or []
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return {"tokens": tok.tokens, "types": tok.token_types, "merges": merges,
            "pre": _bpe_pre_name(spec.get("pre_tokenizer")), "bos": tok.bos_id, "eos": tok.eos_id,
            "pad": tok.pad_id, "add_bos": tok.add_bos, "template": tok.chat_template}


def write_gguf(src, out: str | os.PathLike, outtype: str = "auto", progress=None) -> str:
    """Write the checkpoint (an HFCheckpoint or a folder path) as a GGUF file; return its path.
    outtype: F32, F16, BF16, Q8_0, Q4_K (matrices; see quantize.target_type), or auto (keep the
    checkpoint's float type)."""
    ck = src if isinstance(src, HFCheckpoint) else HFCheckpoint(src)
    if ck.quantize:
        raise ShaderLMError("write_gguf: open the checkpoint without quantize (pass outtype instead)")
    out = os.fspath(out)
    cfg = ck.config()
    a, ex = cfg.arch, cfg.extra
    tok = _tokenizer_kv(ck)

    w = gguf.GGUFWriter(out, a)
    w.add_name(cfg.name)
    w.add_type("model")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.dim)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.rope_dim)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_vocab_size(cfg.vocab_size)
    if cfg.rope_scale != 1.0:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(cfg.rope_scale)
    if a == "gemma3":
        if ex.get("rope_base_local", 10000.0) != 10000.0:
            raise UnsupportedError(f"{ck.path}: Gemma 3 local RoPE base {ex['rope_base_local']} has no GGUF key "
                                   f"(llama.cpp uses 10000)")
        want = 1.0 / np.sqrt(cfg.dim / cfg.n_heads if cfg.n_layers == 62 else cfg.head_dim)
        if abs(ex["attn_scale"] - want) > 1e-9 * want:
            raise UnsupportedError(f"{ck.path}: query_pre_attn_scalar {ex['attn_scale'] ** -2:g} is not what "
                                   f"llama.cpp derives for this shape")
        if ex.get("sliding_window"):
            w.add_sliding_window(int(ex["sliding_window"]))
            swa = ex["swa_layers"]
            if swa != [(i % 6) < 5 for i in range(cfg.n_layers)]:
                w.add_array(f"{a}.attention.sliding_window_pattern", [bool(x) for x in swa])
        if ex.get("final_logit_softcap"):
            w.add_final_logit_softcapping(ex["final_logit_softcap"])
        if ex.get("attn_logit_softcap"):
            w.add_attn_logit_softcapping(ex["attn_logit_softcap"])
    elif a == "phi3":
        if ex.get("sliding_window"):
            w.add_sliding_window(int(ex["sliding_window"]))
        sc = ex.get("rope_scaling")
        if sc:
            w.add_rope_scaling_attn_factors(float(sc["attn_factor"]))
            w.add_rope_scaling_orig_ctx_len(int(sc["original_context_length"]))
    elif ex.get("sliding_window"):
        warnings.warn(f"{ck.path}: sliding_window {ex['sliding_window']} is not written (llama.cpp's {a} "
                      f"attends to the whole context)", stacklevel=2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok["pre"])
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    for key, fn in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
        if tok[key] is not None:
            fn(int(tok[key]))
    w.add_add_bos_token(bool(tok["add_bos"]))
    if tok["template"]:
        w.add_chat_template(tok["template"])

    plan = []
    for name, t in ck.tensors.items():
        qt = target_type(name, t.shape, outtype, t.type)
        plan.append((name, t, qt, n_bytes(t.shape, qt)))
    for name, t, qt, nb in plan:
        w.add_tensor_info(name, t.shape, np.dtype(np.float32), nb, raw_dtype=GGMLQuantizationType[qt])
    total = sum(p[3] for p in plan)
    permute = {"attn_q": cfg.n_heads, "attn_k": cfg.n_kv_heads} if a == "llama" else {}
    def tensors():
        for name, t, qt, nb in plan:
            role = name.split(".")[-2] if name.startswith("blk.") else ""
            if len(t.shape) == 1 and qt == "F32" and t.type == "F32":
                chunks = [np.asarray(t.data, np.uint8).reshape(-1)]
                if role in permute:
                    chunks = [permute_llama_rows(chunks[0].view(np.float32), permute[role]).view(np.uint8)]
            elif len(t.shape) == 1:
                chunks = [t.dequantize().astype(np.float32).reshape(-1)]
                if role in permute:
                    chunks = [permute_llama_rows(chunks[0], permute[role])]
                chunks = [chunks[0].view(np.uint8)]
            else:
                rows_f32 = _rows_f32(t.source[1])
                if role in permute:
                    full = permute_llama_rows(rows_f32(0, t.shape[0]).reshape(t.shape), permute[role])
                    rows_f32 = lambda r0, r1, full=full: full[r0:r1]                       # noqa: E731
                chunks = encode_rows(rows_f32, t.shape[0], t.shape[1], qt)
            yield name, nb, chunks
            if t.source is not None:        # written: its pages can go
                ck.release(t)

    try:
        write_tensor_data(w, tensors(), total, progress)
    finally:
        w.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m shaderlm.formats.convert",
                                description="Write a GGUF from a Hugging Face checkpoint folder.")
    p.add_argument("folder")
    p.add_argument("out")
    p.add_argument("--outtype", default="auto", help="F32, F16, BF16, Q8_0, Q4_K or auto (default)")
    args = p.parse_args(argv)
    try:
        write_gguf(args.folder, args.out, args.outtype)
    except ShaderLMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({os.path.getsize(args.out):,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
