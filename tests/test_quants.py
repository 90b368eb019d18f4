"""GPU dequantization of every supported GGUF type against gguf-py's reference dequantize.

Tolerance: bit-exact for F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS and
MXFP4 (the GPU does the same f32 operations in the same order; Q2_K's (d*sc)*q is exact, so a fused
multiply-add rounds d*sc*q - dmin*mn as the reference does). Types with an offset term (Q4_1, Q5_1: d*q + m; Q4_K, Q5_K:
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

import shaderlm  # noqa: E402
from shaderlm.gpu import get_device  # noqa: E402
from shaderlm.gpu.plan import Plan  # noqa: E402
from shaderlm.kernels import KERNEL_DIR, gemv, ops  # noqa: E402
from shaderlm.kernels.quants import QUANT_TYPES, gpu_layout, row_chunks  # noqa: E402
from shaderlm.kernels.weights import dequantize, upload_weight  # noqa: E402
from shaderlm.synth import resolve, tensor_plan  # noqa: E402

try:
    from neartie import first_divergence
    from reference import reference_logits
    from synth_models import check_logits, logit_tol, random_ids
    from test_kernels import assert_close, q8_rounded
except ImportError:  # tests/ imported as a package
    from tests.neartie import first_divergence
    from tests.reference import reference_logits
    from tests.synth_models import check_logits, logit_tol, random_ids
    from tests.test_kernels import assert_close, q8_rounded

NEW = ["Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
ALL = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"] + NEW
EXACT = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q6_K"} | set(NEW)
# Byte offsets of the f16 scale fields in each block (and MXFP4's E8M0 byte), and the byte range of
# the quants (for the offset-term trick below) for the types with x = scale*q + offset.
F16_FIELDS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
              "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q2_K": [80, 82], "Q3_K": [108],
              "IQ4_NL": [0], "IQ4_XS": [0]}
E8M0_FIELDS = {"MXFP4": [0]}
QUANT_BYTES = {"Q4_1": (4, 20), "Q5_1": (4, 24), "Q4_K": (16, 144), "Q5_K": (16, 176)}
QUANTIZABLE = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4"}  # gguf.quants.quantize

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
    for off in F16_FIELDS.get(name, []):
        blocks[:, off:off + 2] = finite_f16(rng, nb).view(np.uint8).reshape(nb, 2)
    for off in E8M0_FIELDS.get(name, []):      # 2^-100 .. 2^100: the normal range, far from overflow
        blocks[:, off] = rng.integers(28, 229, nb)
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


def check(dev, name: str, raw: np.ndarray, rows: int, cols: int, max_binding=None, raw8=False):
    ref = reference(name, raw, cols)
    wt = upload_weight(dev, "t", name, (rows, cols), raw.reshape(-1), max_binding=max_binding)
    got = dequantize(dev, wt, raw8=raw8)
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


@pytest.mark.parametrize("name", [n for n in ALL if QUANT_TYPES[n].raw8])
def test_raw8_loads_decode_the_same(dev, name):
    """The tensor-core GEMM's loads of a type (raw8 / dq8_raw: w as vec4s, W4) decode every element as
    gguf-py does, in blocks of every position and across a binding's chunks."""
    rng = np.random.default_rng(11 + sum(map(ord, name)))
    for rows in ROWS:
        for cols in cols_for(name):
            check(dev, name, random_bytes(name, rows, cols, rng), rows, cols, raw8=True)
    rows, cols = 37, cols_for(name)[-1]
    row_bytes = QUANT_TYPES[name].row_bytes(cols)
    check(dev, name, random_bytes(name, rows, cols, rng), rows, cols, max_binding=row_bytes * 9, raw8=True)


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


def _with_includes(name: str) -> str:
    """A decoder's text with the files it includes (a shared part: quant/table4_32) inlined."""
    return re.sub(r"^#include (\S+)$", lambda m: _with_includes(m.group(1)),
                  (KERNEL_DIR / f"{name}.wgsl").read_text(), flags=re.M)


