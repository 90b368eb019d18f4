"""GGUF tensor types and their GPU layout.

Weights stay in their compact GGUF form on the GPU. The only change is alignment: one field of each
block (its scale, or scale and min, or Q5_1's scales and high bits) is moved to an array after the
blocks, so that the rest of every block starts on a word, and on 16 bytes wherever that is possible,
for the decode GEMV's vec4<u32> loads; no byte is added:
    [block 0 minus field][block 1 minus field]...[field 0][field 1]...
The WGSL decoders in kernels/quant/ read this layout; `dbase` (a kernel parameter) is the word
where the field array starts. (Fields need not fill whole words: MXFP4's are one byte, Q3_K's 14,
its scales and d, so its field b starts two bytes into a word for odd b.) Q4_K and Q5_K blocks also
have their 16-byte header's bits regrouped (`k4_header`), on the GPU right after upload
(kernels/k4_regroup.wgsl), again adding no byte.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UnsupportedError


@dataclass(frozen=True)
class QuantType:
    name: str
    block_elems: int          # elements per block (GGUF)
    block_bytes: int          # bytes per block (GGUF)
    split: tuple | None       # (byte offset, size) of the per-block field moved after the blocks, or None
    gpu_elems: int = 0        # elements per GPU "block" (F32/F16/BF16 use 8-element groups)
    # The decode GEMV's chunking (the WIDE part of the type's decoder, which tests check against this):
    # (elements per wide block, chunks per wide block, bytes one lane's chunk_load reads), or None
    wide: tuple | None = None
    int8_dot: bool = False    # the decoder has integer dots over x as digits: x24 or int8 (GPUs' default)
    k4_header: bool = False   # the block header's d, dmin and 6-bit scales are regrouped on the GPU
    iq8_min: bool = False     # iq8's m is not 0 (a min per run): the int8 GEMM adds m * sum(x) per run
    iq8_run: int = 32         # elements one (d, m) of iq8 covers: the int8 GEMM's x has a scale per run
    raw8: bool = False        # the decoder has raw8 / dq8_raw: weight loads of 16 bytes where w is vec4s (W4)
    raw8_int8: bool = False   # the int8 GEMMs take them too (where measured to win: docs/performance.md)
    raw32: bool = False       # the decoder has raw32 / dq32 (RAW32): matmul_few loads a run a trip ahead

    @property
    def kernel(self) -> str:
        return f"quant/{self.name.lower()}"

    @property
    def blocked(self) -> bool:
        """Quantized in blocks of 32 or more (the decoder has iq8, for the int8 prefill GEMM: one (d, m)
        per aligned run of iq8_run elements)."""
        return self.block_elems >= 32

    @property
    def gpu_block_elems(self) -> int:
        return self.gpu_elems or self.block_elems

    def row_bytes(self, k: int) -> int:
        return k // self.block_elems * self.block_bytes


QUANT_TYPES = {q.name: q for q in [
    QuantType("F32", 1, 4, None, gpu_elems=8, wide=(32, 1, 128)),
    QuantType("F16", 1, 2, None, gpu_elems=8, wide=(32, 1, 64)),
    QuantType("BF16", 1, 2, None, gpu_elems=8, wide=(32, 1, 64)),
    QuantType("Q8_0", 32, 34, (0, 2), wide=(32, 1, 36), int8_dot=True, raw8=True),  # d          -> 32-byte blocks
    QuantType("Q4_0", 32, 18, (0, 2), wide=(32, 1, 20), int8_dot=True, raw8=True),   # d      -> 16
    QuantType("Q4_1", 32, 20, (0, 4), wide=(32, 1, 20), int8_dot=True, iq8_min=True,
              raw8=True),                                                               # d, m         -> 16
    QuantType("Q5_0", 32, 22, (0, 2), wide=(32, 1, 36)),                      # d            -> 20 (word aligned only)
    QuantType("Q5_1", 32, 24, (0, 8), wide=(32, 1, 24), iq8_min=True),         # d, m, qh     -> 16
    QuantType("Q4_K", 256, 144, None, wide=(256, 8, 32), int8_dot=True, k4_header=True, iq8_min=True,
              raw8=True, raw8_int8=True, raw32=True),                                   # 144 = 9 x 16
    QuantType("Q5_K", 256, 176, None, wide=(256, 8, 48), k4_header=True, iq8_min=True,
              raw8=True),                                                               # 176 = 11 x 16
    QuantType("Q6_K", 256, 210, (208, 2), wide=(256, 4, 68), int8_dot=True, iq8_run=16,
              raw8=True, raw32=True),                                                   # d -> 208 = 13 x 16
    QuantType("Q2_K", 256, 84, (80, 4), wide=(256, 4, 36), int8_dot=True, iq8_min=True, iq8_run=16),  # d, dmin -> 80
    QuantType("Q3_K", 256, 110, (96, 14), wide=(256, 4, 52), int8_dot=True, iq8_run=16),  # scales, d    -> 96 = 6 x 16
    QuantType("IQ4_NL", 32, 18, (0, 2), wide=(32, 1, 20), int8_dot=True),     # d            -> 16
    QuantType("IQ4_XS", 256, 136, (0, 8), wide=(256, 8, 24), int8_dot=True),  # d, scales    -> 128 = 8 x 16
    QuantType("MXFP4", 32, 17, (0, 1), wide=(32, 1, 20), int8_dot=True),      # e (E8M0)     -> 16
]}


def quant_type(name: str, tensor: str = "") -> QuantType:
    q = QUANT_TYPES.get(name)
    if q is None:
        where = f" (tensor {tensor})" if tensor else ""
        raise UnsupportedError(f"tensor type {name}{where} is not supported; supported: "
                               + ", ".join(QUANT_TYPES))
    return q


def gpu_layout(q: QuantType, raw: np.ndarray) -> tuple[np.ndarray, int]:
    """GGUF bytes of whole blocks -> (uint8 bytes for the GPU, word index of the field array or 0)."""
    raw = np.ascontiguousarray(raw).reshape(-1)
    if q.split is None:
        return raw, 0
    blocks = raw.reshape(-1, q.block_bytes)
    o, size = q.split
    main = np.concatenate([blocks[:, :o], blocks[:, o + size:]], axis=1)
    d = blocks[:, o:o + size]
    out = np.concatenate([main.reshape(-1), d.reshape(-1), np.zeros(-d.size % 4, np.uint8)])
    return out, main.size // 4


def row_chunks(n_rows: int, row_bytes: int, max_bytes: int) -> list[tuple[int, int]]:
    """Split rows into (first_row, n) pieces whose bytes fit one storage binding."""
    per = max(1, max_bytes // max(row_bytes, 1))
    if per >= n_rows:
        return [(0, n_rows)]
    per = max(1, per // 8 * 8)   # keep pieces a multiple of 8 rows (workgroup row tiles)
    return [(r, min(per, n_rows - r)) for r in range(0, n_rows, per)]
