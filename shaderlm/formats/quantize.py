"""Float weights -> GGUF tensor types on the CPU, a bounded number of rows at a time.

Used when loading a Hugging Face folder with ``--quantize`` and when writing a GGUF from one.  Q8_0
(and BF16) come from gguf-py's ``gguf.quants.quantize``; gguf-py has no K-quant quantizer, so Q4_K is
done here: per 32-element sub-block a scale and a minimum from the sub-block's range, both quantized to
6 bits against the super-block's f16 ``d``/``dmin`` (llama.cpp's block_q4_K layout; its quantizer
searches scales more carefully, so its Q4_K is a little more accurate than this one).
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ..errors import UnsupportedError

__all__ = ["QUANTIZE_TYPES", "OUT_TYPES", "target_type", "quantize_rows", "encode_rows", "n_bytes", "rows_f32"]

QUANTIZE_TYPES = ("Q8_0", "Q4_K")                       # --quantize choices
OUT_TYPES = ("F32", "F16", "BF16") + QUANTIZE_TYPES     # what encode_rows can write
_CHUNK_BYTES = 32 << 20                                  # float32 rows converted at once


def n_bytes(shape, qtype: str) -> int:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    n = 1
    for d in shape:
        n *= int(d)
    return n // block * size


def target_type(name: str, shape: tuple[int, ...], qtype: str, src_type: str = "F32") -> str:
    """The type a tensor gets when a model is written or loaded as ``qtype`` (F32, F16, BF16, Q8_0,
    Q4_K, or "auto": keep the source's float type).  1-D tensors (norms, biases, RoPE factors) stay F32.
    A mixture of experts' router stays F32 (its top-k picks are sensitive), as do biases of any shape. Q4_K puts the token embedding and output head in Q8_0 (4 bits cost the most quality there) and
    falls back to Q8_0 for rows that are not a multiple of 256, and every quantized type to F16 for
    rows that are not a multiple of 32."""
    q = qtype.upper()
    if q not in OUT_TYPES and q != "AUTO":
        raise UnsupportedError(f"tensor type {qtype!r} is not supported here; use one of "
                               f"{', '.join(OUT_TYPES)}")
    # routers and biases (gpt-oss's experts' are 2-D) stay F32, as llama.cpp keeps them
    if len(shape) < 2 or ".ffn_gate_inp." in name or name.endswith(".bias"):
        return "F32"
    if q == "AUTO":
        return src_type if src_type in ("F32", "F16", "BF16") else "F16"
    if q in ("F32", "F16", "BF16"):
        return q
    cols = int(shape[-1])
    if q == "Q4_K":
        if name in ("token_embd.weight", "output.weight") or cols % 256:
            q = "Q8_0"
    if cols % 32:
        return "F16"
    return q


def _q4_k(x: np.ndarray) -> np.ndarray:
    """(rows, cols) float32, cols % 256 == 0 -> (rows, cols // 256 * 144) uint8 in block_q4_K layout."""
    rows, cols = x.shape
    nb = rows * cols // 256
    sub = x.reshape(nb, 8, 32).astype(np.float32)
    lo = np.minimum(sub.min(axis=2), 0.0)                      # (nb, 8): the minimum (<= 0)
    hi = sub.max(axis=2)
    scale = (hi - lo) / 15.0                                   # per sub-block step
    mins = -lo                                                 # >= 0, stored as dmin * m
    d = scale.max(axis=1) / 63.0                               # (nb,)
    dmin = mins.max(axis=1) / 63.0
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    d, dmin = d16.astype(np.float32), dmin16.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.rint(scale / d[:, None]), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.rint(mins / dmin[:, None]), 0).clip(0, 63).astype(np.uint8)
        step = d[:, None] * sc                                  # (nb, 8) effective step
        off = dmin[:, None] * m
        q = np.where(step[:, :, None] > 0, np.rint((sub + off[:, :, None]) / step[:, :, None]), 0)
    q = q.clip(0, 15).astype(np.uint8).reshape(nb, 4, 2, 32)   # groups of 64: low nibbles, high nibbles
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128)
    scales = np.empty((nb, 12), np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    out = np.empty((nb, 144), np.uint8)
    out[:, 0:2] = d16.view(np.uint8).reshape(nb, 2)
    out[:, 2:4] = dmin16.view(np.uint8).reshape(nb, 2)
    out[:, 4:16] = scales
    out[:, 16:144] = qs
    return out.reshape(rows, -1)


def quantize_rows(x: np.ndarray, qtype: str) -> np.ndarray:
    """float32 (rows, cols) -> uint8 (rows, row_bytes) of ``qtype``."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype == "F32":
        return x.view(np.uint8)
    if qtype == "F16":
        return x.astype(np.float16).view(np.uint8)
    if qtype == "Q4_K":
        return _q4_k(x)
    if qtype in ("BF16", "Q8_0"):
        return np.asarray(gguf.quants.quantize(x, GGMLQuantizationType[qtype]), dtype=np.uint8)
    raise UnsupportedError(f"quantizing to {qtype} is not supported (supported: {', '.join(OUT_TYPES)})")


def encode_rows(rows_f32, n_rows: int, row_len: int, qtype: str) -> Iterator[np.ndarray]:
    """Yield the bytes of ``qtype`` for a tensor of n_rows x row_len, a chunk of rows at a time.
    ``rows_f32(r0, r1)`` returns rows r0..r1 as float32 (from the memory map: only those pages are read)."""
    step = max(1, _CHUNK_BYTES // max(4 * row_len, 1))
    for r0 in range(0, n_rows, step):
        r1 = min(n_rows, r0 + step)
        yield quantize_rows(rows_f32(r0, r1).reshape(r1 - r0, row_len), qtype)


def rows_f32(st):
    """A function (r0, r1) -> float32 rows of a 2-D safetensors tensor (F32, F16 or BF16), read from the map."""
    cols = st.shape[-1] if st.shape else 1
    per = {"F32": 4, "F16": 2, "BF16": 2}[st.dtype]

    def rows(r0, r1):
        raw = st.data[r0 * cols * per: r1 * cols * per]
        if st.dtype == "F32":
            return raw.view(np.float32)
        if st.dtype == "F16":
            return raw.view(np.float16).astype(np.float32)
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return rows
