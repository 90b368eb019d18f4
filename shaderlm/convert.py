"""Write a GGUF file from a Hugging Face checkpoint folder (llama.cpp's conventions), streaming: one
tensor, and of it a bounded chunk of rows, at a time, so memory stays small for any model size.

    shaderlm convert path/to/folder out.gguf --outtype F16|BF16|F32|Q8_0|Q4_K|auto

What llama.cpp's convert_hf_to_gguf.py does that matters to the numbers, done the same way here (each
architecture's file says what it needs: its keys in Args.write_gguf, its row order in to_gguf_rows):
llama's Q/K rows are permuted from HF's rotate_half pairs (i, i + d/2) to interleaved pairs (2i, 2i+1)
(the GGUF is read back with llama's "normal" RoPE); Gemma's norm weights are stored with the +1;
Llama 3.1 RoPE scaling becomes the rope_freqs tensor, Phi-3 LongRoPE the rope_factors_long/short
tensors and rope.scaling.attn_factor / original_context_length. The tokenizer is written for
byte-level BPE tokenizer.json files (GPT-2 / Llama 3 / Qwen / SmolLM kinds); others are refused.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import warnings

import numpy as np

import gguf
from gguf.constants import GGMLQuantizationType

from .errors import ShaderLMError, UnsupportedError
from .formats.gguf import write_tensor_data
from .formats.quantize import encode_rows, n_bytes, rows_f32, target_type
from .models.loading import open_model

__all__ = ["write_gguf", "permute_rows"]


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's rotate_half row order -> llama.cpp's interleaved one, per head: row (h, j, i)
    -> (h, i, j) for j in 0..1, i in 0..d/2."""
    shape = w.shape
    return w.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _bpe_pre_name(pre: dict | None) -> str:
    """llama.cpp's tokenizer.ggml.pre for a byte-level tokenizer.json pre-tokenizer."""
    from .formats.tokenizer import _GPT2, _LLAMA3, _QWEN2

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


def _tokenizer_kv(path: str, tok) -> dict:
    import json
    if tok.kind != "gpt2":
        raise UnsupportedError(f"{path}: writing a GGUF needs a byte-level BPE tokenizer.json; this one is "
                               f"SentencePiece-style (use llama.cpp's convert_hf_to_gguf.py)")
    with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    merges = (spec.get("model") or {}).get("merges") or []
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return {"tokens": tok.tokens, "types": tok.token_types, "merges": merges,
            "pre": _bpe_pre_name(spec.get("pre_tokenizer")), "bos": tok.bos_id, "eos": tok.eos_id,
            "pad": tok.pad_id, "add_bos": tok.add_bos, "template": tok.chat_template}


def write_gguf(folder, out: str | os.PathLike, outtype: str = "auto", progress=None) -> str:
    """Write a Hugging Face checkpoint folder as a GGUF file; return its path. outtype: F32, F16, BF16,
    Q8_0, Q4_K (matrices; see quantize.target_type), or auto (keep the checkpoint's float type)."""
    m = open_model(os.fspath(folder))
    out = os.fspath(out)
    a, args = m.arch.gguf_arch, m.args
    tok = _tokenizer_kv(m.path, m.tokenizer)
    w = gguf.GGUFWriter(out, a)
    w.add_type("model")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    args.write_gguf(w, a)
    if args.sliding_window and not any(f"{a}.attention.sliding_window" in kv for kv in w.kv_data):
        warnings.warn(f"{m.path}: sliding_window {args.sliding_window} is not written (llama.cpp's {a} "
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
    for name, t in m.source.tensors.items():
        qt = target_type(name, t.shape, outtype, t.type)
        plan.append((name, t, qt, n_bytes(t.shape, qt)))
    for name, t, qt, nb in plan:
        w.add_tensor_info(name, t.shape, np.dtype(np.float32), nb, raw_dtype=GGMLQuantizationType[qt])
    total = sum(p[3] for p in plan)

    def tensors():
        for name, t, qt, nb in plan:
            heads = m.arch.gguf_permuted_heads(name, args)
            if len(t.shape) == 1:
                vals = t.dequantize().astype(np.float32).reshape(-1) if t.type != "F32" else \
                    np.asarray(t.data, np.uint8).view(np.float32)
                chunks = [np.ascontiguousarray(permute_rows(vals, heads) if heads else vals).view(np.uint8)]
            else:
                read = rows_f32(t.source)
                if heads:                         # its rows move: read it whole
                    full = permute_rows(read(0, t.shape[0]).reshape(t.shape), heads)
                    read = lambda r0, r1, full=full: full[r0:r1]                       # noqa: E731
                chunks = encode_rows(read, math.prod(t.shape[:-1]), t.shape[-1], qt)
            yield name, nb, chunks
            m.source.release(t)                  # written: its pages can go

    try:
        write_tensor_data(w, tensors(), total, progress)
    finally:
        w.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="shaderlm convert",
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
