"""GPU dequantization of every supported GGUF type against gguf-py's reference dequantize.

Tolerance: bit-exact for F32, F16, BF16, Q8_0, Q4_0, Q5_0 and Q6_K (the GPU does the same f32
operations in the same order). Types with an offset term (Q4_1, Q5_1: d*q + m; Q4_K, Q5_K:
(d*sc)*q - dmin*mn) may be computed with a fused multiply-add by the shader compiler, so there the
difference may be up to 1 ulp of |x| + |offset| (the magnitude of the larger term before cancellation).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants as gq  # noqa: E402

from shaderlm.gpu import get_device  # noqa: E402
from shaderlm.kernels import KERNEL_DIR  # noqa: E402
from shaderlm.kernels.quants import QUANT_TYPES, gpu_layout, row_chunks  # noqa: E402
from shaderlm.kernels.weights import dequantize, upload_weight  # noqa: E402

ALL = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]
EXACT = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q6_K"}
# Byte offsets of the f16 scale fields in each block, and the byte range of the quants (for the
# offset-term trick below) for the types with x = scale*q + offset.
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
QUANT_BYTES = {"Q4_1": (4, 20), "Q5_1": (4, 24), "Q4_K": (16, 144), "Q5_K": (16, 176)}
QUANTIZABLE = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}  # gguf.quants.quantize

ROWS = [1, 3, 37, 129]


def cols_for(name: str) -> list[int]:
    qk = QUANT_TYPES[name].block_elems
    if qk == 256:
        return [256, 512]
    if qk == 32:
        return [32, 96, 160]
    return [8, 40, 264]


@pytest.fixture(scope="session")
def dev():
    return get_device()


def finite_f16(rng, n: int) -> np.ndarray:
    """Random finite f16 values over a wide range (normals of both signs, some subnormals, zeros)."""
    v = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 4, n))).astype(np.float16)
    sub = rng.random(n) < 0.05
    v[sub] = (rng.integers(-1023, 1024, sub.sum()) * 2.0 ** -24).astype(np.float16)
    v[rng.random(n) < 0.02] = 0
    return v


def random_bytes(name: str, rows: int, cols: int, rng) -> np.ndarray:
    """Raw GGUF bytes with every bit pattern possible in the quants and finite f16/f32 fields."""
    q = QUANT_TYPES[name]
    if name == "F32":
        bits = rng.integers(0, 2**32, rows * cols, dtype=np.uint64).astype(np.uint32)
        exp = (bits >> 23) & 0xFF
        bits = np.where(exp == 0xFF, bits & ~np.uint32(0x40000000), bits).astype(np.uint32)
        return bits.view(np.uint8).reshape(rows, -1)
    if name == "BF16":
        bits = rng.integers(0, 2**16, rows * cols, dtype=np.uint32).astype(np.uint16)
        bits = np.where(((bits >> 7) & 0xFF) == 0xFF, bits & np.uint16(0xBFFF), bits).astype(np.uint16)
        return bits.view(np.uint8).reshape(rows, -1)
    if name == "F16":
        bits = rng.integers(0, 2**16, rows * cols, dtype=np.uint32).astype(np.uint16)
        bits = np.where(((bits >> 10) & 0x1F) == 0x1F, bits & np.uint16(0xBFFF), bits).astype(np.uint16)
        return bits.view(np.uint8).reshape(rows, -1)
    nb = rows * cols // q.block_elems
    blocks = rng.integers(0, 256, (nb, q.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS[name]:
        blocks[:, off:off + 2] = finite_f16(rng, nb).view(np.uint8).reshape(nb, 2)
    return blocks.reshape(rows, -1)


def quantized_bytes(name: str, rows: int, cols: int, rng) -> np.ndarray:
    x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3.0, (rows, 1))).astype(np.float32)
    x[:, : cols // 8] += 0.5    # some blocks with a nonzero mean (exercises the min/offset paths)
    return np.ascontiguousarray(gq.quantize(x, GT[name])).view(np.uint8).reshape(rows, -1)


def reference(name: str, raw: np.ndarray, cols: int) -> np.ndarray:
    return np.asarray(gq.dequantize(raw, GT[name]), np.float32).reshape(raw.shape[0], cols)


def offset_term(name: str, raw: np.ndarray, cols: int) -> np.ndarray:
    """The additive term of each element (the reference with all quants zeroed), exactly."""
    q = QUANT_TYPES[name]
    a, b = QUANT_BYTES[name]
    blocks = raw.reshape(-1, q.block_bytes).copy()
    blocks[:, a:b] = 0
    return reference(name, blocks.reshape(raw.shape), cols)


def check(dev, name: str, raw: np.ndarray, rows: int, cols: int, max_binding=None):
    ref = reference(name, raw, cols)
    wt = upload_weight(dev, "t", name, (rows, cols), raw.reshape(-1), max_binding=max_binding)
    got = dequantize(dev, wt)
    assert got.shape == ref.shape
    assert np.isfinite(ref).all()
    if name in EXACT:
        bad = got.view(np.uint32) != ref.view(np.uint32)
    else:
        tol = np.spacing(np.abs(ref) + np.abs(offset_term(name, raw, cols)))
        bad = ~(np.abs(got.astype(np.float64) - ref) <= tol)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        pytest.fail(f"{name} {rows}x{cols}: {bad.sum()} of {bad.size} differ; first at [{r},{c}]: "
                    f"gpu {got[r, c]!r} ref {ref[r, c]!r}")
    return wt


@pytest.mark.parametrize("name", ALL)
def test_random_blocks(dev, name):
    rng = np.random.default_rng(sum(map(ord, name)))
    for rows in ROWS:
        for cols in cols_for(name):
            check(dev, name, random_bytes(name, rows, cols, rng), rows, cols)


@pytest.mark.parametrize("name", sorted(QUANTIZABLE))
def test_quantized_data(dev, name):
    rng = np.random.default_rng(1 + sum(map(ord, name)))
    for rows in (3, 37, 129):
        for cols in cols_for(name):
            check(dev, name, quantized_bytes(name, rows, cols, rng), rows, cols)


@pytest.mark.parametrize("name", ALL)
def test_split_into_chunks(dev, name):
    rng = np.random.default_rng(7 + sum(map(ord, name)))
    rows, cols = 37, cols_for(name)[-1]
    q = QUANT_TYPES[name]
    raw = random_bytes(name, rows, cols, rng)
    row_bytes = q.row_bytes(cols)
    wt = check(dev, name, raw, rows, cols, max_binding=row_bytes * 9)
    assert len(wt.chunks) == len(row_chunks(rows, row_bytes, row_bytes * 9)) == 5
    assert [c.row0 for c in wt.chunks] == [0, 8, 16, 24, 32]


@pytest.mark.parametrize("name", ALL)
def test_gpu_layout_is_permutation(name):
    q = QUANT_TYPES[name]
    rng = np.random.default_rng(3)
    for nb in (1, 2, 3, 5, 8):
        raw = rng.integers(0, 256, nb * q.block_bytes * (8 if q.block_elems == 1 else 1), dtype=np.uint8)
        out, dbase = gpu_layout(q, raw)
        assert out.dtype == np.uint8 and out.size == -(-raw.size // 4) * 4
        assert not out[raw.size:].any()
        if q.split is None:
            assert dbase == 0 and np.array_equal(out[:raw.size], raw)
            continue
        # Expected permutation: block i's bytes except [o, o+size) in order, then every block's field.
        bb, (o, size) = q.block_bytes, q.split
        main = [i * bb + k for i in range(nb) for k in range(bb) if not o <= k < o + size]
        ds = [i * bb + o + k for i in range(nb) for k in range(size)]
        perm = np.array(main + ds)
        assert sorted(perm) == list(range(raw.size))
        assert np.array_equal(out[:raw.size], raw[perm])
        assert dbase * 4 == len(main) and len(main) % 4 == 0


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K"])
def test_k4_header_regrouped(dev, name):
    """After upload, each Q4_K / Q5_K block header holds, where quant_common.wgsl's k4_pair and k4_dmin
    read them, the scales and mins gguf-py unpacks and the bits of d and dmin; the rest of the
    block is untouched. Split over several bindings, so every chunk's blocks are regrouped once."""
    q = QUANT_TYPES[name]
    rows, cols = 40, 512
    raw = np.random.default_rng(5).integers(0, 256, rows * q.row_bytes(cols), dtype=np.uint8)
    raw[:16] = 255                                           # every bit set, and
    raw[q.block_bytes:q.block_bytes + 16] = 0                # none
    wt = upload_weight(dev, "w", name, (rows, cols), raw, max_binding=q.row_bytes(cols) * 9)
    assert len(wt.chunks) == 5
    got = np.concatenate([dev.read(c.buffer, np.uint8)[:c.rows * q.row_bytes(cols)] for c in wt.chunks])
    blocks, gblocks = raw.reshape(-1, q.block_bytes), got.reshape(-1, q.block_bytes)
    assert np.array_equal(gblocks[:, 16:], blocks[:, 16:])
    words = gblocks[:, :16].copy().view("<u4").astype(np.int64)          # blocks x 4
    sc, mn = gq.Q4_K.get_scale_min(blocks[:, 4:16].copy())
    for p in range(4):
        w = words[:, p]
        assert np.array_equal(w & 63, sc[:, 2 * p]) and np.array_equal((w >> 8) & 63, sc[:, 2 * p + 1])
        assert np.array_equal((w >> 16) & 63, mn[:, 2 * p]) and np.array_equal((w >> 24) & 63, mn[:, 2 * p + 1])
    dm = (((words[:, 0] >> 6) & 0x03030303) | ((words[:, 1] >> 4) & 0x0C0C0C0C)
          | ((words[:, 2] >> 2) & 0x30303030) | (words[:, 3] & 0xC0C0C0C0))
    assert np.array_equal(dm, blocks[:, :4].copy().view("<u4")[:, 0])


