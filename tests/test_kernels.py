"""Every forward-pass kernel (shaderlm/kernels/ops.py) against an independent float64 NumPy reference,
on random data with awkward sizes (row counts, dims and token counts that are not multiples of the
workgroup or tile sizes), on the default device and on one without subgroups (workgroup-memory
reductions).

Tolerances (worst measured error / tolerance on lavapipe in brackets; failures print the worst offender):
  matmul      |y - ref| <= 1e-5 * (sum_k |W[r,k] x[t,k]| + |y_old| + |bias|)   (f32 accumulation in any
              order; W from gguf-py's dequantize, exact f32) [0.04]. Fused decode variants (RMSNorm of x,
              gated activation): twice that, propagated through the norm / activation [0.003].
  rmsnorm     |y - ref| <= 1e-5 * |ref|                                            [0.02]
  embed       |x - ref| <= 2^-22 * (|ref| + max|row|) * scale: the scale multiply and a possible FMA in
              the dequantization (d*q + m)                                         [0.11]
  rope_store  angle error: the f32 turns product and the f32 inv_freq cost <= 2.4e-7 * pos rad, sin/cos
              4e-6: |q' - ref| <= |pair| * (2.4e-7 * pos + 4e-6) [0.30]; cache values: that + 1 f16 ulp
              (f32 -> f16 may round either way) [0.50: round to nearest]; untouched words bit-exact.
  attention   K/V are f16 values the test writes (the reference uses the same values), so only f32
              arithmetic differs: |o - ref| <= 2e-5 * max|V| [0.02]. Fused RoPE: plus the bound of q's
              rotation error through the scores.
  glu         |o - ref| <= 1e-5 * |ref| + 1e-6 * |g * u|                           [0.06]
  sample      exact: argmax (lowest id on ties), membership in the top-k set and top-p nucleus, state
              advance. Distributions: 200 draws per setting (2 fixed seeds x 100 consecutive positions,
              one submit each; deterministic, so it cannot flake): every token's empirical frequency
              within 4.5 sigma + 0.01 of the restricted, renormalized softmax (sigma = sqrt(p(1-p)/200))
              and a chi-square (cells with >= 5 expected) below dof + 8 sqrt(2 dof) + 10.
  logprobs    the most likely ids exact (value, then lowest id); log-probabilities within 1e-4 of float64's
              (f32 exp and sum over 40,001 logits).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf import quants as gq  # noqa: E402

from shaderlm.gpu.device import UNIFORM, Device, get_device, pack_params  # noqa: E402
from shaderlm.gpu.plan import Plan  # noqa: E402
from shaderlm.kernels import gemm, gemv, ops  # noqa: E402
from shaderlm.kernels.quants import QUANT_TYPES  # noqa: E402
from shaderlm.kernels.weights import upload_weight  # noqa: E402

POISON = np.uint32(0x7FC0DEAD)          # a NaN with a payload: "never written"
CACHE_POISON = np.uint32(0xDEADBEEF)    # two finite halves, compared bit for bit


# ---- devices -------------------------------------------------------------------------------------
@pytest.fixture(scope="session", params=["default", "no_subgroups"])
def dev(request):
    if request.param == "default":
        return get_device()
    d = Device(subgroups=False)
    assert not d.has_subgroups
    return d


# ---- helpers -------------------------------------------------------------------------------------
def state(dev, pos=0, n=1, tok=0, out_row0=0):
    return dev.upload(np.array([pos, n, tok, out_row0, 0, 0, 0, 0], np.uint32))


def run(dev, dispatches, n, repeat=1):
    ds = dispatches if isinstance(dispatches, list) else [dispatches]
    Plan(dev, ds).run(n, repeat=repeat)


def poisoned(shape) -> np.ndarray:
    return np.full(shape, POISON, np.uint32).view(np.float32)


def read_f32(dev, buf, shape):
    return dev.read(buf, np.float32)[: int(np.prod(shape))].reshape(shape)


def is_poison(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32) == POISON


def assert_close(got, ref, tol, what):
    got = np.asarray(got, np.float64)
    err = np.abs(got - ref)
    bad = ~(err <= tol)          # NaN counts as bad
    if bad.any():
        idx = tuple(np.argwhere(bad)[0])
        worst = np.unravel_index(np.nanargmax(np.where(np.isfinite(err), err / np.maximum(tol, 1e-300), np.inf)),
                                 err.shape)
        pytest.fail(f"{what}: {bad.sum()} of {bad.size} out of tolerance; first at {idx}: got {got[idx]!r} "
                    f"ref {ref[idx]!r} tol {np.broadcast_to(tol, err.shape)[idx]:.3g}; worst at {worst}: "
                    f"got {got[worst]!r} ref {ref[worst]!r}")


# ---- weights -------------------------------------------------------------------------------------
QUANTIZE = {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"}
KQUANT_F16 = {"Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "Q2_K": [80, 82]}


def make_weight(qtype: str, rows: int, cols: int, rng):
    """(raw GGUF bytes rows x row_bytes, dequantized float64 rows x cols)."""
    if qtype in QUANTIZE:
        x = (rng.standard_normal((rows, cols)) * rng.uniform(0.2, 2.0, (rows, 1))).astype(np.float32)
        x[:, : cols // 5] += 0.4                  # some blocks with a nonzero mean (min/offset paths)
        raw = np.ascontiguousarray(gq.quantize(x, GT[qtype])).view(np.uint8).reshape(rows, -1)
    else:                                         # K-quants: random valid blocks, moderate scales
        q = QUANT_TYPES[qtype]
        nb = rows * cols // q.block_elems
        blocks = rng.integers(0, 256, (nb, q.block_bytes), dtype=np.uint8)
        for off in KQUANT_F16[qtype]:
            d = (rng.uniform(0.002, 0.02, nb) * rng.choice([-1, 1], nb)).astype(np.float16)
            blocks[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
        raw = blocks.reshape(rows, -1)
    ref = np.asarray(gq.dequantize(raw, GT[qtype]), np.float32).reshape(rows, cols).astype(np.float64)
    assert np.isfinite(ref).all()
    return raw, ref


def upload(dev, qtype, raw, rows, cols, max_binding=None):
    return upload_weight(dev, "w", qtype, (rows, cols), np.ascontiguousarray(raw).reshape(-1), max_binding)


# ---- matmul --------------------------------------------------------------------------------------
MM_RTOL = 1e-5
ALL_TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def k_for(qtype, i=0):
    return ([256, 512] if QUANT_TYPES[qtype].block_elems == 256 else [96, 160])[i % 2]


def check_matmul(dev, qtype, rows, K, n, tt, *, accumulate=False, bias=False, row0=0, y_extra=0,
                 first=None, max_binding=None, seed=0, n_chunks=None, tiled=True, int8=False, scale=1.0,
                 q8_tile=None, decode_batch=False, x_run=None):
    """y[t, row0 + r] (+)= W[r] . x[t] (+ b[row0 + r]) for t over the computed batch rows; with `int8`,
    the reference takes x as the int8 GEMM rounds it (q8_rounded; in runs of `x_run`, default the
    type's). Returns the dispatches' labels."""
    rng = np.random.default_rng(seed)
    raw, W = make_weight(qtype, rows, K, rng)
    if max_binding == "small":
        max_binding = QUANT_TYPES[qtype].row_bytes(K) * 16          # 16-row chunks
    w = upload(dev, qtype, raw, rows, K, max_binding)
    if n_chunks is not None:
        assert len(w.chunks) == n_chunks
    m = n - (first or 0)                     # batch rows computed; x and y rows count from 0
    x = (rng.standard_normal((m, K)) * scale).astype(np.float32)
    if int8:
        x[0, :32] = 0.0                      # a block of zeros: scale 0
    ys = row0 + rows + y_extra
    y_rows = n + 1                           # one spare row past the batch: must stay untouched
    y0 = rng.standard_normal((y_rows, ys)).astype(np.float32) if accumulate else poisoned((y_rows, ys))
    b = rng.standard_normal(ys).astype(np.float32)
    st = state(dev, pos=11, n=n, tok=3, out_row0=first or 0)
    xb, yb = dev.upload(x), dev.upload(y0)
    bb = dev.upload(b) if bias else None
    ds = ops.matmul(dev, w, xb, yb, st, tt=tt, y_stride=ys, row0=row0, accumulate=accumulate, bias=bb,
                    from_state_row=first is not None, tiled=tiled, int8=int8,
                    q8_tile=q8_tile, decode_batch=decode_batch, x_run=x_run)
    run(dev, ds, n)
    got = read_f32(dev, yb, (y_rows, ys))

    tensor_cores = any(d.label.startswith("matmul_tc") for d in ds)
    xr, slack = (q8_rounded(x, x_run or QUANT_TYPES[qtype].iq8_run) if int8 and not tensor_cores
                 else (x.astype(np.float64), np.zeros(x.shape)))
    prod = xr @ W.T
    ref = y0.astype(np.float64).copy()
    sl = (slice(0, m), slice(row0, row0 + rows))
    ref[sl] = (ref[sl] if accumulate else 0.0) + prod + (b[row0:row0 + rows] if bias else 0.0)
    tol = np.zeros_like(ref)
    tol[sl] = (tc_error_bound(x, W) if tensor_cores else slack @ np.abs(W).T) + MM_RTOL * (np.abs(xr) @ np.abs(W).T
                         + (np.abs(y0[sl]) if accumulate else 0) + (np.abs(b[row0:row0 + rows]) if bias else 0)) + 1e-30
    what = (f"matmul {qtype} {rows}x{K} n={n} tt={tt} first={first} row0={row0} chunks={len(w.chunks)}"
            + (" int8" if int8 else ""))
    assert_close(got[sl], ref[sl], tol[sl], what)
    # everything outside the written block is bit-identical to what was there
    outside = np.ones(got.shape, bool)
    outside[sl] = False
    assert np.array_equal(got.view(np.uint32)[outside], y0.view(np.uint32)[outside]), \
        f"{what}: wrote outside y[0:{m}, {row0}:{row0 + rows}]"
    return [d.label for d in ds]


TC_LIM = 32639.0         # matmul_tc.wgsl's 16-bit grid: |X| <= LIM, two int8 digits


def tc_error_bound(x, W):
    """How far the tensor-core GEMM may be from x . W: x on a grid of max|x[t]| / LIM a token and W of
    max|W[r]| / LIM a row (a step each, for f32 rounding ties), and the dropped product of the two low
    digits (each at most 128 steps)."""
    sx = np.abs(x).max(axis=1, keepdims=True).astype(np.float64) / TC_LIM
    sw = np.abs(W).max(axis=1, keepdims=True).astype(np.float64) / TC_LIM
    k = x.shape[1]
    return sx * np.abs(W).sum(1)[None, :] + np.abs(x).sum(1)[:, None] * sw.T + (1 + 128 * 128) * k * sx * sw.T


def q8_rounded(x, run=16):
    """x as the int8 prefill GEMM sees it: each run of `run` elements rounded to multiples of max|x| / 127
    (quantize_q8.wgsl), in float64, and per element the error a rounding tie may add (the kernel's f32
    127 x / max|x| can land on the other side of a half)."""
    b = x.astype(np.float64).reshape(x.shape[0], -1, run)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    safe = np.where(amax == 0, 1.0, amax)
    v = 127.0 * b / safe
    q = np.floor(v + 0.5)
    d = amax / 127.0
    near_tie = np.abs(v - np.floor(v) - 0.5) < 1e-4
    return (q * d).reshape(x.shape), (near_tie * d).reshape(x.shape)


INT8_TYPES = [q for q in ALL_TYPES if QUANT_TYPES[q].blocked]


@pytest.mark.parametrize("qtype", INT8_TYPES)
@pytest.mark.parametrize("n", [5, 130])
def test_matmul_int8(dev, qtype, n):
    """The int8 prefill GEMM (x rounded per 16-element run, integer dots): every quantized type,
    one partial tile and several (rows and tokens past the largest tile's 128), K of 3-16 blocks."""
    i = INT8_TYPES.index(qtype) + n
    check_matmul(dev, qtype, [37, 200][i % 2], k_for(qtype, i), n, n, seed=i, int8=True)


@pytest.mark.parametrize("tile", gemm.Q8_TILES + gemm.Q8_FEW_TILES)
def test_matmul_int8_tiles(dev, tile):
    """Every int8 GEMM tile, with partial tiles of rows and tokens, and Q6_K's 16-element scale groups;
    K steps of 64 where K allows them (512), of 32 where it does not (96)."""
    check_matmul(dev, "Q6_K", 200, 512, 150, 150, seed=tile[0] + tile[1], int8=True, q8_tile=tile)
    check_matmul(dev, "Q4_1", 77, 96, 67, 67, seed=tile[1], int8=True, q8_tile=tile)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q4_0"])
def test_matmul_int8_tile_invariant(dev, qtype):
    """A token's int8 GEMM result is the same bits in every tile (its runs folded in K order whatever
    the tile's rows, tokens, threads or K step), so a prompt's or a decode batch's results do not hang
    on the tile gemm.q8_tile picks for its length or the adapter's workgroup memory."""
    rng = np.random.default_rng(7)
    rows, K, n = 150, 512, 140
    raw, _ = make_weight(qtype, rows, K, rng)
    w = upload(dev, qtype, raw, rows, K)
    xb = dev.upload(rng.standard_normal((n, K)).astype(np.float32))
    st = state(dev, n=n)
    outs = {}
    for tile in gemm.Q8_TILES + gemm.Q8_FEW_TILES:
        yb = dev.upload(poisoned((n, rows)))
        run(dev, ops.matmul(dev, w, xb, yb, st, tt=n, y_stride=rows, row0=0, accumulate=False, bias=None,
                            from_state_row=False, tiled=True, int8=True, q8_tile=tile), n)
        outs[tile] = read_f32(dev, yb, (n, rows)).view(np.uint32)
    first = gemm.Q8_TILES[0]
    for tile, got in outs.items():
        assert np.array_equal(got, outs[first]), f"{qtype}: tile {tile} differs from {first}"


@pytest.mark.parametrize("qtype", ["Q6_K", "Q2_K"])
@pytest.mark.parametrize("path", ["few", "split"])
def test_matmul_int8_x_in_runs_of_32(dev, qtype, path, monkeypatch):
    """A decode batch's type of runs of 16 (with and without mins) takes x rounded in runs of 32 (x_run:
    x shared with a Q4_K), each half's weight scale folded apart."""
    monkeypatch.setattr(gemm, "tensor_cores", lambda dev: False)
    n, k = (12, 512) if path == "few" else (gemm.FEW_TOKENS + 4, 2048)
    labels = check_matmul(dev, qtype, 45, k, n, n, seed=n, int8=True, decode_batch=True, x_run=32,
                          accumulate=path == "few", bias=path == "few", row0=2 if path == "few" else 0)
    kernel = {"few": "matmul_few", "split": "matmul_split"}[path]
    assert any(label.startswith(kernel) for label in labels), labels


@pytest.mark.parametrize("qtype,rows,K,n,first", [("Q4_K", 200, 2048, 52, None), ("Q6_K", 77, 1024, 50, 2),
                                                   ("Q8_0", 130, 1536, 64, None)])
def test_matmul_int8_split_k(dev, qtype, rows, K, n, first):
    """A decode batch of more than gemm.FEW_TOKENS rows: the GEMM with K in slices and their partial sums
    added by a second dispatch, with the epilogue (bias, accumulate, a row offset) and rows from the
    state's first row."""
    assert gemm.k_slices(rows, K) > 1
    for feature in (dict(), dict(accumulate=True, bias=True, row0=3, y_extra=5)):
        labels = check_matmul(dev, qtype, rows, K, n, n, seed=n, int8=True, decode_batch=True, first=first, **feature)
        assert "matmul_split" in labels


@pytest.mark.parametrize("fuse,k,n,run_", [("norm", 576, 3, 32), ("norm", 2048, 17, 16), ("norm", 96, 1, 32),
                                            ("norm", 8448, 2, 32), ("silu", 1536, 5, 32), ("gelu", 96, 2, 16)])
def test_quantize_q8_fused_inputs(dev, fuse, k, n, run_):
    """quantize_q8 with the RMSNorm (rows of 96-8448: under and over a workgroup of blocks, two a thread)
    or the gated activation folded in gives the int8 words, scales and sums of the rmsnorm / glu dispatch
    it replaces: bit for bit, but for the normed int8 blocks, whose squares are summed in another order
    (1 / rms to the last bits: scales within 1e-6, a rare word one step off)."""
    rng = np.random.default_rng(k + n)
    st = state(dev, n=n)
    x = (rng.standard_normal((n, (1 if fuse == "norm" else 2) * k)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
    xb, tmp = dev.upload(x), dev.buffer(4 * n * k)
    if fuse == "norm":
        nw = dev.upload(rng.uniform(-2, 2, k).astype(np.float32))
        first = [ops.rmsnorm(dev, xb, nw, tmp, st, dim=k, eps=1e-5)]
        fused = dict(norm=nw, eps=1e-5)
    else:
        first = [ops.glu(dev, xb, tmp, st, ffn=k, gelu=fuse == "gelu")]
        fused = dict(glu_input=gemv.act_defines(gelu=fuse == "gelu"))
    for digits in (False, True):            # matmul_q8's runs, matmul_tc's digits
        sizes = (n * k // 2, n) if digits else (n * k // 4, n * k // 16, n * k // 16)
        got = []
        for ds, src, kw in ((first, tmp, {}), ([], xb, fused)):
            q, bufs = gemm.quantize_q8(dev, src, st, k=k, tokens=n, from_state_row=False, run=run_, digits=digits, **kw)
            run(dev, ds + q, n)
            got.append([dev.read(b, np.uint32)[:size].copy() for b, size in zip(bufs, sizes)])
        if fuse == "norm" and not digits:
            (qa, da, sa), (qb, db, sb) = ([b.view(t) for b, t in zip(g, (np.int8, np.float32, np.float32))]
                                          for g in got)
            assert np.allclose(da, db, rtol=1e-6, atol=0)
            assert np.allclose(sa, sb, rtol=1e-5, atol=1e-6 * np.abs(sb).max())
            steps = np.abs(qa.astype(np.int16) - qb)
            assert steps.max() <= 1 and np.mean(steps > 0) < 1e-3, (steps.max(), np.mean(steps > 0))
            continue
        for name, a, b in zip(("words", "scales", "sums"), *got):
            assert np.array_equal(a, b), f"{fuse} k={k} digits={digits}: {name} differ at {np.flatnonzero(a != b)[:5]}"


TC_EMULATED_TYPES = ("Q4_0", "Q4_K", "Q6_K")      # blocks of 32 and 256, runs with mins and of 16


@pytest.mark.parametrize("qtype", INT8_TYPES)
def test_matmul_tensor_cores(dev, qtype, monkeypatch):
    """The prompt GEMM on int8 subgroup matrices (a GPU whose WebGPU offers them: Dawn's on NVIDIA), x and
    W each on one 16-bit grid, within tc_error_bound of the exact product: partial tiles of rows and
    tokens, the epilogue, rows from the state's first row, a weight in several bindings. Elsewhere the
    matrix operations are emulated in plain WGSL (slow: three types, K of one block or three runs). Types
    in blocks of 32 take K an odd multiple of 32: the last K step of 64 half past K (TAIL)."""
    emulated = not dev.has_int8_matrix
    if emulated and (qtype not in TC_EMULATED_TYPES or not dev.has_subgroups):
        pytest.skip("emulated only for TC_EMULATED_TYPES, once")
    monkeypatch.setattr(gemm, "TC_EMULATE", emulated)
    if not gemm.tensor_cores(dev):
        pytest.skip("the tensor-core GEMM's tiles do not fit this adapter")
    i = INT8_TYPES.index(qtype)
    tail = 32 if QUANT_TYPES[qtype].block_elems == 32 else 0
    rows, k, n = (130, max(64, QUANT_TYPES[qtype].block_elems) + tail, 130) if emulated else ([200, 130][i % 2], 512 + tail, 300)
    features = [dict(), dict(accumulate=True, bias=True, row0=3, y_extra=5, first=2)]
    if not emulated or qtype == "Q4_0":
        features.append(dict(max_binding="small"))
    for feature in features:
        labels = check_matmul(dev, qtype, rows, k, n, n, seed=i, int8=True, **feature)
        assert any(x.startswith("matmul_tc") for x in labels), labels
    # K in slices (a matrix of few tiles; whole K steps, so no tail), their partial sums added in order by
    # matmul_split's epilogue
    monkeypatch.setattr(gemm, "TC_MIN_SLICE", 32)
    labels = check_matmul(dev, qtype, rows, max(k - tail, 128), n, n, seed=i, int8=True, **features[1])
    assert "matmul_split" in labels and any(x.startswith("matmul_tc") for x in labels), labels


@pytest.mark.parametrize("qtype", ("Q4_K", "Q6_K"))
def test_matmul_tensor_cores_decode_batch(dev, qtype, monkeypatch):
    """A decode batch's rows on matmul_tc (gemm.TC_BATCH_ROWS or more; here from 16) in tiles of 64 and of
    128 tokens: within tc_error_bound of the exact product with the epilogue and a split K, and a token's
    result bit-identical in batches of different sizes and company (its integer sums are exact; its
    slices are the matrix's)."""
    emulated = not dev.has_int8_matrix
    if emulated and not dev.has_subgroups:
        pytest.skip("emulated once, on an adapter with subgroups")
    monkeypatch.setattr(gemm, "TC_EMULATE", emulated)
    if not gemm.tensor_cores(dev):
        pytest.skip("the tensor-core GEMM's tiles do not fit this adapter")
    monkeypatch.setattr(gemm, "TC_MIN_SLICE", 128)
    monkeypatch.setattr(gemm, "TC_BATCH_ROWS", 16)
    rows, k = 130, 512
    for n, feature in ((20, dict()), (100, dict(accumulate=True, bias=True, row0=3, y_extra=5))):
        labels = check_matmul(dev, qtype, rows, k, n, n, seed=n, int8=True, decode_batch=True, **feature)
        assert any(x.startswith("matmul_tc") for x in labels) and "matmul_split" in labels, labels
    rng = np.random.default_rng(5)
    raw, _ = make_weight(qtype, rows, k, rng)
    w = upload(dev, qtype, raw, rows, k)
    x = rng.standard_normal((100, k)).astype(np.float32)
    out = []
    for n, xs in ((16, x[:16]), (100, x)):
        xb, yb = dev.upload(xs), dev.buffer(4 * n * rows)
        run(dev, ops.matmul(dev, w, xb, yb, state(dev, n=n), tt=n, y_stride=rows, int8=True, decode_batch=True), n)
        out.append(read_f32(dev, yb, (n, rows)))
    assert np.array_equal(out[0].view(np.uint32), out[1][:len(out[0])].view(np.uint32))


def test_quantize_digits(dev):
    """quantize_q8's digits (the tensor-core GEMM's x): X = round(LIM x / max|x|) a token as 256 hi + lo,
    both int8, and the grid step max|x| / LIM; a row of zeros stays zero."""
    n, k = 5, 96
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((n, k)) * rng.uniform(0.01, 100, (n, 1))).astype(np.float32)
    x[2] = 0.0
    q, (xq, xd) = gemm.quantize_q8(dev, dev.upload(x), state(dev, n=n), k=k, tokens=n, from_state_row=False,
                                  run=32, digits=True)
    run(dev, q, n)
    planes = dev.read(xq, np.int8)[:2 * n * k].reshape(2, n, k).astype(np.int64)
    step = dev.read(xd, np.float32)[:n]
    amax = np.abs(x).max(axis=1).astype(np.float64)
    assert np.allclose(step, amax / TC_LIM, rtol=1e-6)
    want = np.floor(x * np.where(amax == 0, 0, TC_LIM / np.where(amax == 0, 1, amax))[:, None] + 0.5)
    got = 256 * planes[0] + planes[1]
    assert np.abs(got - want).max() <= 1 and np.mean(got == want) > 0.999
    assert np.abs(got).max() <= TC_LIM and not got[2].any()


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q6_K"])
def test_row_max(dev, qtype):
    """weights.row_max: max |W| of every row (the tensor-core grid), in each binding of a split weight."""
    from shaderlm.kernels.weights import row_max
    raw, W = make_weight(qtype, 70, 512, np.random.default_rng(2))
    w = upload(dev, qtype, raw, 70, 512, QUANT_TYPES[qtype].row_bytes(512) * 16)
    got = np.concatenate([dev.read(row_max(dev, w, c), np.float32)[:c.rows] for c in w.chunks])
    assert len(w.chunks) > 1 and np.array_equal(got, np.abs(W).max(axis=1).astype(np.float32))


@pytest.mark.parametrize("qtype,rows,K,n,first", [("Q4_K", 200, 2048, 16, None), ("Q6_K", 77, 1024, 5, 2),
                                                   ("Q8_0", 37, 1536, 2, None), ("Q4_1", 70, 96, 12, None),
                                                   ("Q5_K", 33, 512, 8, 3)])
def test_matmul_few(dev, qtype, rows, K, n, first):
    """A decode batch of gemm.FEW_TOKENS rows or fewer: matmul_few (a run decoded once for every token),
    runs of 32 and of 16, K shorter than the lanes' stride, the epilogue, rows from the state's first
    row, and a weight in several bindings."""
    for feature in (dict(), dict(accumulate=True, bias=True, row0=3, y_extra=5), dict(max_binding="small")):
        labels = check_matmul(dev, qtype, rows, K, n, n, seed=n, int8=True, decode_batch=True, first=first, **feature)
        assert any(x.startswith("matmul_few") for x in labels) and "matmul_split" not in labels, labels


@pytest.mark.parametrize("shape", [gemm.FEW_SHAPE, *gemm.FEW_SHAPES], ids=gemm.few_shape_label)
def test_matmul_few_every_tuned_shape(dev, monkeypatch, shape):
    """Each matmul_few shape the tuner may pick (rows a thread, lanes on K, threads), cached for the
    matrix's key, computes the batch against the reference (several row groups, runs of 32 and 16, K
    shorter than the lanes' stride, the epilogue); one the adapter cannot hold at every batch size is no
    candidate."""
    offered = few_candidates(dev)
    if not gemm.few_fits(dev, shape):
        assert shape not in offered
        pytest.skip(f"{shape} does not fit this adapter")
    assert shape in offered
    monkeypatch.setattr(gemm, "tuned_shape", lambda dev, key: shape if key.startswith("matmul_few") else None)
    for qtype, rows, K, n in (("Q4_K", 90, 1024, 16), ("Q6_K", 37, 512, 5), ("Q8_0", 20, 96, 12)):
        for feature in (dict(), dict(accumulate=True, bias=True, row0=3, y_extra=5)):
            labels = check_matmul(dev, qtype, rows, K, n, n, seed=n, int8=True, decode_batch=True, **feature)
            assert any(x.startswith("matmul_few") for x in labels), labels


def few_candidates(dev) -> list:
    """The shapes matmul_few's Tunable offers (for a small Q4_K matrix)."""
    w = upload(dev, "Q4_K", make_weight("Q4_K", 8, 256, np.random.default_rng(0))[0], 8, 256)
    ds = ops.matmul(dev, w, dev.buffer(4 * 4 * 256), dev.buffer(4 * 4 * 8), state(dev, n=4), tt=4, y_stride=8,
                    int8=True, decode_batch=True)
    return next(d.tune for d in ds if d.label.startswith("matmul_few")).candidates()


def test_matmul_few_rows_past_the_grid_limit(dev):
    """matmul_few over more row groups than a dispatch's x dimension holds: the grid spills into y."""
    bm = gemm.few_layout(gemm.FEW_SHAPE, 3)["BM"]
    rows = bm * dev.limit("max-compute-workgroups-per-dimension", 65535) + 77
    labels = check_matmul(dev, "Q8_0", rows, 32, 3, 3, int8=True, decode_batch=True, seed=3)
    assert any(x.startswith("matmul_few") for x in labels)


@pytest.mark.parametrize("path", ["few", "batch", "prompt"])
def test_int8_gemms_keep_to_their_tokens(dev, path):
    """matmul_few and matmul_q8 run without bounds checks (kernels.UNCHECKED): a state counting more tokens
    than the host allotted them (max_tokens) still reads and writes only those rows, the same bits as a
    state that counts them."""
    from shaderlm.kernels import unchecked
    kernel = "matmul_few" if path == "few" else "matmul_q8"
    assert unchecked("matmul_few", {}) and unchecked("matmul_q8", {}) and not unchecked("matmul_q8", {"EXPERTS": True})
    rng = np.random.default_rng(12)
    # matmul_few: two thread groups of 7 tokens, one past max_tokens; matmul_q8: a tile of more tokens
    n = {"few": 13, "batch": gemm.FEW_TOKENS + 3, "prompt": 13}[path]
    extra, rows, K = 20, 70, 512
    raw, _ = make_weight("Q4_K", rows, K, rng)
    w = upload(dev, "Q4_K", raw, rows, K)
    xb = dev.upload(rng.standard_normal((n + extra, K)).astype(np.float32))
    out = []
    for count in (n, n + extra):
        yb = dev.upload(poisoned((n + extra, rows)))
        ds = ops.matmul(dev, w, xb, yb, state(dev, n=count), tt=n, y_stride=rows, int8=True,
                        decode_batch=path != "prompt")
        assert any(d.label.startswith(kernel) for d in ds), [d.label for d in ds]
        run(dev, ds, n)
        out.append(read_f32(dev, yb, (n + extra, rows)))
    assert not is_poison(out[0][:n]).any() and is_poison(out[1][n:]).all()
    assert np.array_equal(out[0][:n].view(np.uint32), out[1][:n].view(np.uint32))


@pytest.mark.parametrize("qtype,n", [("Q4_K", 16), ("Q6_K", 7), ("Q4_0", 29)])
def test_matmul_few_thread_shapes_keep_a_tokens_bits(dev, monkeypatch, qtype, n):
    """matmul_few's rows and tokens a thread (gemm.FEW_SHAPE's first and last: thread groups
    share the tokens) regroup the same operations: every token gets the same bits in each (a token count
    that the groups do not divide leaves a group's last tokens computed and not written)."""
    rng = np.random.default_rng(11)
    rows, K = 70, 1024
    raw, _ = make_weight(qtype, rows, K, rng)
    w = upload(dev, qtype, raw, rows, K)
    xb = dev.upload(rng.standard_normal((n, K)).astype(np.float32))
    out = {}
    for r, nt in ((2, 16), (4, 8), (1, 4), (2, 2), (8, 16)):
        monkeypatch.setattr(gemm, "FEW_SHAPE", (r, *gemm.FEW_SHAPE[1:3], nt))
        yb = dev.upload(poisoned((n, rows)))
        ds = ops.matmul(dev, w, xb, yb, state(dev, n=n), tt=n, y_stride=rows, int8=True, decode_batch=True)
        assert [d.label for d in ds][-1].startswith("matmul_few")
        run(dev, ds, n)
        out[r, nt] = read_f32(dev, yb, (n, rows)).view(np.uint32)
    first = out.pop((2, 16))
    assert not is_poison(first.view(np.float32)).any()
    for shape, got in out.items():
        assert np.array_equal(got, first), shape


@pytest.mark.parametrize("qtype,small,large", [("Q4_K", 3, 16), ("Q6_K", 8, 12), ("Q4_0", 9, 45), ("Q4_0", 50, 57)])
def test_batch_gemms_do_not_depend_on_the_batch(dev, qtype, small, large):
    """A decode batch's int8 GEMM (matmul_few up to gemm.FEW_TOKENS rows, the split GEMM beyond) gives a
    token the same bits whatever the batch's size and its other rows, as long as both are on one kernel."""
    rng = np.random.default_rng(7)
    rows, K = 90, 1024
    raw, _ = make_weight(qtype, rows, K, rng)
    w = upload(dev, qtype, raw, rows, K)
    x = rng.standard_normal((large, K)).astype(np.float32)
    out = []
    for n, xs in ((small, x[:small]), (large, x)):
        xb, yb = dev.upload(xs), dev.buffer(4 * n * rows)
        ds = ops.matmul(dev, w, xb, yb, state(dev, n=n), tt=n, y_stride=rows, int8=True, decode_batch=True)
        run(dev, ds, n)
        out.append(read_f32(dev, yb, (n, rows)))
    assert np.array_equal(out[0].view(np.uint32), out[1][:small].view(np.uint32))


@pytest.mark.parametrize("path", ["prompt", "few", "split", "tensor cores"])
def test_int8_gemms_share_x_rounding(dev, path, monkeypatch):
    """Matmuls over one x into consecutive rows (Q/K/V of different types): the second reuses the first's
    rounding of x where it is the same (x_after: the tensor cores' digits always, int8 runs of the same
    length), with the results of rounding it again, bit for bit."""
    if path == "tensor cores":
        if not dev.has_int8_matrix and not dev.has_subgroups:
            pytest.skip("emulated once, on an adapter with subgroups")
        monkeypatch.setattr(gemm, "TC_EMULATE", not dev.has_int8_matrix)
        if not gemm.tensor_cores(dev):
            pytest.skip("the tensor-core GEMM's tiles do not fit this adapter")
    else:
        monkeypatch.setattr(gemm, "tensor_cores", lambda dev: False)
    n = {"prompt": 150, "few": 8, "split": gemm.FEW_TOKENS + 8, "tensor cores": 130}[path]
    decode_batch = path in ("few", "split")
    rng = np.random.default_rng(3)
    rows, k = 70, 2048 if path == "split" else 512          # K long enough to be split (gemm.k_slices)
    ws = [upload(dev, q, make_weight(q, rows, k, rng)[0], rows, k) for q in ("Q4_K", "Q4_0", "Q6_K")]
    x = dev.upload(rng.standard_normal((n, k)).astype(np.float32))
    st = state(dev, n=n)
    kernel = {"prompt": "matmul_q8", "few": "matmul_few", "split": "matmul_split", "tensor cores": "matmul_tc"}[path]
    shape = (n, 3 * rows)
    # each type's own runs: Q4_0's of 32 like Q4_K's, Q6_K's of 16 rounded again (the tensor cores' digits
    # are one for all); then a decode batch's x in runs of 32 for all (gemm.shared_run): one rounding
    own = [1, 0, 0] if path == "tensor cores" else [1, 0, 1]
    for x_run, want_rounds in ((None, own), (32, [1, 0, 0] if decode_batch else own)):
        kw = dict(tt=n, y_stride=3 * rows, int8=True, decode_batch=decode_batch, x_run=x_run)
        got, want = dev.buffer(4 * n * 3 * rows), dev.buffer(4 * n * 3 * rows)
        shared, alone, prev = [], [], None
        for i, w in enumerate(ws):
            shared.append(ops.matmul(dev, w, x, got, st, row0=i * rows, x_after=prev, **kw))
            alone.append(ops.matmul(dev, w, x, want, st, row0=i * rows, **kw))
            prev = w
        run(dev, [d for ds in shared for d in ds], n)
        run(dev, [d for ds in alone for d in ds], n)
        assert np.array_equal(read_f32(dev, got, shape).view(np.uint32), read_f32(dev, want, shape).view(np.uint32))
        assert all(any(d.label.startswith(kernel) for d in ds) for ds in shared), [d.label for d in shared[0]]
        rounds = [sum(d.label.startswith("quantize") for d in ds) for ds in shared]
        assert rounds == want_rounds, (x_run, rounds)


def test_shared_run_is_the_longest_quantized_types():
    """A decode batch rounds x once for Q/K/V in runs of 32 where any quantized type takes 32; a type that
    is not quantized in blocks (no int8 GEMM) does not count."""
    ws = {q: SimpleNamespace(qtype=QUANT_TYPES[q]) for q in ("Q4_K", "Q6_K", "Q2_K", "F16")}
    assert gemm.shared_run([ws["Q4_K"], ws["Q6_K"]]) == 32
    assert gemm.shared_run([ws["Q6_K"], ws["F16"]]) == 16
    assert gemm.shared_run([ws["Q6_K"], ws["Q2_K"]]) == 16
    assert gemm.shared_run([ws["F16"]]) is None


def test_k_slices_fit_the_partials_scratch():
    """Split GEMMs share one scratch buffer of gemm.PARTIALS sums a token: every matrix's slices fit it,
    and each slice is whole K steps of 64 and at least gemm.MIN_SLICE long."""
    for rows in (1, 64, 77, 1024, 4096, 5120, 14336, 28672, 128256):
        for cols in (576, 1024, 2048, 4096, 8192, 14336):
            s = gemm.k_slices(rows, cols)
            assert rows * s <= gemm.PARTIALS or s == 1, (rows, cols, s)
            assert s == 1 or (cols % (64 * s) == 0 and cols // s >= gemm.MIN_SLICE), (rows, cols, s)


def test_q8_tile_fits_the_adapter_and_k(dev):
    """The tile picked for a matrix fits the adapter's workgroup memory and steps through K whole."""
    room = dev.limit("max-compute-workgroup-storage-size", 16384)
    for rows, cols, tokens in [(4096, 4096, 512), (1024, 4096, 512), (14336, 4096, 256), (4096, 14336, 1024),
                               (77, 96, 67), (576, 1536, 16), (4096, 4096, 3), (4096, 4096, 64)]:
        tile = gemm.q8_tile(dev, rows, cols, tokens)
        assert gemm.q8_workgroup_bytes(*tile) <= room and cols % (32 * tile[2]) == 0


@pytest.mark.parametrize("feature", ["all", "bias_row0"])
@pytest.mark.parametrize("n,first", [(67, None), (70, 3)])
def test_matmul_int8_features(dev, feature, n, first):
    """The int8 GEMM's epilogue (accumulate, bias, row offset, split bindings) and from_state_row,
    on x of a large scale."""
    check_matmul(dev, "Q4_K", 37, 256, n, n, first=first, seed=n, int8=True, scale=300.0,
                 **FEATURES[feature])


@pytest.mark.parametrize("qtype", ALL_TYPES)
@pytest.mark.parametrize("tt,n", [(1, 1), (1, 5), (8, 5), (8, 67)])
def test_matmul_types(dev, qtype, tt, n):
    """Decode GEMV (tt=1, one token or a grid of tokens) and the tiled GEMM (tt=8: one 64-token tile
    and more than one), odd row counts, K from 96 to 512."""
    i = ALL_TYPES.index(qtype) + n
    rows = [37, 130][i % 2]
    check_matmul(dev, qtype, rows, k_for(qtype, i), n, tt, seed=i)


@pytest.mark.parametrize("tt,first", [(1, 2), (8, None)])
def test_matmul_rows_past_the_grid_limit(dev, tt, first):
    """More rows than a dispatch's x dimension holds (as Gemma 3's 262,144-row LM head has where a
    workgroup takes one row, without subgroups): workgroups loop over rows, each row's sums from zero."""
    rows = dev.limit("max-compute-workgroups-per-dimension", 65535) + 466
    check_matmul(dev, "Q8_0", rows, 64, 3, tt, first=first, tiled=False, seed=5)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("n", [5, 67])
def test_matmul_gemv_tt8(dev, qtype, n):
    """K not a multiple of 32: tt=8 runs the GEMV with 8 tokens per workgroup (TT=8)."""
    check_matmul(dev, qtype, 37, 40, n, 8, seed=n)
    check_matmul(dev, qtype, 19, 40, n, 8, seed=n + 1, accumulate=True, bias=True, row0=3, y_extra=2)


FEATURES = {
    "accumulate": dict(accumulate=True),
    "bias": dict(bias=True),
    "row0_stride": dict(row0=5, y_extra=3),
    "bias_row0": dict(bias=True, row0=7, y_extra=1),
    "split": dict(max_binding="small", n_chunks=3),
    "all": dict(accumulate=True, bias=True, row0=4, y_extra=2, max_binding="small", n_chunks=3),
}


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "Q4_K"])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("tt,n", [(1, 3), (8, 67)])
def test_matmul_features(dev, qtype, feature, tt, n):
    check_matmul(dev, qtype, 37, k_for(qtype), n, tt, seed=len(feature), **FEATURES[feature])


@pytest.mark.parametrize("qtype", ["F16", "Q4_1", "Q6_K"])
@pytest.mark.parametrize("tt,n,first", [(1, 6, 5), (1, 6, 2), (8, 70, 3), (8, 9, 8)])
def test_matmul_from_state_row(dev, qtype, tt, n, first):
    """from_state_row: only batch rows [out_row0, n) are computed; x and y rows count from out_row0."""
    check_matmul(dev, qtype, 37, k_for(qtype), n, tt, first=first, seed=n + first)
    check_matmul(dev, qtype, 37, k_for(qtype), n, tt, first=first, seed=n + first + 1,
                 accumulate=True, bias=True, row0=2, y_extra=1, max_binding="small", n_chunks=3)


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(g):
    e = np.exp(-np.abs(g))                   # overflow-free: g * sigmoid(g)
    return g * np.where(g >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def gelu(g):
    return 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g ** 3)))


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("mode", ["norm", "glu", "glu_gelu", "norm_glu"])
def test_matmul_fused_decode(dev, qtype, mode):
    """The decode GEMV's fused variants: RMSNorm of x (NORM) and the gated activation (GLU)."""
    rng = np.random.default_rng(len(mode))
    K = k_for(qtype)
    rows, n, eps = 37, 3, 1e-5
    glu_, gelu_, norm_ = "glu" in mode, "gelu" in mode, "norm" in mode
    raw, W = make_weight(qtype, 2 * rows if glu_ else rows, K, rng)
    w = upload(dev, qtype, raw, W.shape[0], K)
    x = (rng.standard_normal((n, K)) * 3 + 0.5).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    ys = rows + 2
    y0 = poisoned((n + 1, ys))
    st = state(dev, pos=0, n=n)
    yb = dev.upload(y0)
    ds = ops.matmul(dev, w, dev.upload(x), yb, st, tt=1, y_stride=ys, row0=1, glu=glu_, gelu=gelu_,
                    norm=dev.upload(nw) if norm_ else None, eps=eps)
    run(dev, ds, n)
    got = read_f32(dev, yb, (n + 1, ys))
    xin = rms(x.astype(np.float64), nw, eps) if norm_ else x.astype(np.float64)
    if glu_:
        g, u = xin @ W[:rows].T, xin @ W[rows:].T
        tg, tu = np.abs(xin) @ np.abs(W[:rows]).T, np.abs(xin) @ np.abs(W[rows:]).T
        ref = (gelu(g) if gelu_ else silu(g)) * u
        # d act / dg <= 1.13 for both: error of g and u propagate linearly
        tol = 2 * MM_RTOL * (1.2 * tg * np.abs(u) + np.abs(gelu(g) if gelu_ else silu(g)) * tu) \
            + 1e-5 * np.abs(ref) + 1e-30
    else:
        ref = xin @ W.T
        tol = 2 * MM_RTOL * (np.abs(xin) @ np.abs(W).T) + 1e-30
    assert_close(got[:n, 1:1 + rows], ref, tol, f"fused matmul {mode} {qtype}")
    assert is_poison(got[n]).all() and is_poison(got[:, 0]).all() and is_poison(got[:, 1 + rows:]).all()


# ---- rmsnorm -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim,n,first", [(300, 5, None), (100, 3, None), (520, 7, 4), (300, 4, 3)])
def test_rmsnorm(dev, dim, n, first):
    rng = np.random.default_rng(dim + n)
    eps = 1e-6
    x = (rng.standard_normal((n, dim)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
    w = rng.uniform(-2, 2, dim).astype(np.float32)
    m = n - (first or 0)
    yb = dev.upload(poisoned((n + 1, dim)))
    st = state(dev, pos=4, n=n, tok=0, out_row0=first or 0)
    run(dev, ops.rmsnorm(dev, dev.upload(x), dev.upload(w), yb, st, dim=dim, eps=eps,
                         from_state_row=first is not None), n)
    got = read_f32(dev, yb, (n + 1, dim))
    x64 = x.astype(np.float64)[(first or 0):]
    ref = rms(x64, w, eps)
    assert_close(got[:m], ref, 1e-5 * np.abs(ref) + 1e-30, f"rmsnorm dim={dim} n={n} first={first}")
    assert is_poison(got[m:]).all(), "rmsnorm wrote past the computed rows"


# ---- embed ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("qtype,dim,split", [("F32", 40, False), ("F16", 96, True), ("BF16", 40, True),
                                              ("Q8_0", 96, False), ("Q8_0", 160, True), ("Q4_1", 96, True),
                                              ("Q5_0", 160, True), ("Q4_K", 256, True), ("Q6_K", 256, True)])
def test_embed(dev, qtype, dim, split):
    rng = np.random.default_rng(dim + len(qtype))
    vocab, n, tok0, scale = 53, 7, 5, 1.7
    raw, E = make_weight(qtype, vocab, dim, rng)
    mb = QUANT_TYPES[qtype].row_bytes(dim) * 8 if split else None
    w = upload(dev, qtype, raw, vocab, dim, mb)
    assert len(w.chunks) == (7 if split else 1)
    ids = np.array([0, vocab - 1, 17, 17, 8, 9, 40], np.uint32)
    tokens = np.full(tok0 + n + 3, 0xFFFFFFF0, np.uint32)       # out-of-range ids around the batch
    tokens[tok0:tok0 + n] = ids
    xb = dev.upload(poisoned((n + 1, dim)))
    st = state(dev, pos=100, n=n, tok=tok0, out_row0=0)
    run(dev, ops.embed(dev, w, dev.upload(tokens), xb, st, scale=scale), n)
    got = read_f32(dev, xb, (n + 1, dim))
    ref = E[ids] * np.float32(scale)
    tol = 2.0 ** -22 * (np.abs(E[ids]) + np.abs(E).max(axis=1, keepdims=True)[ids]) * scale + 1e-30
    assert_close(got[:n], ref, tol, f"embed {qtype} dim={dim} split={split}")
    assert is_poison(got[n]).all(), "embed wrote past the batch"


# ---- rope_store ----------------------------------------------------------------------------------
def inv_freq_turns(rope_dim, base):
    i = np.arange(rope_dim // 2, dtype=np.float64)
    return base ** (-2.0 * i / rope_dim) / (2 * np.pi)


def rope_ref(x, pos, rope_dim, base, neox):
    """llama.cpp RoPE of x (..., hd) at position pos: theta_i = pos * base^(-2i/rope_dim); normal mode
    rotates (2i, 2i+1), NEOX (i, i + rope_dim/2); dims >= rope_dim pass through. Also returns the
    magnitude of each element's pair (0 for dims that are not rotated)."""
    x = np.asarray(x, np.float64)
    i = np.arange(rope_dim // 2)
    th = pos * base ** (-2.0 * i / rope_dim)
    a, b = (i, i + rope_dim // 2) if neox else (2 * i, 2 * i + 1)
    out, mag = x.copy(), np.zeros_like(x)
    x0, x1 = x[..., a], x[..., b]
    out[..., a] = x0 * np.cos(th) - x1 * np.sin(th)
    out[..., b] = x0 * np.sin(th) + x1 * np.cos(th)
    mag[..., a] = mag[..., b] = np.hypot(x0, x1)
    return out, mag


def rope_tol(mag, pos):
    return mag * (2.4e-7 * pos + 4e-6) + 1e-30


def f16_ulp(v):
    return np.spacing(np.abs(np.asarray(v, np.float64)).astype(np.float16)).astype(np.float64)


@pytest.mark.parametrize("neox,rope_dim,hd,n_heads,n_kv,pos", [
    (False, 64, 64, 4, 2, 3000), (True, 64, 64, 4, 2, 3000),
    (False, 32, 64, 4, 2, 7), (True, 32, 64, 6, 2, 3000),
    (False, 96, 128, 3, 1, 100), (True, 128, 128, 4, 4, 1),
    (True, 256, 256, 2, 1, 2500), (False, 160, 256, 2, 2, 70)])
def test_rope_store(dev, neox, rope_dim, hd, n_heads, n_kv, pos):
    rng = np.random.default_rng(pos + hd)
    n, base = 3, 10000.0
    wd = (n_heads + 2 * n_kv) * hd
    qkv = rng.standard_normal((n, wd)).astype(np.float32)
    ctx = pos + n + 2
    kc = dev.upload(np.full(ctx * n_kv * hd // 2, CACHE_POISON, np.uint32))
    vc = dev.upload(np.full(ctx * n_kv * hd // 2, CACHE_POISON, np.uint32))
    qb = dev.upload(qkv)
    inv = dev.upload(inv_freq_turns(rope_dim, base).astype(np.float32))
    st = state(dev, pos=pos, n=n, tok=9, out_row0=0)
    run(dev, ops.rope_store(dev, qb, inv, kc, vc, st, n_heads=n_heads, n_kv=n_kv, head_dim=hd,
                            rope_dim=rope_dim, neox=neox), n)
    what = f"rope_store neox={neox} rope_dim={rope_dim} hd={hd} pos={pos}"
    got_qkv = read_f32(dev, qb, (n, wd))
    q = qkv[:, : n_heads * hd].reshape(n, n_heads, hd)
    k = qkv[:, n_heads * hd:(n_heads + n_kv) * hd].reshape(n, n_kv, hd)
    v = qkv[:, (n_heads + n_kv) * hd:].reshape(n, n_kv, hd)
    poss = (pos + np.arange(n))[:, None, None]
    qr, qmag = rope_ref(q, poss, rope_dim, base, neox)
    kr, kmag = rope_ref(k, poss, rope_dim, base, neox)
    gq_ = got_qkv[:, : n_heads * hd].reshape(n, n_heads, hd)
    assert_close(gq_, qr, rope_tol(qmag, pos + n), what + " (q)")
    assert np.array_equal(gq_[..., rope_dim:], q[..., rope_dim:]), what + ": q dims past rope_dim changed"
    assert np.array_equal(got_qkv[:, (n_heads + n_kv) * hd:], qkv[:, (n_heads + n_kv) * hd:]), \
        what + ": v in qkv changed"
    for name, buf, ref, mag in (("k", kc, kr, kmag), ("v", vc, v.astype(np.float64), np.zeros(v.shape))):
        words = dev.read(buf, np.uint32)[: ctx * n_kv * hd // 2].reshape(ctx, n_kv * hd // 2)
        other = np.ones(ctx, bool)
        other[pos:pos + n] = False
        assert (words[other] == CACHE_POISON).all(), f"{what}: {name} cache written outside [pos, pos+n)"
        got = words[pos:pos + n].view(np.float16).reshape(n, n_kv, hd).astype(np.float64)
        assert_close(got, ref, rope_tol(mag, pos + n) + f16_ulp(ref) + 1e-30, f"{what} ({name} cache)")


# ---- attention -----------------------------------------------------------------------------------
ATT_TOL = 2e-5
F16_NAN = np.uint16(0x7E00)


def attention_ref(q, K, V, pos, scale, window, softcap, n_heads, n_kv, sinks=None):
    """q (n, H, hd), K/V (ctx, n_kv, hd): float64. Causal over positions [lo, pos + t]; `sinks`: a
    logit per head in each softmax's denominator only (gpt-oss)."""
    n, H, hd = q.shape
    out = np.zeros_like(q)
    g = n_heads // n_kv
    for t in range(n):
        qp = pos + t
        lo = max(0, qp + 1 - window) if window else 0
        for h in range(H):
            s = K[lo:qp + 1, h // g] @ q[t, h] * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            m = s.max() if sinks is None else max(s.max(), sinks[h])
            p = np.exp(s - m)
            den = p.sum() + (0.0 if sinks is None else np.exp(sinks[h] - m))
            out[t, h] = (p / den) @ V[lo:qp + 1, h // g]
    return out


def attn_setup(rng, n, pos, hd, n_heads, n_kv, window, qscale=1.0):
    """Random qkv rows and f16 caches for positions [0, pos + n); positions never to be read are NaN."""
    ctx = pos + n + 3
    qkv = rng.standard_normal((n, (n_heads + 2 * n_kv) * hd)).astype(np.float32)
    qkv[:, : n_heads * hd] *= qscale
    K = (rng.standard_normal((ctx, n_kv, hd)) * 1.5).astype(np.float16)
    V = (rng.standard_normal((ctx, n_kv, hd)) + rng.standard_normal((1, n_kv, hd))).astype(np.float16)
    lo = max(0, pos + 1 - window) if window else 0          # first key any query row may read
    for c in (K, V):
        c.view(np.uint16)[pos + n:] = F16_NAN
        c.view(np.uint16)[:lo] = F16_NAN
    return qkv, K, V


@pytest.mark.parametrize("hd,n_heads,n_kv,n,pos,window,softcap", [
    (64, 4, 2, 3, 147, 0, 0.0),          # 150 keys: three 64-key tiles, GQA 2
    (128, 6, 2, 4, 146, 0, 0.0),         # GQA 3
    (64, 4, 4, 5, 0, 0, 0.0),            # first rows of a sequence (1..5 keys)
    (64, 2, 1, 1, 0, 0, 0.0),            # a single key
    (128, 4, 2, 3, 147, 40, 0.0),        # sliding window
    (64, 4, 1, 3, 147, 100, 0.0),        # window over a tile boundary, GQA 4
    (64, 4, 2, 3, 130, 0, 10.0),         # softcap
    (128, 4, 2, 2, 140, 70, 5.0),        # both
    (256, 2, 1, 2, 90, 0, 0.0),          # hd 256: two dims pairs per thread
    (64, 4, 2, 70, 30, 0, 0.0),          # prompt chunks: several query tiles and key tiles
    (128, 4, 1, 45, 100, 50, 0.0),       # ... with a window that starts inside the tiles
    (256, 2, 2, 19, 7, 0, 3.0),          # ... hd 256 (smaller tiles), softcap
])
@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "per-query"])
def test_attention(dev, hd, n_heads, n_kv, n, pos, window, softcap, tiled):
    """Prompt chunks' attention (tiled) and the unfused decode step's (a workgroup a query)."""
    check_attention(dev, hd, n_heads, n_kv, n, pos, window, softcap, seed=hd + pos + n, tiled=tiled)


@pytest.mark.parametrize("tile", ops.PREFILL_ATTENTION_TILES)
@pytest.mark.parametrize("hd", [64, 128])
def test_attention_prefill_tiles(dev, tile, hd):
    """Every prefill attention tile that fits the device, on a prompt chunk of several query and key
    tiles after earlier positions, with a window starting inside them and GQA 2."""
    if not ops.prefill_attention_tile_ok(dev, hd, *tile):
        pytest.skip(f"tile {tile} does not fit this device for head dim {hd}")
    check_attention(dev, hd, 4, 2, 70, 37, 50, 0.0, seed=hd + sum(tile), prefill_tile=tile)


def check_attention(dev, hd, n_heads, n_kv, n, pos, window, softcap, *, seed, sinks=None, **kw):
    """Unfused attention (ops.attention) of n query rows at pos.. against attention_ref (`sinks`: a
    logit per head)."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / math.sqrt(hd)
    qscale = 4.0 if softcap else 1.0                     # scores large enough for the cap to matter
    qkv, K, V = attn_setup(rng, n, pos, hd, n_heads, n_kv, window, qscale)
    out = dev.upload(poisoned((n + 1, n_heads * hd)))
    st = state(dev, pos=pos, n=n, tok=0, out_row0=0)
    sb = None if sinks is None else dev.upload(np.asarray(sinks, np.float32))
    d = ops.attention(dev, dev.upload(qkv), dev.upload(K), dev.upload(V), out, st, n_heads=n_heads,
                      n_kv=n_kv, head_dim=hd, scale=scale, window=window, softcap=softcap, sinks=sb, **kw)
    run(dev, d, n)
    got = read_f32(dev, out, (n + 1, n_heads * hd))
    q = qkv[:, : n_heads * hd].reshape(n, n_heads, hd).astype(np.float64)
    if d.label == "attention_prefill":          # it holds q * scale as f16, as the cache holds K
        q, scale = (q * scale).astype(np.float16).astype(np.float64), 1.0
    Kf = np.where(np.isnan(K), 0, K).astype(np.float64)
    Vf = np.where(np.isnan(V), 0, V).astype(np.float64)
    ref = attention_ref(q, Kf, Vf, pos, scale, window, softcap, n_heads, n_kv, sinks).reshape(n, -1)
    tol = ATT_TOL * np.abs(Vf[: pos + n]).max()
    assert_close(got[:n], ref, tol, f"attention hd={hd} H={n_heads}/{n_kv} n={n} pos={pos} "
                                    f"window={window} softcap={softcap} sinks={sinks} {kw}")
    assert is_poison(got[n]).all()


@pytest.mark.parametrize("neox,rope_dim,hd,n_heads,n_kv,pos,window", [
    (False, 64, 64, 4, 2, 149, 0), (True, 32, 64, 6, 2, 149, 0), (True, 128, 128, 4, 1, 70, 30),
    (False, 96, 128, 2, 2, 0, 0)])
def test_attention_fused_rope(dev, neox, rope_dim, hd, n_heads, n_kv, pos, window):
    """Decode attention with RoPE fused in: rotates q and the new K, stores the new K/V (f16) at pos,
    and attends over the cache plus the new key."""
    check_fused_attention(dev, neox, rope_dim, hd, n_heads, n_kv, pos, window)


@pytest.mark.parametrize("shape", [(128, 2), (256, 8), (1024, 4)])
def test_attention_shapes(dev, shape):
    """Decode attention at other (workgroup size, keys per step) than the default."""
    if not dev.has_subgroups:
        pytest.skip("the decode attention kernel needs subgroups")
    if shape[0] > int(dev.limits.get("max-compute-invocations-per-workgroup", 256)) or shape[0] < dev.subgroup_size:
        pytest.skip(f"workgroup of {shape[0]} not possible here")
    splits = ops.attention_shape(dev, 4)[2]
    if ops.decode_attention_bytes(dev, 64, shape[0], splits) > dev.limit("max-compute-workgroup-storage-size", 16384):
        with pytest.raises(ValueError, match="workgroup memory"):      # a clear error, not a failed compile
            check_fused_attention(dev, False, 64, 64, 4, 2, 149, 0, shape=shape)
        return
    check_fused_attention(dev, False, 64, 64, 4, 2, 149, 0, shape=shape)


@pytest.mark.parametrize("hd,pos,window,splits,min_keys", [
    (64, 149, 0, 2, 16), (64, 149, 0, 8, 1), (64, 600, 0, 3, 64), (128, 600, 100, 4, 16),
    (64, 600, 0, 16, 1), (64, 20, 0, 4, 64), (128, 0, 0, 4, 1)])
def test_attention_split(dev, hd, pos, window, splits, min_keys):
    """Decode attention with a head's keys split over several workgroups and merged by the last to
    finish: splits that do not divide the keys, empty ones (min_keys 1 at 16 splits), a window, and
    positions where only one split is busy. The split counters are shared by every test on the device,
    so a count not reset for the next dispatch fails the cases after it."""
    if not dev.has_subgroups:
        pytest.skip("the decode attention kernel needs subgroups")
    wg = ops.attention_shape(dev, 4)[0]
    for _ in range(2):
        check_fused_attention(dev, False, hd, hd, 4, 2, pos, window, shape=(wg, 4, splits, min_keys))


def check_fused_attention(dev, neox, rope_dim, hd, n_heads, n_kv, pos, window, shape=None, sinks=None):
    rng = np.random.default_rng(pos + hd + rope_dim)
    base, scale, n = 10000.0, 1.0 / math.sqrt(hd), 1
    qkv, K, V = attn_setup(rng, n, pos, hd, n_heads, n_kv, window)
    for c in (K, V):                      # the new token's slot: must be written, never read
        c.view(np.uint16)[pos] = F16_NAN
    kb, vb = dev.upload(K), dev.upload(V)
    out = dev.upload(poisoned((n + 1, n_heads * hd)))
    st = state(dev, pos=pos, n=1, tok=0, out_row0=0)
    inv = dev.upload(inv_freq_turns(rope_dim, base).astype(np.float32))
    run(dev, ops.attention(dev, dev.upload(qkv), kb, vb, out, st, n_heads=n_heads, n_kv=n_kv, head_dim=hd,
                           scale=scale, window=window, inv_freq=inv, rope_dim=rope_dim, neox=neox,
                           shape=shape, sinks=None if sinks is None else dev.upload(np.asarray(sinks, np.float32))), 1)
    what = f"fused attention neox={neox} rope_dim={rope_dim} hd={hd} pos={pos} shape={shape} sinks={sinks}"
    gotK = dev.read(kb, np.float16)[: K.size].reshape(K.shape)
    gotV = dev.read(vb, np.float16)[: V.size].reshape(V.shape)
    other = np.arange(K.shape[0]) != pos
    assert np.array_equal(gotK.view(np.uint16)[other], K.view(np.uint16)[other]), what + ": K cache elsewhere"
    assert np.array_equal(gotV.view(np.uint16)[other], V.view(np.uint16)[other]), what + ": V cache elsewhere"
    wd = n_heads * hd
    q = qkv[0, :wd].reshape(n_heads, hd)
    k = qkv[0, wd:wd + n_kv * hd].reshape(n_kv, hd)
    v = qkv[0, wd + n_kv * hd:].reshape(n_kv, hd).astype(np.float64)
    qr, qmag = rope_ref(q, pos, rope_dim, base, neox)
    kr, kmag = rope_ref(k, pos, rope_dim, base, neox)
    assert_close(gotK[pos], kr, rope_tol(kmag, pos + 1) + f16_ulp(kr), what + " (new K in cache)")
    assert_close(gotV[pos], v, f16_ulp(v), what + " (new V in cache)")
    # reference attention with the cache as the kernel left it (its own f16 rounding of the new K/V)
    Kf = np.where(np.isnan(gotK), 0, gotK).astype(np.float64)
    Vf = np.where(np.isnan(gotV), 0, gotV).astype(np.float64)
    ref = attention_ref(qr[None], Kf, Vf, pos, scale, window, 0.0, n_heads, n_kv, sinks).reshape(1, -1)
    # q's rotation error (angle <= ang) moves each score by <= scale |q| |k| ang, and the output by
    # <= 2 max|V| times that
    ang = 2.4e-7 * (pos + 1) + 4e-6
    ds = scale * np.linalg.norm(q, axis=1).max() * np.linalg.norm(Kf[: pos + 1], axis=2).max() * ang
    tol = np.abs(Vf[: pos + 1]).max() * (ATT_TOL + 2 * ds)
    assert_close(read_f32(dev, out, (1, wd)), ref, tol, what)


# sink logits per head: near the scores, far above them (the output goes to ~0: the sink takes the
# weight), far below (no effect), and negative
SINKS4 = [0.7, 30.0, -40.0, -1.5]


@pytest.mark.parametrize("hd,n_heads,n_kv,n,pos,window", [
    (64, 4, 2, 3, 147, 0), (64, 4, 1, 3, 147, 100), (128, 4, 2, 45, 100, 50), (64, 4, 4, 5, 0, 0)])
@pytest.mark.parametrize("tiled", [True, False], ids=["tiled", "per-query"])
def test_attention_sinks(dev, hd, n_heads, n_kv, n, pos, window, tiled):
    """Attention sinks (gpt-oss): a logit per head in the softmax's denominator, in prompt chunks
    (tiled) and the unfused decode step's kernel."""
    check_attention(dev, hd, n_heads, n_kv, n, pos, window, 0.0, seed=hd + pos + n + 1, tiled=tiled,
                    sinks=SINKS4[:n_heads])


@pytest.mark.parametrize("pos,window,splits", [(149, 0, 1), (600, 0, 4), (600, 100, 3), (0, 0, 4)])
def test_attention_sinks_decode(dev, pos, window, splits):
    """Decode attention (RoPE fused) with sinks, its keys in one workgroup or split over several: the
    sink joins the denominator once, where the splits are merged."""
    if not dev.has_subgroups:
        pytest.skip("the decode attention kernel needs subgroups")
    wg = ops.attention_shape(dev, 4)[0]
    check_fused_attention(dev, True, 64, 64, 4, 2, pos, window, shape=(wg, 4, splits, 16), sinks=SINKS4)


# ---- glu -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("gelu_", [False, True])
@pytest.mark.parametrize("ffn,n", [(300, 3), (40, 5), (513, 2)])
def test_glu(dev, gelu_, ffn, n):
    rng = np.random.default_rng(ffn + n)
    gu = (rng.standard_normal((n, 2 * ffn)) * 3).astype(np.float32)
    gu[0, :8] = [-40, -12, -5, -1e-3, 0, 1e-3, 12, 40]          # tails and zero
    ob = dev.upload(poisoned((n + 1, ffn)))
    st = state(dev, pos=0, n=n)
    run(dev, ops.glu(dev, dev.upload(gu), ob, st, ffn=ffn, gelu=gelu_), n)
    got = read_f32(dev, ob, (n + 1, ffn))
    g, u = gu[:, :ffn].astype(np.float64), gu[:, ffn:].astype(np.float64)
    ref = (gelu(g) if gelu_ else silu(g)) * u
    assert_close(got[:n], ref, 1e-5 * np.abs(ref) + 1e-6 * np.abs(g * u) + 1e-30,
                 f"glu {'gelu' if gelu_ else 'silu'} ffn={ffn}")
    assert is_poison(got[n]).all()


def oai_glu(g, u, limit=7.0, alpha=1.702):
    """gpt-oss's clamped SwiGLU: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u) + 1)."""
    gc = np.minimum(g, limit)
    with np.errstate(over="ignore"):
        return gc / (1.0 + np.exp(-alpha * gc)) * (np.clip(u, -limit, limit) + 1.0)


OAI = ("oai", 7.0, 1.702)


@pytest.mark.parametrize("ffn,n", [(300, 3), (40, 5)])
def test_glu_oai(dev, ffn, n):
    """The gated activation variant of gpt-oss's experts (ACT_OAI), over both clamps and the tails."""
    rng = np.random.default_rng(ffn + n + 1)
    gu = (rng.standard_normal((n, 2 * ffn)) * 6).astype(np.float32)
    gu[0, :8] = [-40, -12, -7.5, -1e-3, 0, 6.9, 7.1, 40]
    gu[1, ffn:ffn + 8] = [-40, -7.1, -6.9, -1, 0, 6.9, 7.1, 40]
    ob = dev.upload(poisoned((n + 1, ffn)))
    run(dev, ops.glu(dev, dev.upload(gu), ob, state(dev, pos=0, n=n), ffn=ffn, act=OAI), n)
    got = read_f32(dev, ob, (n + 1, ffn))
    g, u = gu[:, :ffn].astype(np.float64), gu[:, ffn:].astype(np.float64)
    ref = oai_glu(g, u)
    assert_close(got[:n], ref, 1e-5 * np.abs(ref) + 1e-6 * np.abs(g * u) + 1e-30, f"glu oai ffn={ffn}")
    assert is_poison(got[n]).all()


@pytest.mark.parametrize("qtype", ["F16", "Q8_0"])
def test_expert_gemv_bias_oai(dev, qtype):
    """gpt-oss's experts on the decode GEMV: each token's picked experts' [gate; up] rows with that
    expert's biases added before the clamped SwiGLU, then their down rows with that expert's bias,
    weighted and added into y."""
    rng = np.random.default_rng(11)
    E, S, F, D, n = 4, 2, 64, 96, 3
    raw_gu, W_gu = make_weight(qtype, E * 2 * F, D, rng)
    raw_dn, W_dn = make_weight(qtype, E * D, F, rng)
    b_gu = rng.standard_normal((E, 2 * F)).astype(np.float32)         # each expert's [gate; up] biases
    b_dn = rng.standard_normal((E, D)).astype(np.float32)
    ids = np.array([[2, 0], [1, 3], [3, 2]], np.uint32)
    wts = rng.uniform(0.1, 1.0, (n, S)).astype(np.float32)
    x = (rng.standard_normal((n, D)) * 2).astype(np.float32)           # gates past the clamp too
    y0 = rng.standard_normal((n, D)).astype(np.float32)
    hb, yb, idb = dev.upload(poisoned((n * S + 1, F))), dev.upload(y0), dev.upload(ids)
    wgu, wdn = upload(dev, qtype, raw_gu, E * 2 * F, D), upload(dev, qtype, raw_dn, E * D, F)
    run(dev, gemv.expert_gemv(dev, wgu, E, dev.upload(x), hb, idb, slots=S, y_stride=F, glu=True, act=OAI,
                              bias=dev.upload(b_gu)), n)
    h = read_f32(dev, hb, (n * S + 1, F))
    assert is_poison(h[n * S]).all()
    xs = x.astype(np.float64)
    for t in range(n):
        for j, e in enumerate(ids[t]):
            Wg, Wu = W_gu[e * 2 * F: e * 2 * F + F], W_gu[e * 2 * F + F: (e + 1) * 2 * F]
            g, u = Wg @ xs[t] + b_gu[e, :F], Wu @ xs[t] + b_gu[e, F:]
            ref = oai_glu(g, u)
            tol = 2 * MM_RTOL * (np.abs(Wg) @ np.abs(xs[t]) * 9 + np.abs(Wu) @ np.abs(xs[t]) * 8) \
                + 1e-5 * np.abs(ref) + 1e-30
            assert_close(h[t * S + j], ref, tol, f"expert gate/up {qtype} token {t} expert {e}")
            assert np.abs(g).max() > 7, "no gate past the clamp"
    run(dev, gemv.expert_gemv(dev, wdn, E, hb, yb, idb, slots=S, y_stride=D, weights=dev.upload(wts),
                              bias=dev.upload(b_dn)), n)
    got = read_f32(dev, yb, (n, D))
    hs = h[: n * S].astype(np.float64)
    ref, tol = y0.astype(np.float64), np.abs(y0) * 1e-6 + 1e-30
    for t in range(n):
        for j, e in enumerate(ids[t]):
            Wd = W_dn[e * D:(e + 1) * D]
            ref = ref + np.eye(n)[t][:, None] * wts[t, j] * (Wd @ hs[t * S + j] + b_dn[e])
            tol = tol + np.eye(n)[t][:, None] * wts[t, j] * 2 * MM_RTOL * (np.abs(Wd) @ np.abs(hs[t * S + j]) + 1)
    assert_close(got, ref, tol + 1e-6 * np.abs(ref), f"expert down sum {qtype}")


# ---- sample --------------------------------------------------------------------------------------
TOK_POISON = 0xABCDEF01
# sample.wgsl has no subgroup operations (its reductions go through workgroup memory either way), so
# its tests run on the default device only
SAMPLER_DEVICE = pytest.mark.parametrize("dev", ["default"], indirect=True)


def sampler(dev, logits, *, temperature=0.0, top_k=0, top_p=1.0, seed=0, ntok=64):
    # padded to whole vec4s (as the model's logits buffer is) with values that would win if read
    lg = np.asarray(logits, np.float32)
    lb = dev.upload(np.concatenate([lg, np.full(-len(lg) % 4, 1e30, np.float32)]))
    tb = dev.upload(np.full(ntok, TOK_POISON, np.uint32))
    params = dev.upload(pack_params(*ops.sample_params(len(logits), temperature, top_k, top_p, seed)),
                        usage=UNIFORM)
    return lb, tb, params


def draw(dev, logits, st_vals, *, repeat=1, ntok=64, **kw):
    """Run the sampler `repeat` times in one submit from state st_vals; returns (tokens, final state)."""
    lb, tb, params = sampler(dev, logits, ntok=ntok, **kw)
    st = dev.upload(np.array(list(st_vals) + [0] * (8 - len(st_vals)), np.uint32))
    run(dev, ops.sample(dev, lb, tb, st, params), 1, repeat=repeat)
    return dev.read(tb, np.uint32)[:ntok], dev.read(st, np.uint32)[:4]


@SAMPLER_DEVICE
@pytest.mark.parametrize("vocab", [1000, 7, 769, 40001])     # 40001: several trips of the sampler's loads
def test_sample_greedy(dev, vocab):
    rng = np.random.default_rng(vocab)
    logits = rng.standard_normal(vocab).astype(np.float32) * 3 - 20       # all negative
    top = float(logits.max()) + 1.5
    ties = sorted(rng.choice(np.arange(1, vocab), min(3, vocab - 1), replace=False))
    logits[ties] = top
    toks, st = draw(dev, logits, (10, 3, 12, 2))
    assert toks[15] == ties[0], f"argmax with ties at {ties}: got {toks[15]}"
    assert list(st) == [13, 1, 15, 0], f"state not advanced: {list(st)}"
    assert (np.delete(toks, 15) == TOK_POISON).all(), "sample wrote another token slot"
    # unique max at the very end and at id 0; ties at 0
    for where in ([vocab - 1], [0], [0, vocab - 1]):
        lg = logits.copy()
        lg[where] = top + 1
        toks, _ = draw(dev, lg, (0, 1, 0, 0))
        assert toks[1] == where[0], f"argmax {where}: got {toks[1]}"


def kept_sets(logits, temperature, top_k, top_p):
    """The tokens the sampler may pick (ties at a threshold stay in) and their renormalized probs."""
    lg = np.asarray(logits, np.float64)
    keep = np.ones(len(lg), bool)
    if 0 < top_k < len(lg):
        keep &= lg >= np.sort(lg)[::-1][top_k - 1]
    p = np.where(keep, np.exp((lg - lg.max()) / temperature), 0.0)
    if top_p < 1.0:
        order = np.argsort(-lg, kind="stable")
        cum = np.cumsum(p[order]) / p.sum()
        m = int(np.searchsorted(cum, top_p)) + 1          # smallest prefix reaching top_p
        keep &= lg >= lg[order[m - 1]]
        p = np.where(keep, p, 0.0)
    return keep, p / p.sum()


def designed_logits(vocab=1000, seed=0):
    """A few clear leaders at scattered ids over a low tail; no two logits within 0.05 of a top-k/p edge."""
    rng = np.random.default_rng(seed)
    lg = rng.uniform(-9.0, -4.0, vocab)
    lead = [3.0, 2.5, 2.0, 1.5, 1.1, 0.6, 0.0, -0.7, -1.5, -2.4]
    ids = rng.choice(vocab, len(lead), replace=False)
    lg[ids] = lead
    return lg.astype(np.float32), ids


SAMPLE_CASES = {
    # name: (temperature, top_k, top_p)
    "T1": (1.0, 0, 1.0),
    "T0.7_topk5": (0.7, 5, 1.0),
    "T0.25_topk3": (0.25, 3, 1.0),          # temperature matters: p = .87/.12/.02 (at T=1: .51/.31/.19)
    "T1.3_topp0.8": (1.3, 0, 0.8),
    # top-p inside top-k, with the nucleus edge (2.5) sharing no bit pattern with the top-k edge (1.5):
    # the nucleus is {3.0, 2.5}; the logit 2.0 lies between the two thresholds and must never be drawn
    "T1_topk4_topp0.6": (1.0, 4, 0.6),
    "T1_topk8_topp0.75": (1.0, 8, 0.75),
    "T0.5_topk50_topp0.9": (0.5, 50, 0.9),
}


@SAMPLER_DEVICE
@pytest.mark.parametrize("case", list(SAMPLE_CASES))
def test_sample_distribution(dev, case):
    """Every draw lies in the allowed set; frequencies match the restricted, renormalized softmax."""
    i = list(SAMPLE_CASES).index(case)
    check_draws(dev, case, designed_logits(seed=len(case))[0], *SAMPLE_CASES[case], seeds=(1 + 2 * i, 2 + 2 * i))


@SAMPLER_DEVICE
def test_sample_distribution_large_vocab(dev):
    """40001 logits: each thread's chunk of the draw spans several load batches; leaders sit at the
    last id of a chunk (4 x 20 logits per thread at 512 threads) and at the last id."""
    logits, ids = designed_logits(vocab=40001, seed=3)
    for lead, at in zip(ids[:3], (4 * 20 * 3 - 1, 40000, 4 * 20 * 7 - 1)):     # the 3 largest moved there
        logits[[lead, at]] = logits[[at, lead]]
    check_draws(dev, "T1 large vocab", logits, 1.0, 0, 1.0, seeds=(7, 8))


def sample_uniform(seed, pos):
    """The sampler's uniform in [0, 1) at (seed, position): a PCG hash, its top 24 bits."""
    def pcg(v):
        s = (v * 747796405 + 2891336453) & 0xFFFFFFFF
        w = (((s >> ((s >> 28) + 4)) ^ s) * 277803737) & 0xFFFFFFFF
        return (w >> 22) ^ w
    return (pcg(pcg(seed) ^ (pos * 2654435761 & 0xFFFFFFFF)) >> 8) / 2 ** 24


def expected_draws(keep, prob, seed, positions, tol=1e-4):
    """The token the sampler must draw at each position: walking the kept ids in ascending order, the
    first where the running probability passes the uniform. -1 where the uniform lies within `tol` of
    either end of that token's interval (f32 sums could move it across)."""
    ids = np.flatnonzero(keep)
    hi = np.cumsum(prob[ids])
    lo = hi - prob[ids]
    out = np.full(len(positions), -1)
    for n, pos in enumerate(positions):
        u = sample_uniform(seed, pos)
        i = min(int(np.searchsorted(hi, u, side="right")), len(ids) - 1)
        if u - lo[i] > tol and hi[i] - u > tol:
            out[n] = ids[i]
    return out


def check_sequence(case, drawn, keep, prob, seed, pos0):
    want = expected_draws(keep, prob, seed, range(pos0, pos0 + len(drawn)))
    bad = (want >= 0) & (drawn != want)
    assert not bad.any(), (
        f"{case} seed {seed}: {bad.sum()} of {(want >= 0).sum()} draws are not the token the walk in id order "
        f"reaches, e.g. position {pos0 + np.flatnonzero(bad)[0]}: {drawn[bad][0]}, expected {want[bad][0]}")


def check_draws(dev, case, logits, temperature, top_k, top_p, seeds):
    """Membership, the exact token where the walk's rounding cannot matter (check_sequence), and the
    frequencies (see the module docstring)."""
    keep, prob = kept_sets(logits, temperature, top_k, top_p)
    N = 200                                               # 100 positions per seed
    per = N // len(seeds)
    counts = np.zeros(len(logits))
    for seed in seeds:
        toks, st = draw(dev, logits, (17, 1, 0, 0), repeat=per, ntok=per + 2, temperature=temperature,
                        top_k=top_k, top_p=top_p, seed=seed)
        drawn = toks[1:per + 1]
        assert list(st) == [17 + per, 1, per, 0]
        assert (drawn < len(logits)).all(), f"token ids out of range: {drawn[drawn >= len(logits)]}"
        outside = ~keep[drawn]
        assert not outside.any(), (
            f"{case}: {outside.sum()} of {len(drawn)} draws outside the allowed set ({keep.sum()} tokens); "
            f"e.g. id {drawn[outside][0]} logit {logits[drawn[outside][0]]}; allowed logits "
            f"{sorted(logits[keep].tolist(), reverse=True)[:10]}")
        check_sequence(case, drawn, keep, prob, seed, 18)      # the first draw is at position 17 + 1
        counts += np.bincount(drawn, minlength=len(logits))
    freq = counts / N
    bound = 4.5 * np.sqrt(prob * (1 - prob) / N) + 0.01
    worst = int(np.argmax(np.abs(freq - prob) - bound))
    assert np.abs(freq[worst] - prob[worst]) <= bound[worst], \
        f"{case}: token {worst}: freq {freq[worst]:.3f} vs p {prob[worst]:.3f} (bound {bound[worst]:.3f})"
    big = prob * N >= 5
    exp_ = np.append(prob[big] * N, N - prob[big].sum() * N)
    obs = np.append(counts[big], N - counts[big].sum())
    if exp_[-1] < 5:
        exp_, obs = exp_[:-1], obs[:-1]
    chi2 = float((((obs - exp_) ** 2) / np.maximum(exp_, 1e-9)).sum())
    dof = max(len(exp_) - 1, 1)
    assert chi2 < dof + 8 * math.sqrt(2 * dof) + 10, f"{case}: chi2 {chi2:.1f} with {dof} dof"


@SAMPLER_DEVICE
def test_sample_topk_topp_random(dev):
    """Random (undesigned) logits: every draw inside the top-k set and inside the top-p nucleus, and the
    token the walk in id order reaches."""
    rng = np.random.default_rng(5)
    # 40001 logits: several trips of each pass's loads, and chunks longer than one load batch; kept sets
    # of 1024 (the capacity of the compacted survivors at 512 threads: 2 per thread) and 1025 (over it:
    # the whole-vocabulary path with the radix select's threshold); a Llama 3 vocabulary
    for trial, (top_k, top_p, T, vocab) in enumerate([(200, 0.8, 1.5, 1000), (40, 0.9, 1.0, 1000),
                                                       (10, 0.5, 0.8, 1000), (300, 0.95, 1.0, 40001),
                                                       (1024, 0.97, 1.0, 40001), (1025, 0.97, 1.0, 40001),
                                                       (40, 0.95, 0.8, 128256)]):
        logits = (rng.standard_normal(vocab) * 2).astype(np.float32)
        keep, prob = kept_sets(logits, T, top_k, top_p)
        toks, _ = draw(dev, logits, (3, 1, 0, 0), repeat=100, ntok=102, temperature=T, top_k=top_k,
                       top_p=top_p, seed=100 + trial)
        drawn = toks[1:101]
        bad = ~keep[drawn]
        what = f"trial {trial} (top_k {top_k}, top_p {top_p}, T {T})"
        assert not bad.any(), (f"{what}: {bad.sum()} of 100 draws "
                               f"outside the nucleus ({keep.sum()} tokens), e.g. id {drawn[bad][0]}")
        check_sequence(what, drawn, keep, prob, 100 + trial, 4)


@SAMPLER_DEVICE
def test_sample_topk_large_vocab(dev):
    """top_k over 40,001 logits (the radix select, and top-p and the draw over the survivors compacted in
    workgroup memory): alone, with top-p, with ties at the k-th value (7 kept at top_k 4), with the
    nucleus edge inside a tie, and over all-negative logits."""
    logits, ids = designed_logits(vocab=40001, seed=11)
    rng = np.random.default_rng(11)
    tail = np.setdiff1d(np.arange(40001), ids)
    tied = logits.copy()
    tied[rng.choice(tail, 3, replace=False)] = 1.5         # the 4th largest, 3 more times
    cases = {"topk4": (logits, 1.0, 4, 1.0), "topk8 topp0.75": (logits, 1.0, 8, 0.75),
             "topk4 ties at the 4th": (tied, 1.0, 4, 1.0), "topk9 topp0.85 nucleus edge in the ties": (tied, 1.0, 9, 0.85),
             "topk6 topp0.9 all negative": (logits - 30, 0.7, 6, 0.9)}
    for i, (case, (lg, T, k, p)) in enumerate(cases.items()):
        check_draws(dev, case, lg, T, k, p, seeds=(20 + 2 * i, 21 + 2 * i))


@SAMPLER_DEVICE
def test_sample_logprobs(dev):
    """The batched sampler's log-probabilities against a float64 log-softmax: each row's token drawn
    and its slot's top_logprobs most likely tokens (ids exact: larger value first, lowest id on ties).
    Rows: greedy top 5 with a tie inside the top 5; drawn (T 0.8, top_k 50) top 20; a padding row;
    greedy top 20 where 2,000 logits (over the sampler's 1,024 survivors) tie at the 3rd value; greedy
    top 0 (only the token's). Each row writes its own slot's position and nothing else. The rows'
    log-sum-exps come from 10 parts of 4,096 logits, the last part short."""
    V, HIST, W = 40001, 8, 1 + 2 * ops.TOPN
    n4 = -(-V // 4)
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((4, V)) * 2
    rows[0, [7, 39000]] = rows[0].max() - 0.5                  # equal, both among the top 5
    lead = rng.choice(V, 2, replace=False)
    rows[2] = -4.0
    rows[2, lead] = (3.0, 2.0)
    rows[2, rng.choice(np.setdiff1d(np.arange(V), lead), 2000, replace=False)] = 1.0
    rows = rows.astype(np.float32)
    # (slot, temperature, top_k, top logprobs) a row; None: padding
    spec = [(2, 0.0, 0, 5), (0, 0.8, 50, 20), None, (1, 0.0, 0, 20), (3, 0.0, 0, 0)]
    lg = np.full((len(spec), 4 * n4), 1e30, np.float32)        # padding lanes that would win if read
    lg[[0, 1, 3, 4], :V] = rows
    params = np.zeros((4, 8), np.uint32)
    for sp in filter(None, spec):
        params[sp[0]] = np.frombuffer(pack_params(*ops.sample_params(V, sp[1], sp[2], 1.0, 9, sp[3])), np.uint32)
    slots = np.array([0xFFFFFFFF if sp is None else sp[0] for sp in spec], np.uint32)
    pos = np.array([3, 1, 5, 2], np.uint32)                   # a slot's position: the new token goes after it
    tb = dev.upload(np.full(4 * HIST, TOK_POISON, np.uint32))
    lp = dev.upload(poisoned(4 * HIST * W))
    pb = dev.upload(pos.copy())
    paging = ops.Paging(None, 16, 1, rows=dev.upload(slots), seq_pos=pb, hist=HIST)
    run(dev, ops.sample(dev, dev.upload(lg), tb, None, dev.upload(params), paging=paging, batch=len(spec),
                        logprobs=lp, vocab=V), 1)
    toks, out = dev.read(tb, np.uint32).reshape(4, HIST), read_f32(dev, lp, (4, HIST, W))
    assert (dev.read(pb, np.uint32)[:4] == pos + 1).all()
    for b, sp in enumerate(spec):
        if sp is None:
            continue
        s, temperature, _, top = sp
        row = lg[b, :V].astype(np.float64)
        ref = row - row.max() - np.log(np.exp(row - row.max()).sum())
        tok = int(toks[s, pos[s] + 1])
        if temperature == 0:
            assert tok == int(np.argmax(row)), f"row {b}: greedy token"
        got = out[s, pos[s] + 1]
        assert abs(got[0] - ref[tok]) < 1e-4, f"row {b}: the token's logprob {got[0]} against {ref[tok]}"
        want = np.argsort(-row, kind="stable")[:top]
        assert got[1:1 + 2 * top:2].view(np.uint32).tolist() == want.tolist(), f"row {b}: top {top} ids"
        assert np.allclose(got[2:2 + 2 * top:2], ref[want], atol=1e-4), f"row {b}: top {top} logprobs"
        assert (got[1 + 2 * top:].view(np.uint32) == POISON).all(), f"row {b}: wrote past its top {top}"
        others = np.delete(out[s], pos[s] + 1, axis=0)
        assert (others.view(np.uint32) == POISON).all(), f"row {b}: wrote another position"


@SAMPLER_DEVICE
@pytest.mark.parametrize("ties,top_p", [(1014, 1.0), (1014, 0.4), (1014, 0.8), (1015, 1.0), (1015, 0.8)])
def test_sample_topk_capacity(dev, ties, top_p):
    """top_k 11 over 10 leaders and `ties` logits equal at the 11th value, the rest lower: a kept set of
    1024 (the survivors' capacity at 512 threads: compacted, 2 per thread) or 1025 (over it: the
    whole-vocabulary path with the radix select's threshold). The ties hold about half the mass:
    top_p 0.4 cuts inside the leaders, 0.8 keeps the ties whole. The two largest sit at the first and
    the last id: the ends of the survivors."""
    logits, ids = designed_logits(vocab=40001, seed=13)
    for lead, at in zip(ids[:2], (40000, 0)):
        logits[[lead, at]] = logits[[at, lead]]
    rng = np.random.default_rng(13)
    logits[rng.choice(np.flatnonzero(logits < -3.5), ties, replace=False)] = -3.0      # from the tail
    keep, _ = kept_sets(logits, 1.0, 11, top_p)
    assert keep.sum() == (4 if top_p == 0.4 else 10 + ties)
    check_draws(dev, f"{ties} ties top_p {top_p}", logits, 1.0, 11, top_p, seeds=(ties, ties + int(10 * top_p)))


@SAMPLER_DEVICE
def test_sample_seed_determinism(dev):
    logits, _ = designed_logits(seed=9)
    got = {}
    for seed in range(12):
        a, _ = draw(dev, logits, (40, 2, 5, 1), temperature=1.5, seed=seed)
        b, _ = draw(dev, logits, (40, 2, 5, 1), temperature=1.5, seed=seed)
        assert a[7] == b[7], f"seed {seed}: {a[7]} then {b[7]}"
        assert (np.delete(a, 7) == TOK_POISON).all()
        got[seed] = int(a[7])
    assert len(set(got.values())) > 1, f"12 seeds all drew the same token: {got}"


@pytest.mark.parametrize("qa,qb,K", [("Q4_K", "Q6_K", 512), ("Q4_1", "Q8_0", 160), ("Q8_0", "F16", 96)])
@pytest.mark.parametrize("norm_", [False, True], ids=["plain", "norm"])
def test_gemv_pair(dev, qa, qb, K, norm_):
    """Two weights of different types in one dispatch (decode's Q+K / V): rows of the first, then the
    second, into consecutive y rows; odd row counts; with and without the folded RMSNorm."""
    rng = np.random.default_rng(K + norm_)
    ra, rb, eps = 37, 11, 1e-5
    raw_a, Wa = make_weight(qa, ra, K, rng)
    raw_b, Wb = make_weight(qb, rb, K, rng)
    wa, wb = upload(dev, qa, raw_a, ra, K), upload(dev, qb, raw_b, rb, K)
    x = (rng.standard_normal((1, K)) * 2 + 0.3).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    ys = ra + rb + 3
    y0 = poisoned((2, ys))
    yb = dev.upload(y0)
    ds = gemv.gemv_pair(dev, wa, wb, dev.upload(x), yb, y_stride=ys,
                       **(dict(norm=dev.upload(nw), eps=eps) if norm_ else {}))
    assert len(ds) == 1
    run(dev, ds, 1)
    got = read_f32(dev, yb, (2, ys))
    xin = rms(x.astype(np.float64), nw, eps) if norm_ else x.astype(np.float64)
    W = np.concatenate([Wa, Wb])
    ref = xin @ W.T
    tol = 2 * MM_RTOL * (np.abs(xin) @ np.abs(W).T) + 1e-30
    assert_close(got[:1, :ra + rb], ref, tol, f"gemv_pair {qa}+{qb}")
    assert is_poison(got[1]).all() and is_poison(got[0, ra + rb:]).all()


def gemv_case(dev, case: str, seed: int, int8_x=False, shape=None, x_edit=None):
    """A decode GEMV from "TYPE[+TYPE] K [glu] [norm]": random weights (a pair: gemv.gemv_pair), x and a
    norm weight, its dispatches into a poisoned y (not run), and W, the dequantized rows stacked.
    x_edit(x) may change x in place before it is uploaded."""
    rng = np.random.default_rng(seed)
    types, K = case.split()[0].split("+"), int(case.split()[1])
    glu_, norm_, rows, eps = "glu" in case, "norm" in case, 37, 1e-5
    mats = [make_weight(q, 2 * rows if glu_ else rows, K, rng) for q in types]
    ws = [upload(dev, q, raw, W.shape[0], K) for q, (raw, W) in zip(types, mats)]
    for w in ws:
        assert w.qtype.int8_dot or not int8_x
        w.int8_x = int8_x
    x = (rng.standard_normal((1, K)) * 2 + 0.3).astype(np.float32)
    if x_edit is not None:
        x_edit(x)
    nw = rng.uniform(0.5, 1.5, K).astype(np.float32)
    out_rows = rows * len(ws)
    yb = dev.upload(poisoned((1, out_rows)))
    kw = dict(norm=dev.upload(nw), eps=eps) if norm_ else {}
    if len(ws) == 2:
        ds = gemv.gemv_pair(dev, ws[0], ws[1], dev.upload(x), yb, y_stride=out_rows, shape=shape, **kw)
    else:
        ds = gemv.gemv(dev, ws[0], dev.upload(x), yb, y_stride=out_rows, glu=glu_, shape=shape, **kw)
    return SimpleNamespace(ds=ds, yb=yb, x=x, nw=nw, eps=eps, K=K, rows=rows, glu=glu_, norm=norm_,
                           out_rows=out_rows, W=np.concatenate([W for _, W in mats]))


def gemv_input(c):
    """The input gemv_case's GEMV dots (float64): x, or RMSNorm(x) * the norm weight with norm."""
    return rms(c.x.astype(np.float64), c.nw, c.eps) if c.norm else c.x.astype(np.float64)


def gemv_ref(c, xin, bound, act_rtol=0.0):
    """(float64 result, tolerance) of gemv_case `c` on input xin. bound(W rows) is a plain dot's error
    bound; with GLU it goes through act(gate) * up (the activation's slope stays under 1.2), plus
    act_rtol of the result for the activation's own rounding."""
    W, rows = c.W, c.rows
    if c.glu:
        g, u = xin @ W[:rows].T, xin @ W[rows:].T
        ref = silu(g) * u
        return ref, (1.2 * bound(W[:rows]) * np.abs(u) + np.abs(silu(g)) * bound(W[rows:])
                     + act_rtol * np.abs(ref) + 1e-30)
    ref = xin @ W.T
    return ref, bound(W) + 1e-30


# decode GEMVs with integer-dot decoders: every such type, fused GLU + norm, the Q4_K + Q6_K pair, and
# 2 chunk steps per trip
INT_DOT_CASES = ["Q4_0 256", "Q4_1 160", "Q8_0 96", "Q4_K 512", "Q6_K 512", "Q4_K 512 glu norm",
                 "Q8_0 256 glu", "Q4_K+Q6_K 512 norm", "Q4_0 1056 steps"]


@pytest.mark.parametrize("case", ["Q8_0 1024", "Q4_K 512 glu norm", "Q4_K+Q6_K 512 norm"])
def test_gemv_every_tuned_shape(dev, case):
    """Every shape the autotuner may pick for a decode GEMV (gemv.candidates and their refinements:
    workgroup size, rows per workgroup, chunk steps, integer or f32 x) computes it (the Tunable's
    rebuild), for a plain, a fused GLU + norm and a paired GEMV."""
    c = gemv_case(dev, case, len(case))
    tune = c.ds[0].tune
    shapes = tune.candidates()
    assert len(shapes) >= 4 and len(set(shapes)) == len(shapes)
    shapes += [r for s in shapes for r in tune.refine(s)]      # and what the tuner tries after
    assert_shapes(dev, c, shapes, case)


def assert_shapes(dev, c, shapes, case):
    """gemv_case `c` rebuilt in each shape computes its float64 result within the f32 tolerance."""
    xin = gemv_input(c)
    ref, tol = gemv_ref(c, xin, lambda Wp: 2 * MM_RTOL * (np.abs(xin) @ np.abs(Wp).T), act_rtol=1e-5)
    for shape in shapes:
        dev.write(c.yb, poisoned((1, c.out_rows)))
        run(dev, c.ds[0].tune.rebuild(shape), 1)
        assert_close(read_f32(dev, c.yb, (1, c.out_rows)), ref, tol, f"{case} shape {shape}")


@pytest.mark.parametrize("case", ["Q8_0 1024", "Q4_K 512 glu norm", "Q4_K+Q6_K 512 norm", "Q4_0 1056",
                                  "Q6_K 768"])
def test_gemv_row_groups(dev, case):
    """Several row groups per workgroup (gemv.wgsl HOIST: each lane's x chunks converted once for all
    of them) compute the GEMV, x24 and f32 x alike, their row sums reduced by subgroupAdd or by the
    butterfly (2, 4 and 8 values, rounded up from 3 and 6; 16 with GLU's 8 rows take subgroupAdd),
    with and without the next group's weights
    prefetched: group counts that do and do not divide the 37 rows,
    lanes past a row's chunks (Q4_K 512: 16 chunks on 32 lanes; Q4_0 1056: 33 chunks in 2 steps), a
    fused GLU + norm and the Q4_K + Q6_K pair."""
    c = gemv_case(dev, case, len(case) * 3)
    lanes = max(32, dev.subgroup_size or 1)
    assert_shapes(dev, c, [(lanes * (1 + ("1056" in case)), rows, 1 + ("1056" in case), groups, x24, bf, pf)
                           for rows, groups in ((1, 2), (2, 3), (3, 5), (4, 8), (8, 3))
                           for x24, bf, pf in ((0, 1, 1), (1, 1, 0), (1, 0, 1), (1, 1, 1))], case)


@pytest.mark.parametrize("case", ["F32 96", "F32 160 norm", "F32 96 glu", "F32 288 glu norm", "Q5_0 96",
                                  "Q5_0 160 norm", "Q5_0 256 glu", "Q5_0 1056 glu norm", "F32+Q5_0 160 norm"])
def test_gemv_f32_q5_0(dev, case):
    """The decode GEMV over F32 (a wide block of 32 floats in 8 vec4 loads) and Q5_0 (20-byte blocks, so
    each one's words start at any word of a vec4: K of 3, 5, 8 and 33 blocks puts them everywhere), plain,
    with the norm, GLU, both, and paired (DUAL); Q5_0 with GLU, with GLU and the norm, and the F32 + Q5_0
    pair in every shape the tuner may pick where subgroups are on, the others in the default shape
    (every shape of every case costs a minute on lavapipe)."""
    c = gemv_case(dev, case, len(case) * 5)
    types = case.split()[0].split("+")
    assert [d.label for d in c.ds] == ["gemv." + "+".join(types)]
    tune = c.ds[0].tune
    every = dev.has_subgroups and case in ("Q5_0 256 glu", "Q5_0 1056 glu norm", "F32+Q5_0 160 norm")
    shapes = tune.candidates() if every else tune.candidates()[:1]
    assert_shapes(dev, c, shapes + [r for s in shapes for r in tune.refine(s)], case)


@pytest.mark.parametrize("K,kernel", [(96, "gemv"), (40, "matmul")])
def test_matmul_f32_decode_routing(dev, K, kernel):
    """ops.matmul sends a decode F32 matmul to the decode GEMV when K is whole wide blocks (32 floats),
    else to matmul.wgsl; both compute it."""
    rng = np.random.default_rng(K)
    raw, W = make_weight("F32", 37, K, rng)
    w = upload(dev, "F32", raw, 37, K)
    x = rng.standard_normal((2, K)).astype(np.float32)
    yb = dev.upload(poisoned((3, 37)))
    ds = ops.matmul(dev, w, dev.upload(x), yb, state(dev, n=2), tt=1, y_stride=37)
    assert [d.label for d in ds] == [f"{kernel}.F32"]
    run(dev, ds, 2)
    got = read_f32(dev, yb, (3, 37))
    xe = x.astype(np.float64)
    assert_close(got[:2], xe @ W.T, MM_RTOL * (np.abs(xe) @ np.abs(W).T) + 1e-30, f"F32 K={K}")
    assert is_poison(got[2]).all()


def test_gemv_row_groups_need_one_trip(dev):
    """A row-group shape whose lanes do not cover a row's chunks in one trip is refused, by name."""
    c = gemv_case(dev, "Q8_0 1024", 5)                    # 32 chunks a row
    with pytest.raises(ValueError, match="cover a row's 32 chunks"):
        c.ds[0].tune.rebuild((16, 2, 1, 4, 0))


def test_gemv_row_group_candidates(dev):
    """The tuner offers row-group shapes for large matrices (8B-like gate+up, down and the Q4_K+Q6_K
    pair), each one that gemv.wgsl can build (hoist_ok), groups of 8 rows except with GLU (16 weight
    rows a group), and none where they would leave under 128 workgroups."""
    def weight(name, rows, cols):
        return SimpleNamespace(qtype=QUANT_TYPES[name], rows=rows, cols=cols, int8_x=False, x24=True)
    for ws, glu in (([weight("Q4_K", 28672, 4096)], True), ([weight("Q6_K", 4096, 14336)], False),
                    ([weight("Q4_K", 5120, 4096), weight("Q6_K", 1024, 4096)], False),
                    ([weight("Q4_K", 200, 4096)], False)):
        default = gemv.default_shape(dev, ws[0], glu)._replace(int_x=1, bfly=1)
        grouped = [s for s in gemv.candidates(dev, ws, glu, default) if s[3] > 1]
        out_rows = sum(w.rows // (1 + glu) for w in ws)
        assert bool(grouped) == (out_rows >= 256), (ws[0].rows, grouped)
        assert any(s[1] == 8 for s in grouped) == (out_rows >= 2048 and not glu), (ws[0].rows, grouped)
        for s in grouped:
            assert gemv.hoist_ok(dev, ws, s) and out_rows >= 128 * s[1] * s[3], s


def x24_edit(x):
    """Runs of 16 that a fixed-point x must handle: zeros, near the f32 normal floor, and one whose
    largest element is 2^15 times the rest (a 16-bit fixed point would lose those)."""
    x[0, :16] = 0
    x[0, 16:32] *= 1e-30
    x[0, 32] = 64
    x[0, 33:48] *= 1e-3


@pytest.mark.parametrize("case", INT_DOT_CASES)
def test_gemv_x24(dev, case):
    """A tuned shape's x24 (gemv.wgsl X24: x as 24-bit fixed point per 16-element run, integer dots) is
    as accurate as f32 x: both within 2^-21 of sum_i max|x over i's run| * |w_i| of the float64
    result (on lavapipe x24 reached 1.2 / 4 of that, f32 x 0.3 / 4; a 16-bit x would be 64x over),
    for every type with an integer-dot decoder, fused GLU + norm, the Q4_K + Q6_K pair and 2 chunk
    steps per trip. And x24 is a different computation from f32 x, not the same kernel."""
    c = gemv_case(dev, case, len(case) * 7, x_edit=x24_edit)
    tune = c.ds[0].tune
    shape = (32, 3, 2, 1) if "steps" in case else tune.candidates()[0][:4]
    assert any(s[4] for s in tune.candidates())          # the tuner tries x24 for these types
    xe = gemv_input(c)
    run_max = np.repeat(np.abs(xe).reshape(-1, 16).max(axis=1), 16)[None]
    ref, tol = gemv_ref(c, xe, lambda Wp: 2.0 ** -21 * (run_max @ np.abs(Wp).T))
    got = {}
    for x24 in (0, 1):
        dev.write(c.yb, poisoned((1, c.out_rows)))        # each run must write every row itself
        run(dev, tune.rebuild(shape + (x24,)), 1)
        got[x24] = read_f32(dev, c.yb, (1, c.out_rows))
        assert_close(got[x24], ref, tol, f"{case} x24={x24}")
    assert (got[0] != got[1]).any(), case


def int8_rounded(x):
    """x as the int8-activation GEMV sees it (gemv.wgsl INT_DOT without X24): each aligned run of 16 elements rounded
    to int8 with one scale, d = max|x| / 127 (float64 result)."""
    g = x.astype(np.float32).reshape(-1, 16)
    amax = np.abs(g).max(axis=1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.round(g * inv)
    assert np.abs(q).max() <= 127
    return (q * (amax / 127)).astype(np.float64).reshape(x.shape), (amax / 127).repeat(16, 1).reshape(x.shape)


@pytest.mark.parametrize("case", INT_DOT_CASES)
def test_gemv_int8_x(dev, case):
    """The int8-activation GEMV (the GPU default; weights flagged int8_x) computes the dot of the dequantized
    weights with x rounded to int8 per 16-element run: against NumPy on that rounded x, for every type with an
    int8 decoder, fused GLU + norm, the Q4_K + Q6_K pair, and 2 chunk steps per trip."""
    c = gemv_case(dev, case, len(case) * 7, int8_x=True, shape=(32, 3, 2, 1, 1) if "steps" in case else None)
    ds, x, nw, eps, K, norm_ = c.ds, c.x, c.nw, c.eps, c.K, c.norm
    assert all("int8x" in d.tune.key for d in ds)
    run(dev, ds, 1)
    got = read_f32(dev, c.yb, (1, c.out_rows))
    if norm_:         # the kernel rounds x * norm weight and applies 1/rms after the dot
        scale = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2) + eps)
        xq, d = int8_rounded(x * nw)
        xq, d = xq * scale, d * scale
    else:
        xq, d = int8_rounded(x)
    # f32 sums in another order, plus one rounding step (d) where float ties round differently
    ref, tol = gemv_ref(c, xq, lambda Wp: 2 * MM_RTOL * (np.abs(xq) @ np.abs(Wp).T)
                        + 1.01 * (d @ np.abs(Wp).T) / K * 2)
    assert_close(got, ref, tol, case)
    # and the rounding is what the kernel did: the exact-x result is measurably further away
    exact, _ = gemv_ref(c, gemv_input(c), lambda Wp: 0.0)
    assert np.abs(got - exact).max() > 10 * np.abs(got - ref).max(), case


@pytest.mark.parametrize("case", ["Q4_K 512", "Q4_K+Q6_K 512 norm"])
def test_gemv_int8_x_has_an_f32_twin(dev, case):
    """The tuner's default for int8-flagged weights takes integer x, and it tries each pick's f32-x twin
    too (where an adapter's integer dots are slow the twin wins): the twin dots f32 x, as accurate as
    the x24 test's bound, where the int8 shape is measurably further from the exact result."""
    c = gemv_case(dev, case, 13, int8_x=True)
    tune = c.ds[0].tune
    best = gemv.GemvShape.of(tune.candidates()[0])
    assert best.int_x == 1 and "int8x" in tune.key
    twin = [t for t in gemv.refine(best) if t.int_x == 0]
    assert twin == [best._replace(int_x=0)]
    xe = gemv_input(c)
    run_max = np.repeat(np.abs(xe).reshape(-1, 16).max(axis=1), 16)[None]
    exact, tol = gemv_ref(c, xe, lambda Wp: 2.0 ** -21 * (run_max @ np.abs(Wp).T))
    got = {}
    for s in (best, twin[0]):
        dev.write(c.yb, poisoned((1, c.out_rows)))
        run(dev, tune.rebuild(s), 1)
        got[s.int_x] = read_f32(dev, c.yb, (1, c.out_rows))
    assert_close(got[0], exact, tol, f"{case} f32 twin")
    assert np.abs(got[1] - exact).max() > 10 * np.abs(got[0] - exact).max(), case


@pytest.mark.parametrize("case", ["Q4_K 1024 glu norm", "Q4_K+Q6_K 512 norm"])
def test_batch_gemv_shapes_keep_each_tokens_sums(dev, case):
    """A batched decode GEMV (2 tokens a workgroup) in the shapes the tuner may pick for it
    (gemv.batch_candidates of a single token's shape: other rows, chunk steps, row groups) gives each
    token the bits it gets alone in that single-token shape, so a sequence's greedy tokens depend
    neither on its batch nor on the batch's tuning. Single-token shapes with and without the butterfly,
    with integer and f32 x."""
    rng = np.random.default_rng(29)
    types, K = case.split()[0].split("+"), int(case.split()[1])
    glu_, norm_, rows, n = "glu" in case, "norm" in case, 512, 4      # rows for row groups of 2 rows
    ws = []
    for q in types:
        raw, W = make_weight(q, 2 * rows if glu_ else rows, K, rng)
        ws.append(upload(dev, q, raw, W.shape[0], K))
        ws[-1].int8_x = True
    out_rows = rows * len(ws)
    xb = dev.upload((rng.standard_normal((n, K)) * 2 + 0.3).astype(np.float32))
    kw = dict(norm=dev.upload(rng.uniform(0.5, 1.5, K).astype(np.float32)), eps=1e-5) if norm_ else {}

    def out(shape, batch):
        yb = dev.upload(poisoned((n, out_rows)))
        if len(ws) == 2:
            ds = gemv.gemv_pair(dev, *ws, xb, yb, y_stride=out_rows, shape=shape, batch=batch, nt_max=2, **kw)
        else:
            ds = gemv.gemv(dev, ws[0], xb, yb, y_stride=out_rows, glu=glu_, shape=shape, batch=batch, nt_max=2, **kw)
        run(dev, ds, n)
        return ds[0].tune.key, read_f32(dev, yb, (n, out_rows)).view(np.uint32)

    default = gemv.default_shape(dev, ws[0], glu_)._replace(int_x=1)
    for one in (default._replace(rows=2, bfly=1), default._replace(rows=2, bfly=0, int_x=0)):
        key, alone = out(one, 0)
        assert not is_poison(alone.view(np.float32)).any()
        cands = gemv.batch_candidates(dev, ws, glu_, one, 2)
        assert cands[0] == one and {c.groups for c in cands} > {1} and len({c.rows for c in cands}) >= 4
        assert all(gemv.lane_arithmetic(dev, c, glu_) == gemv.lane_arithmetic(dev, one, glu_) for c in cands)
        for s in [cands[0]] + [cands[i] for i in rng.permutation(len(cands) - 1)[:4] + 1]:
            bkey, together = out(s, n)
            assert bkey == key + " nt2" and gemv.batch_key(bkey) and not gemv.batch_key(key)
            assert np.array_equal(together, alone), (case, one, s)


# ---- submission and readback ---------------------------------------------------------------------
@pytest.mark.parametrize("indexed", [True, False])
def test_read_after_submission(indexed):
    """Device.read_after returns what its submission copied into a staging buffer, with later
    submissions still queued (by index through wgpu-native, else map_sync), in any order of reads."""
    from shaderlm.gpu.backend import BufferUsage
    dev = Device()
    if not indexed:
        dev.indexed = None
    elif dev.indexed is None:
        pytest.skip("this WebGPU package has no indexed submission")
    rng = np.random.default_rng(5)
    blocks = [rng.integers(0, 2**32, 64, dtype=np.uint32) for _ in range(4)]
    src = [dev.upload(b) for b in blocks]
    staging = [dev.device.create_buffer(size=256, usage=BufferUsage.MAP_READ | BufferUsage.COPY_DST)
               for _ in blocks]
    index = []
    for s, t in zip(src, staging):
        enc = dev.encoder()
        enc.copy_buffer_to_buffer(s, 0, t, 0, 256)
        index.append(dev.submit([enc.finish()]))
    assert all(isinstance(i, int) for i in index) == indexed
    for i in (2, 0, 3, 1):
        got = np.frombuffer(dev.read_after(staging[i], index[i], 256), np.uint32)
        np.testing.assert_array_equal(got, blocks[i])
    # a buffer maps again after its read (the next batch reuses it)
    enc = dev.encoder()
    enc.copy_buffer_to_buffer(src[3], 0, staging[0], 0, 256)
    np.testing.assert_array_equal(np.frombuffer(dev.read_after(staging[0], dev.submit([enc.finish()]), 256),
                                                np.uint32), blocks[3])


def test_buffer_over_the_adapter_limit_is_a_device_error():
    """A buffer larger than the adapter allows is refused by name before wgpu sees it; a GPU error
    in wgpu (here its own validation of a buffer that cannot be mapped for reading and writing both)
    comes back as a DeviceError naming what was being done."""
    from shaderlm.errors import DeviceError
    from shaderlm.gpu.backend import BufferUsage
    dev = get_device()
    largest = dev.limit("max-buffer-size", 0)
    with pytest.raises(DeviceError, match=r"KV cache needs [\d,]+ bytes, over the largest buffer"):
        dev.buffer(largest + 1, label="KV cache")
    with pytest.raises(DeviceError, match="allocating odd buffer .* failed on .*GPUValidationError"):
        dev.buffer(64, BufferUsage.MAP_READ | BufferUsage.MAP_WRITE, label="odd buffer")
