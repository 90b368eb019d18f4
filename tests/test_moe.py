"""Mixture-of-experts kernels against NumPy: the router's top-k (moe_route.wgsl), the experts' decode
GEMV (gemv.wgsl EXPERTS / EXPERT_SUM: only the picked experts' rows, the GLU and the weighted sum),
and the prompt path's grouped int8 GEMM (moe_tiles.wgsl + matmul_q8.wgsl EXPERTS) with its combine.
Whole models (Qwen3-MoE, Mixtral) are checked in test_archs.py (NumPy reference) and test_hf.py
(transformers); here also the int8 grouped prefill of a whole model."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants as gq

import shaderlm
from shaderlm.gpu.device import Device, get_device
from shaderlm.kernels import gemm, ops
from shaderlm.kernels.gemv import expert_gemv
from shaderlm.options import Options

try:
    from test_kernels import MM_RTOL, assert_close, make_weight, q8_rounded, read_f32, run, state, upload
    from reference import load_reference, reference_logits
    from synth_models import random_ids
except ImportError:  # tests/ imported as a package
    from tests.test_kernels import MM_RTOL, assert_close, make_weight, q8_rounded, read_f32, run, state, upload
    from tests.reference import load_reference, reference_logits
    from tests.synth_models import random_ids


@pytest.fixture(scope="module", params=["default", "no_subgroups"])
def dev(request):
    return get_device() if request.param == "default" else Device(subgroups=False)


def top_k(logits: np.ndarray, k: int, renorm: bool):
    """(ids, weights) per row: the k largest (NaN as -inf; ties: the lower id), softmax over them or all."""
    v = np.where(np.isnan(logits), -np.inf, logits.astype(np.float64))
    ids = np.array([sorted(range(v.shape[1]), key=lambda e: (-v[t, e], e))[:k] for t in range(v.shape[0])])
    p = np.exp(v - v.max(axis=1, keepdims=True))
    picked = np.take_along_axis(p, ids, 1)
    return ids, picked / (picked.sum(1, keepdims=True) if renorm else p.sum(1, keepdims=True))


@pytest.mark.parametrize("experts,k,renorm", [(8, 2, True), (128, 8, True), (65, 4, False), (4, 4, True),
                                               (256, 8, True)])
def test_moe_route(dev, experts, k, renorm):
    """Both pickers (subgroup rounds, and ranking in workgroup memory) against NumPy's sort."""
    rng = np.random.default_rng(experts + k)
    n = 8
    logits = rng.standard_normal((n, experts)).astype(np.float32)
    logits[1, :] = 0.5                            # all tied: the k lowest ids
    logits[2, [3, experts - 1]] = 9.0             # a tie at the top
    logits[3, 0] = np.nan                         # NaN ranks last
    logits[4, :] = -np.inf                        # -inf and NaN tie with each other, last
    logits[4, ::3] = np.nan
    logits[4, 1] = -3.0
    logits[5, : k + 1] = np.nextafter(np.float32(1.0), np.float32(2.0))   # a tie just past the k-th
    logits[5, k + 1:] = 1.0
    lb, ib, wb = dev.upload(logits), dev.buffer(4 * n * k), dev.buffer(4 * n * k)
    run(dev, ops.moe_route(dev, lb, ib, wb, experts=experts, k=k, renorm=renorm), n)
    want_ids, want_w = top_k(logits, k, renorm)
    got_ids = dev.read(ib, np.uint32)[: n * k].reshape(n, k)
    assert np.array_equal(got_ids, want_ids)
    np.testing.assert_allclose(read_f32(dev, wb, (n, k)), want_w, rtol=2e-6, atol=1e-7)


def _experts(qtype, experts, rows, cols, rng):
    if qtype == "MXFP4":                          # gguf.quants writes it (make_weight's types lack it)
        x = rng.standard_normal((experts * rows, cols)).astype(np.float32)
        raw = np.ascontiguousarray(gq.quantize(x, GT.MXFP4)).view(np.uint8).reshape(experts * rows, -1)
        W = gq.dequantize(raw, GT.MXFP4).reshape(experts * rows, cols).astype(np.float64)
    else:
        raw, W = make_weight(qtype, experts * rows, cols, rng)
    return raw, W.reshape(experts, rows, cols)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K", "MXFP4", "F16"])
