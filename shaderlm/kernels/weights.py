"""Weight matrices on the GPU in their compact GGUF form, split by rows where one binding can't hold
them, and the GPU passes that read or prepare them (dequantize, the Q4_K/Q5_K header regroup)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ModelFormatError
from . import pipeline
from .grid import ROW_WG, cdiv, grid_1d
from .quants import QuantType, gpu_layout, quant_type, row_chunks


@dataclass
class WeightChunk:
    buffer: object
    row0: int
    rows: int
    dbase: int      # word offset of the split f16 scale array in `buffer` (0 when the type has none)
    row_max: object = None      # max |W| of each row (the tensor-core GEMM's grid; row_max() makes it)


@dataclass
class GPUWeight:
    name: str
    qtype: QuantType
    rows: int                       # output features
    cols: int                       # input features (K)
    chunks: list = field(default_factory=list)
    nbytes: int = 0                 # bytes on the GPU (what a full pass over it reads)
    int8_x: bool = False            # the decode GEMV rounds x to int8 for it (int8 activations)
    x24: bool = True                # the decode GEMV may take x as 24-bit fixed point (exact; kernels/gemv.py)

    @property
    def shape(self):
        return (self.rows, self.cols)


def upload_weight(dev, name: str, type_name: str, shape, raw: np.ndarray, max_binding: int | None = None):
    """Upload a GGUF tensor (uint8 bytes, rows x cols in numpy order) in its compact form."""
    q = quant_type(type_name, name)
    rows, cols = (1, int(shape[0])) if len(shape) == 1 else (int(np.prod(shape[:-1])), int(shape[-1]))
    if cols % q.gpu_block_elems:
        raise ModelFormatError(f"tensor {name}: row length {cols} is not a multiple of the {q.name} "
                               f"block size {q.gpu_block_elems}")
    row_bytes = q.row_bytes(cols)
    if raw.size != rows * row_bytes:
        raise ModelFormatError(f"tensor {name}: {raw.size} bytes, expected {rows * row_bytes} for "
                               f"{q.name} {rows}x{cols}")
    w = GPUWeight(name, q, rows, cols)
    raw2 = raw.reshape(rows, row_bytes)
    for r0, n in row_chunks(rows, row_bytes, max_binding or dev.max_binding):
        data, dbase = gpu_layout(q, raw2[r0:r0 + n])
        buf = dev.upload(data, label=f"{name}[{r0}:{r0 + n}]")
        if q.k4_header:
            k4_regroup(dev, buf, n * row_bytes // q.block_bytes, q.block_bytes // 4)
        w.chunks.append(WeightChunk(buf, r0, n, dbase))
        w.nbytes += data.nbytes
    return w


def concat_rows(dev, name: str, parts, max_binding: int | None = None):
    """One weight from several with the same type and K stacked by rows (e.g. Q, K, V -> QKV)."""
    type_name, cols = parts[0][1], parts[0][2][-1]
    raw = np.concatenate([np.asarray(p[3]).reshape(-1) for p in parts])
    rows = sum(int(np.prod(p[2][:-1])) for p in parts)
    return upload_weight(dev, name, type_name, (rows, cols), raw, max_binding)


def k4_regroup(dev, buf, blocks: int, block_words: int):
    """Regroup the headers of the first `blocks` Q4_K / Q5_K blocks (block_words words each) of `buf`
    in place, as the decoders read them (k4_regroup.wgsl); once, at upload."""
    grid = grid_1d(dev, cdiv(blocks, 256))
    dev.run_once(pipeline(dev, "k4_regroup"), [dev.uniform(blocks, block_words, grid[0] * 256, 0), buf], grid)


def row_max(dev, weight: GPUWeight, chunk: WeightChunk):
    """A buffer of max |W[r]| for the chunk's rows (dequant.wgsl's ROW_MAX), made on first use."""
    if chunk.row_max is None:
        buf = dev.buffer(4 * chunk.rows, label=f"{weight.name}.row_max")
        pipe = pipeline(dev, "dequant", QUANT=weight.qtype.kernel, ROW_MAX=True, WG=ROW_WG)
        dev.run_once(pipe, [dev.uniform(weight.cols, chunk.rows, chunk.dbase, 0), chunk.buffer, buf],
                     grid_1d(dev, chunk.rows))
        chunk.row_max = buf
    return chunk.row_max


def dequantize(dev, weight: GPUWeight, raw8: bool = False) -> np.ndarray:
    """The f32 values of a GPUWeight, dequantized on the GPU (row-major rows x cols). `raw8`: through the
    type's 16-byte loads (QuantType.raw8), as the tensor-core GEMM reads it."""
    pipe = pipeline(dev, "dequant", QUANT=weight.qtype.kernel, W4=raw8)
    out = np.empty((weight.rows, weight.cols), np.float32)
    for c in weight.chunks:
        obuf = dev.buffer(c.rows * weight.cols * 4)
        dev.run_once(pipe, [dev.uniform(weight.cols, c.rows, c.dbase, 0), c.buffer, obuf],
                     grid_1d(dev, cdiv(c.rows * weight.cols // 8, 256)))
        out[c.row0:c.row0 + c.rows] = dev.read(obuf, np.float32).reshape(c.rows, weight.cols)
    return out