def test_wide_constants_match_table():
    """Each decoder's WIDE part (the decode GEMV's chunking) agrees with QuantType.wide: elements per
    wide block (WQK), chunks per block (CPB), and the bytes its CW struct (one chunk_load) holds."""
    for name in ALL:
        q = QUANT_TYPES[name]
        src = _with_includes(q.kernel)
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


def test_raw8_declared_where_the_table_says():
    """QuantType.raw8 (the GEMMs bind w as vec4s, W4) exactly where the decoder defines raw8 and dq8_raw
    under W4: a type marked without them would not compile, one unmarked would keep its 4-byte loads."""
    for name in ALL:
        q = QUANT_TYPES[name]
        src = _with_includes(q.kernel)
        has = "#if W4" in src and all(f"fn {f}(" in src[src.index("#if W4"):] for f in ("raw8", "dq8_raw"))
        assert q.raw8 == has, name


# ---- matrix products over the types added with the low-bit mixes ---------------------------------
# Against float64 products of gguf-py's dequantized weights (as tests/test_kernels.py's matmul tests):
# f32 paths within 1e-5 * sum |W x| (summation order), the int8 GEMM on x as it rounds it (per 16 values,
# max|x| / 127) plus a rounding step where a tie may go either way, the decode GEMV's x24 within 2^-21 of
# sum |W| * max |x| over each 16-element run and its int8 x as the int8 GEMM's.
MM_RTOL = 1e-5
# name -> (ops.matmul arguments, the kernel it must pick)
MM_PATHS = {
    "generic": (dict(tt=1, from_state_row=True), "matmul"),      # matmul.wgsl (the GEMV takes no state row)
    "generic_tt8": (dict(tt=8, tiled=False), "matmul"),
    "tiled": (dict(tt=8), "matmul_tiled"),
    "int8": (dict(tt=70, int8=True), "matmul_q8"),              # tt: the tokens its scratch holds
}


def moderate_weight(name: str, rows: int, cols: int, rng):
    """Random valid blocks with scales of either sign around 0.002-0.02 (MXFP4: 2^-8 .. 2^-5) and their
    values (gguf-py, float64)."""
    raw = random_bytes(name, rows, cols, rng)
    blocks = raw.reshape(-1, QUANT_TYPES[name].block_bytes)
    nb = blocks.shape[0]
    for off in F16_FIELDS.get(name, []):
        d = (rng.uniform(0.002, 0.02, nb) * rng.choice([-1, 1], nb)).astype(np.float16)
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    for off in E8M0_FIELDS.get(name, []):
        blocks[:, off] = rng.integers(120, 124, nb)
    return raw, reference(name, raw, cols).astype(np.float64)


def run_into(dev, ds, n: int, yb, shape):
    Plan(dev, ds).run(n)
    return dev.read(yb, np.float32)[:int(np.prod(shape))].reshape(shape)


@pytest.mark.parametrize("path", list(MM_PATHS))
@pytest.mark.parametrize("name", NEW)
def test_matmul_new_types(dev, name, path):
    """Each new type through the generic matmul (one token without the decode GEMV, and 8 a pass), the
    tiled f32 GEMM and the int8 GEMM: odd rows, several blocks of K, partial token tiles."""
    kw, kernel = MM_PATHS[path]
    rng = np.random.default_rng(NEW.index(name) * 10 + len(path))
    rows, K, n = 37, cols_for(name)[-1], 5 if kw["tt"] == 1 else 70
    raw, W = moderate_weight(name, rows, K, rng)
    w = upload_weight(dev, "w", name, (rows, K), raw.reshape(-1))
    x = rng.standard_normal((n, K)).astype(np.float32)
    x[0, :16] = 0                                        # a run of zeros: the int8 GEMM's scale 0
    yb = dev.upload(np.full((n + 1, rows), np.nan, np.float32))
    st = dev.upload(np.array([11, n, 3, 0, 0, 0, 0, 0], np.uint32))
    ds = ops.matmul(dev, w, dev.upload(x), yb, st, y_stride=rows, **kw)
    assert ds[-1].label == f"{kernel}.{name}"
    got = run_into(dev, ds, n, yb, (n + 1, rows))
    xr, slack = q8_rounded(x, QUANT_TYPES[name].iq8_run) if kw.get("int8") else (x.astype(np.float64), 0 * x)
    tol = slack @ np.abs(W).T + MM_RTOL * (np.abs(xr) @ np.abs(W).T) + 1e-30
    assert_close(got[:n], xr @ W.T, tol, f"{path} {name} {rows}x{K} n={n}")
    assert np.isnan(got[n]).all()