def test_block_constants_match_layout():
    """QK / QW in each decoder agree with the types table and gpu_layout."""
    for name in ALL:
        q = QUANT_TYPES[name]
        src = (KERNEL_DIR / f"{q.kernel}.wgsl").read_text()
        qk = int(re.search(r"const QK: u32 = (\d+)u;", src).group(1))
        qw = int(re.search(r"const QW: u32 = (\d+)u;", src).group(1))
        assert qk == q.gpu_block_elems, name
        assert qw * 4 == q.row_bytes(qk) - (q.split[1] if q.split else 0), name
        assert Path(KERNEL_DIR / f"{q.kernel}.wgsl").exists()


_WGSL_BYTES = {"vec4<u32>": 16, "u32": 4, "f32": 4}


def test_wide_constants_match_table():
    """Each decoder's WIDE part (the decode GEMV's chunking) agrees with QuantType.wide: elements per
    wide block (WQK), chunks per block (CPB), and the bytes its CW struct (one chunk_load) holds."""
    for name in ALL:
        q = QUANT_TYPES[name]
        src = (KERNEL_DIR / f"{q.kernel}.wgsl").read_text()
        if "#if WIDE" not in src:
            assert q.wide is None, name
            continue
        wide = src[src.index("#if WIDE"):]
        for inc in re.findall(r"^#include (\S+)$", wide, re.M):       # F16 / BF16 share one part
            wide += (KERNEL_DIR / f"{inc}.wgsl").read_text()
        consts = dict(re.findall(r"const (\w+): u32 = (\w+?)u?;", wide))
        wqk = int(re.search(r"const QK: u32 = (\d+)u;", src).group(1)) if consts["WQK"] == "QK" \
            else int(consts["WQK"])
        fields = re.search(r"struct CW \{([^}]*)\}", wide).group(1)
        load = sum(_WGSL_BYTES[t.strip()] for t in re.findall(r":\s*([\w<>]+)", fields))
        assert q.wide == (wqk, int(consts["CPB"]), load), name