@pytest.mark.parametrize("batch", [0, 3])
def test_expert_gemv(dev, qtype, batch):
    """Per token, its K picked experts' [gate; up] rows with the RMSNorm of x folded in and the SiLU GLU
    (a row of h per (token, slot)); then their down rows on each slot's h, weighted and added into y."""
    rng = np.random.default_rng(len(qtype) + batch)
    E, K, F, D, n = 6, 2, 40, 256, 3
    gu_raw, GU = _experts(qtype, E, 2 * F, D, rng)
    Fd = 256 if qtype in ("Q4_K", "Q6_K") else 64       # the down matrices' K: whole blocks
    dn_raw, DN = _experts(qtype, E, D, Fd, rng)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(n)]).astype(np.uint32)
    wts = rng.uniform(0.1, 1.0, (n, K)).astype(np.float32)
    x = rng.standard_normal((n, D)).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, D).astype(np.float32)
    eps = 1e-6
    gu_w = upload(dev, qtype, gu_raw, E * 2 * F, D)
    h = dev.buffer(4 * n * K * F)
    ib, wb = dev.upload(ids.reshape(-1)), dev.upload(wts.reshape(-1))
    gate_up = expert_gemv(dev, gu_w, E, dev.upload(x), h, ib, slots=K, y_stride=F, glu=True, norm=dev.upload(nw),
                          eps=eps, batch=batch)
    xn = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + eps) * nw
    g = np.einsum("tkfd,td->tkf", GU[ids][:, :, :F], xn)
    u = np.einsum("tkfd,td->tkf", GU[ids][:, :, F:], xn)
    with np.errstate(over="ignore"):
        want_h = g / (1 + np.exp(-g)) * u
    every = qtype == "Q4_K" and batch == 0 and dev.has_subgroups     # every shape once (slow on lavapipe)
    for shape, ds in _every_shape(gate_up, every):
        run(dev, ds, n)
        assert_close(read_f32(dev, h, (n, K, F)), want_h, 1e-4 * np.abs(want_h).max() + 1e-6,
                     f"experts gate/up {qtype} {shape}")

    hin = rng.standard_normal((n, K, Fd)).astype(np.float32)
    y0 = rng.standard_normal((n, D)).astype(np.float32)
    dn_w = upload(dev, qtype, dn_raw, E * D, Fd)
    yb = dev.upload(y0)
    down = expert_gemv(dev, dn_w, E, dev.upload(hin), yb, ib, slots=K, y_stride=D, weights=wb, batch=batch)
    want_y = y0 + np.einsum("tk,tkdf,tkf->td", wts.astype(np.float64), DN[ids], hin)
    for shape, ds in _every_shape(down, every):
        dev.write(yb, y0)
        run(dev, ds, n)
        assert_close(read_f32(dev, yb, (n, D)), want_y, 1e-4 * np.abs(want_y).max(), f"experts down {qtype} {shape}")


def _every_shape(ds, every: bool):
    """(shape, dispatches) for the built shape and, with `every`, each one the tuner may pick (and refine to)."""
    if not every:
        return [("built", ds)]
    tune = ds[0].tune
    shapes = tune.candidates()
    shapes += [r for s in shapes for r in tune.refine(s)]
    return [("built", ds)] + [(s, tune.rebuild(s)) for s in dict.fromkeys(shapes)]