def int8_rounded(x):
    """x as the int8-activation GEMV takes it: per 16 values, int8 with d = max|x| / 127 (f32 arithmetic);
    the rounded x and d per element (float64)."""
    g = x.astype(np.float32).reshape(-1, 16)
    amax = np.abs(g).max(axis=1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    d = (amax / 127).astype(np.float64)
    return (np.round(g * inv) * d).reshape(x.shape), d.repeat(16, 1).reshape(x.shape)


WIDE_NEW = [q for q in NEW if QUANT_TYPES[q].wide]


@pytest.mark.parametrize("name", WIDE_NEW)
def test_gemv_new_types(dev, name):
    """The decode GEMV over each new type with a WIDE decoder: x as f32 and as 24-bit fixed point (x24),
    2 chunk steps a trip, several row groups a workgroup (HOIST), and int8 x (--int8-act)."""
    rng = np.random.default_rng(40 + NEW.index(name))
    rows, K = 37, 2 * cols_for(name)[-1]
    raw, W = moderate_weight(name, rows, K, rng)
    w = upload_weight(dev, "w", name, (rows, K), raw.reshape(-1))
    assert w.qtype.int8_dot
    x = (rng.standard_normal((1, K)) * 2 + 0.3).astype(np.float32)
    x[0, 16:32] *= 1e-3                                   # a run much smaller than the rest
    xb, yb = dev.upload(x), dev.upload(np.full((2, rows), np.nan, np.float32))
    ds = gemv.gemv(dev, w, xb, yb, y_stride=rows)
    assert [d.label for d in ds] == [f"gemv.{name}"]
    xe = x.astype(np.float64)
    run_max = np.repeat(np.abs(xe).reshape(-1, 16).max(axis=1), 16)[None]
    ref, tol = xe @ W.T, 2.0 ** -21 * (run_max @ np.abs(W).T) + 1e-30
    lanes = max(32, dev.subgroup_size or 1)
    base = tuple(ds[0].tune.candidates()[0][:4])
    got = {}
    for shape in [base + (0,), base + (1,), (lanes, 3, 2, 1, 1), (lanes, 2, 1, 3, 1, 0, 1)]:
        dev.write(yb, np.full((2, rows), np.nan, np.float32))
        got[shape] = run_into(dev, ds[0].tune.rebuild(shape), 1, yb, (2, rows))
        assert_close(got[shape][:1], ref, tol, f"gemv {name} shape {shape}")
        assert np.isnan(got[shape][1]).all()
    assert (got[base + (0,)] != got[base + (1,)]).any()   # x24 is not the f32 kernel
    w.int8_x = True
    ds = gemv.gemv(dev, w, xb, yb, y_stride=rows)
    assert "int8x" in ds[0].tune.key
    got = run_into(dev, ds, 1, yb, (2, rows))
    xq, d = int8_rounded(x)
    tol = 2 * MM_RTOL * (np.abs(xq) @ np.abs(W).T) + 1.01 * (d @ np.abs(W).T) / K * 2 + 1e-30
    assert_close(got[:1], xq @ W.T, tol, f"gemv {name} int8 x")


@pytest.mark.parametrize("qa,qb", [("Q2_K", "Q3_K"), ("IQ4_XS", "MXFP4")])
def test_gemv_pair_new_types(dev, qa, qb):
    """Two new types in one decode GEMV (gemv.wgsl DUAL, the second decoder's names prefixed; Q2_K's Q
    and K with its Q3_K V), with the folded RMSNorm."""
    rng = np.random.default_rng(len(qa + qb))
    K, ra, rb, eps = 512, 37, 11, 1e-5
    (raw_a, Wa), (raw_b, Wb) = moderate_weight(qa, ra, K, rng), moderate_weight(qb, rb, K, rng)
    wa, wb = (upload_weight(dev, q, q, (r, K), raw.reshape(-1)) for q, r, raw in ((qa, ra, raw_a), (qb, rb, raw_b)))
    x = (rng.standard_normal((1, K)) * 2 + 0.3).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    yb = dev.upload(np.full((2, ra + rb), np.nan, np.float32))
    ds = gemv.gemv_pair(dev, wa, wb, dev.upload(x), yb, y_stride=ra + rb, norm=dev.upload(nw), eps=eps)
    got = run_into(dev, ds, 1, yb, (2, ra + rb))
    xe = x.astype(np.float64)
    xin = xe / np.sqrt(np.mean(xe * xe) + eps) * nw
    W = np.concatenate([Wa, Wb])
    assert_close(got[:1], xin @ W.T, 2 * MM_RTOL * (np.abs(xin) @ np.abs(W).T) + 1e-30, f"gemv_pair {qa}+{qb}")
    assert np.isnan(got[1]).all()


# ---- whole models ---------------------------------------------------------------------------------
# llama.cpp's low-bit mixes on the K-quant test shapes, and the 32-element types on every matrix
MODELS = {"Q2_K": "tiny-k", "Q3_K_M": "tiny-k", "IQ4_XS": "tiny-k", "IQ4_NL": "tiny", "MXFP4": "tiny"}
MODEL_TYPES = {"Q2_K": {"Q2_K", "Q3_K", "Q6_K"}, "Q3_K_M": {"Q3_K", "Q4_K", "Q5_K", "Q6_K"},
               "IQ4_XS": {"IQ4_XS", "Q6_K"}, "IQ4_NL": {"IQ4_NL", "Q8_0"}, "MXFP4": {"MXFP4", "Q8_0"}}


@pytest.mark.parametrize("quant", list(MODELS))
def test_model_in_new_types(synth_gguf, quant):
    """A tiny synthetic llama in each new mix (or type) loads and matches the NumPy reference: prefill
    logits, and greedy decode teacher-forced (the fused decode step: the decode GEMVs of every new type
    in it, Q2_K's Q+K with its Q3_K V in one GEMV, folded norms and gate/up activations)."""
    plan = tensor_plan(resolve(MODELS[quant], "llama"), quant, None)
    assert {t for _, shape, t in plan if len(shape) == 2} == MODEL_TYPES[quant]
    path = synth_gguf(seed=1, preset=MODELS[quant], arch="llama", quant=quant)
    m = shaderlm.load(path, progress=False, fuse=True)
    gemvs = " ".join(d.label for d in m.net.plan_decode.dispatches if d.label.startswith("gemv."))
    assert all(re.search(rf"\b{t}\b", gemvs) for t in MODEL_TYPES[quant] & set(NEW)), gemvs
    check_logits(path, m, quant, n=13)
    prompt = random_ids(m.config.vocab_size, 5, 2)      # a prompt without near-ties in 8 steps
    got = m.generate_tokens(prompt, 8, temperature=0.0, stop_at_eos=False)
    ref = reference_logits(path, prompt + got)[len(prompt) - 1:-1]
    top2 = np.sort(ref, axis=1)[:, -2:]
    bad = first_divergence(ref.argmax(axis=1).tolist(), (top2[:, 1] - top2[:, 0]).tolist(), got, logit_tol(ref))
    assert bad is None, bad