@pytest.mark.parametrize("qtype,rows,cols", [("Q8_0", 96, 64), ("Q4_K", 300, 256), ("Q6_K", 256, 512)])
@pytest.mark.parametrize("n,per_pair", [(3, False), (100, False), (100, True)])
def test_expert_matmul_q8(qtype, rows, cols, n, per_pair):
    """The grouped int8 GEMM: every (token, slot) pair's row of its expert times x (the token's row, or
    the pair's own), x rounded as the int8 GEMM rounds it. 100 tokens x 2 of 5 experts gives experts
    more pairs than a tile holds; 3 tokens leave experts unpicked."""
    dev = get_device()
    rng = np.random.default_rng(rows + n)
    E, K, T = 5, 2, 128
    raw, W = _experts(qtype, E, rows, cols, rng)
    w = upload(dev, qtype, raw, E * rows, cols)
    ids = np.stack([rng.permutation(E)[:K] for _ in range(n)]).astype(np.uint32)
    xr = n * K if per_pair else n
    x = rng.standard_normal((xr, cols)).astype(np.float32)
    x[0, :32] = 0.0
    y = dev.buffer(4 * T * K * rows)
    st = state(dev, n=n)
    group, groups = gemm.expert_groups(dev, dev.upload(ids.reshape(-1)), st, experts=E, slots=K, max_tokens=T)
    run(dev, [group] + gemm.expert_matmul_q8(dev, w, E, dev.upload(x), y, st, groups, slots=K,
                                             per_pair_x=per_pair, max_tokens=T, y_stride=rows), n)
    xq, slack = q8_rounded(x, w.qtype.iq8_run)
    src = (np.arange(n * K) if per_pair else np.repeat(np.arange(n), K)).reshape(n, K)
    want = np.einsum("tkrc,tkc->tkr", W[ids], xq[src])
    tol = np.einsum("tkrc,tkc->tkr", np.abs(W[ids]), slack[src] + MM_RTOL * np.abs(xq[src])) + 1e-30
    assert_close(read_f32(dev, y, (n, K, rows)), want, tol, f"grouped experts {qtype} n={n}")


def test_moe_combine():
    dev = get_device()
    rng = np.random.default_rng(5)
    n, K, D, E = 9, 3, 300, 4
    y = rng.standard_normal((n * K, D)).astype(np.float32)
    wts = rng.uniform(0, 1, (n, K)).astype(np.float32)
    ids = rng.integers(0, E, (n, K)).astype(np.uint32)
    bias = rng.standard_normal((E, D)).astype(np.float32)
    x0 = rng.standard_normal((n, D)).astype(np.float32)
    xb = dev.upload(x0)
    run(dev, ops.moe_combine(dev, dev.upload(y), dev.upload(wts), xb, state(dev, n=n), dim=D, slots=K,
                             ids=dev.upload(ids), bias=dev.upload(bias)), n)
    want = x0 + np.einsum("tk,tkd->td", wts, y.reshape(n, K, D) + bias[ids])
    np.testing.assert_allclose(read_f32(dev, xb, (n, D)), want, rtol=1e-5, atol=1e-5)


def _routing_margin(path, ids) -> float:
    """The smallest gap between a token's K-th and (K+1)-th router logits over every layer of the
    reference pass, relative to the largest |router logit|."""
    ref = load_reference(path)
    k, gaps, experts = ref.cfg.n_experts_used, [], ref._experts

    def spy(h, b):
        logits = h @ ref.w[b + "ffn_gate_inp.weight"].T.astype(np.float64)
        top = -np.sort(-logits, axis=1)
        gaps.append((top[:, k - 1] - top[:, k]) / np.abs(logits).max())
        return experts(h, b)
    ref._experts = spy
    try:
        ref.forward(ids)
    finally:
        del ref._experts
    return float(np.concatenate(gaps).min())


def test_grouped_int8_prefill_logits(synth_gguf):
    """A whole Qwen3-MoE prompt through the grouped int8 GEMMs, against the NumPy reference at the
    int8 prefill's tolerance (test_model.py). Rounding x to int8 moved this model's router logits by up
    to about 0.3% of their largest and can flip a token's expert where two nearly tie, which moves that token's
    logits by their scale: the prompt is the first of the seeded ones whose routing has no gap under
    0.5%."""
    path = synth_gguf(seed=1, preset="tiny", arch="qwen3moe", quant="Q8_0")
    m = shaderlm.load(path, progress=False, ctx=64, options=Options.from_env().replace(exact_prefill=False))
    layer = m.net.plan_prefill[False].dispatches
    assert any(d.label.endswith(".experts") and d.label.startswith("matmul_q8") for d in layer)
    assert any(d.label.startswith("matmul_tiled.") for d in layer), "the router on the f32 tiled GEMM"
    ids = next(i for i in (random_ids(m.config.vocab_size, 40, seed) for seed in range(16))
               if _routing_margin(path, i) >= 0.005)
    ref = reference_logits(path, ids)
    err = np.abs(m.logits(ids) - ref).max() / np.abs(ref).max()
    assert err <= 0.04, f"int8 grouped prefill logits off by {err:.3g} of max |logit|"


