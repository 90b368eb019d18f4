"""Thin Python over the WGSL kernels: each function builds the Dispatch objects for one op.

Nothing here runs per token: dispatches (pipeline + bind group + grid) are built once at load and
replayed by a Plan. Grids that depend on the token count are functions of n.
"""
from __future__ import annotations

import os

import numpy as np

from ..gpu.autotune import Tunable
from ..gpu.plan import Dispatch

WG = 256            # threads per workgroup for the simple elementwise/row kernels


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_1d(dev, n_groups: int) -> tuple:
    """Spread n_groups workgroups over x (and y when x would pass the per-dimension limit)."""
    lim = int(dev.limits.get("max-compute-workgroups-per-dimension", 65535))
    if n_groups <= lim:
        return (max(n_groups, 1), 1, 1)
    return (lim, cdiv(n_groups, lim), 1)


# ---- dequantize (tests, tools) -----------------------------------------------------------------
def dequantize(dev, weight) -> np.ndarray:
    """The f32 values of a GPUWeight, dequantized on the GPU (row-major rows x cols)."""
    pipe = dev.pipeline("dequant", QUANT=weight.qtype.kernel)
    out = np.empty((weight.rows, weight.cols), np.float32)
    for c in weight.chunks:
        obuf = dev.buffer(c.rows * weight.cols * 4)
        dev.run_once(pipe, [dev.uniform(weight.cols, c.rows, c.dbase, 0), c.buffer, obuf],
                     grid_1d(dev, cdiv(c.rows * weight.cols // 8, 256)))
        out[c.row0:c.row0 + c.rows] = dev.read(obuf, np.float32).reshape(c.rows, weight.cols)
    return out


def k4_regroup(dev, buf, blocks: int, block_words: int):
    """Regroup the headers of the first `blocks` Q4_K / Q5_K blocks (block_words words each) of `buf`
    in place, as the decoders read them (k4_regroup.wgsl); once, at upload."""
    grid = grid_1d(dev, cdiv(blocks, 256))
    dev.run_once(dev.pipeline("k4_regroup"), [dev.uniform(blocks, block_words, grid[0] * 256, 0), buf], grid)


# ---- forward-pass ops ----------------------------------------------------------------------------
# Every op takes the shared `st` state buffer (State in state.wgsl: pos, n, tok, out_row0).

def matmul(dev, w, x, y, st, *, tt: int, y_stride: int, row0: int = 0, accumulate=False, bias=None,
           from_state_row=False, norm=None, eps: float = 0.0, glu=False, gelu=False,
           tiled: bool = True) -> list[Dispatch]:
    """y[t, row0 + r] (+)= W[r] . x[t] for every row-chunk of W; x rows are w.cols floats.

    tt == 1: the decode GEMV (matmul.wgsl), which can also fold in the RMSNorm of x (`norm`: the
    norm weight buffer) and, for a [gate; up] weight, the gated activation (`glu`).
    tt > 1: batched tokens, the 64x64-tiled GEMM (matmul_tiled.wgsl) when K allows and `tiled`,
    else the GEMV kernel taking tt tokens per pass over the weights (better for a few tokens)."""
    if tt > 1 and tiled and w.cols % 32 == 0:
        if norm is not None or glu:
            raise ValueError("the tiled GEMM does not fuse norm/glu; run them as separate ops")
        return _matmul_tiled(dev, w, x, y, st, y_stride=y_stride, row0=row0, accumulate=accumulate,
                             bias=bias, from_state_row=from_state_row)
    if glu and len(w.chunks) != 1:
        raise ValueError(f"{w.name}: GLU fusion needs gate and up in one binding")
    if tt == 1 and not from_state_row and wide_ok(w):
        return gemv(dev, w, x, y, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias,
                    norm=norm, eps=eps, glu=glu, gelu=gelu)
    wg = 256 if dev.has_subgroups else 64
    rows_per_wg = max(1, wg // dev.subgroup_size) if dev.has_subgroups else 1
    pipe = dev.pipeline("matmul", QUANT=w.qtype.kernel, TT=tt, WG=wg, BIAS=bias is not None,
                        ACCUMULATE=accumulate, NORM=norm is not None, GLU=glu, ACT_GELU=gelu)
    lim = int(dev.limits.get("max-compute-workgroups-per-dimension", 65535))
    out = []
    for c in w.chunks:
        rows = c.rows // 2 if glu else c.rows
        params = dev.uniform(w.cols, rows, row0 + c.row0, c.dbase, y_stride, w.cols,
                             int(from_state_row), float(eps))
        res = [params, st, c.buffer, x, y, bias, norm]
        gx = min(cdiv(rows, rows_per_wg), lim)
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n, gx=gx: (gx, cdiv(n, tt)),
                            label=f"matmul.{w.qtype.name}", bytes=c.buffer.size))
    return out


def wide_ok(w) -> bool:
    """The decode GEMV (gemv.wgsl) takes this weight: its type has a wide decoder and K whole wide
    blocks (SHADERLM_GEMV=old turns it off, for comparisons)."""
    q = w.qtype
    return q.wide is not None and w.cols % q.wide[0] == 0 and os.environ.get("SHADERLM_GEMV") != "old"


def gemv_shape(dev, w, glu: bool = False) -> tuple[int, int, int, int]:
    """(workgroup size, rows per row group, chunk steps per trip, row groups per workgroup) for the
    decode GEMV of `w`.

    The workgroup strides over a row's chunks: its size is the largest power of two from 32 to 128
    (and at least the subgroup) not over the chunk count, so no lane idles on the first pass. Rows per
    workgroup: enough that a lane has about 128 bytes of loads in flight per chunk step, but no more
    than keeps about 768 workgroups (small matrices need the parallelism more). Measured on the H200
    in whole decode steps, where fewer rows won over the isolated-GEMV sweeps' choice (8): Llama 8B
    Q4_K_M 166 -> 192 tok/s with 2-3 rows, while Q4_0 and Q8_0 wanted 4 or more.
    Steps per trip: 1, one row group (the tuner tries more: gemv_candidates).
    SHADERLM_GEMV="WG,ROWS[,STEPS[,GROUPS]]" overrides them, for tuning; "old" selects matmul.wgsl instead."""
    env = os.environ.get("SHADERLM_GEMV", "auto")
    if env not in ("auto", "old"):
        return full_shape(tuple(int(v) for v in env.split(",")))[:4]
    chunks, load = gemv_chunks(w), w.qtype.wide[2]
    lim = int(dev.limits.get("max-compute-invocations-per-workgroup", 256))
    wg = 32
    while wg * 2 <= min(chunks, 128, lim):
        wg *= 2
    wg = min(max(wg, dev.subgroup_size or 1), lim)
    load *= 2 if glu else 1
    out_rows = w.rows // 2 if glu else w.rows
    rows = max(1, min(8, round(128 / load), out_rows // 768))
    return wg, rows, 1, 1


def full_shape(shape) -> tuple[int, int, int, int, int, int, int]:
    """A GEMV shape (workgroup size, rows, chunk steps per trip, row groups per workgroup, x24, butterfly
    reduction, prefetch a row group ahead): steps 1, groups 1, x24, butterfly and prefetch 0 where left out."""
    return (tuple(shape) + (1, 1, 0, 0, 0)[len(shape) - 2:])[:7]


def bfly_values(rows: int, glu: bool) -> int:
    """The row sums a group of `rows` rows reduces (and GLU's up rows), rounded up to a power of 2:
    what gemv_rows.wgsl's butterfly (SG_BFLY) takes."""
    return 1 << (rows * (2 if glu else 1) - 1).bit_length()


def bfly_ok(dev, rows: int, glu: bool) -> bool:
    """gemv_rows.wgsl can reduce a group's row sums in one butterfly: subgroups, and 2 to 8 values
    within the subgroup size."""
    return dev.has_subgroups and 2 <= bfly_values(rows, glu) <= min(8, dev.subgroup_size or 1)


def x24_ok(ws) -> bool:
    """The weights' GEMV can take x as 24-bit fixed point (their decoders have the integer dot, and
    they are not flagged for the int8 x that --int8-act asks for). SHADERLM_NO_X24=1: never (A/B).

    x24 is the default there. It rounds x to 22 bits below each 16-element run's largest exponent
    (error under 4 f32 ulps of the run's largest element, the order of an f32 dot's own rounding; see
    test_gemv_x24): as accurate as f32 x. Integer dots then replace the per-weight float conversions
    that bound the f32 GEMVs (H200, one machine, tuned: Llama 8B Q4_K_M 227 -> 247 tok/s, Q4_0 223 -> 268).
    Where the adapter's integer dots are slow, the tuner's f32 twin wins instead (gemv_refine)."""
    return all(w.qtype.int8_dot and not w.int8_x for w in ws) and not os.environ.get("SHADERLM_NO_X24")


def gemv_chunks(w) -> int:
    """The decode GEMV's chunks (one lane's share of a wide block at a time) in a row of `w`."""
    block, per_block, _ = w.qtype.wide
    return w.cols // block * per_block


def hoist_ok(dev, ws, shape) -> bool:
    """gemv.wgsl can run `shape` with several row groups per workgroup (HOIST): one trip covers every
    chunk of a row, and the partial sums fit the adapter's workgroup memory."""
    wg, rows, steps, groups, *_ = full_shape(shape)
    part = groups * rows * wg // 2 + 2 * wg          # floats: part, norm_part and the reduction buffer
    return (wg * steps >= max(map(gemv_chunks, ws)) and groups * rows <= wg
            and 4 * part <= int(dev.limits.get("max-compute-workgroup-storage-size", 16384)))


def gemv_candidates(dev, ws, glu: bool, default: tuple) -> list[tuple]:
    """Shapes the autotuner tries for a decode GEMV over weights `ws` (one, or gemv_pair's two):
    gemv_shape's first, then workgroups of 32-256 lanes (at least the subgroup, at most twice the
    chunks of a row, so no more than half the lanes idle) by 1-8 rows (1-4 with GLU, whose rows read
    two weight rows), one chunk step per trip; and 2 steps for 2, 4 (and 8) rows where a row has
    chunks for both (H200 sweep, int8 x, Q4_K 28672x4096: 64 x 8 x 2 1,645 GB/s, the default 1,453).
    Then several row groups per workgroup (HOIST: each lane's x converted once for all of them): the
    fewest lanes (a multiple of the subgroup) that cover a row's chunks in 1 or 2 steps, by 1, 2, 4
    or 8 rows (not 8 with GLU) and 2, 4 or 8 groups, where that leaves at least 128 workgroups (H200,
    Llama 8B Q4_0: QKV 128x8/2 +3.0% and down 448x8/4 in 128 workgroups +2.3% over the picks
    without them, tg128 of the whole model); each with and without
    prefetching the next group's weights (gemv_rows.wgsl PF: on the H200 the tuner kept it for 17 of
    the 21 row-group shapes it picked over the yardstick models, and the best shapes differ with it).
    All in the default's x mode (the best one's f32 twin and butterfly twin are tried after: gemv_refine)."""
    default = full_shape(default)

    def shape(g, r, steps=1, groups=1, pf=0):        # in the default's x mode, the butterfly where it fits
        return g, r, steps, groups, default[4], int(default[5] and bfly_ok(dev, r, glu)), pf
    chunks = min(map(gemv_chunks, ws))
    lim = int(dev.limits.get("max-compute-invocations-per-workgroup", 256))
    sgs = max(32, dev.subgroup_size or 1)
    wgs = [g for g in (32, 64, 128, 256) if sgs <= g <= min(lim, 2 * chunks)] or [default[0]]
    rows = (1, 2, 3, 4) if glu else (1, 2, 3, 4, 6, 8)
    out = [shape(*default[:4], default[6])] + [shape(g, r) for g in wgs for r in rows]
    out += [shape(g, r, 2) for g in wgs for r in rows if r in (2, 4, 8) and 2 * g <= chunks]
    most = max(map(gemv_chunks, ws))
    out_rows = sum(w.rows // 2 if glu else w.rows for w in ws)
    for steps in (1, 2):
        g = hoist_lanes(dev, most, steps)
        if g > lim:
            continue
        for r in (1, 2, 4) if glu else (1, 2, 4, 8):
            for groups in (2, 4, 8):
                if hoist_ok(dev, ws, (g, r, steps, groups)) and out_rows >= 128 * r * groups:
                    out += [shape(g, r, steps, groups, 1), shape(g, r, steps, groups, 0)]
    return list(dict.fromkeys(out))


def hoist_lanes(dev, chunks: int, steps: int) -> int:
    """The fewest lanes (a multiple of the subgroup size or of 32, whichever is larger) covering a
    row's `chunks` in `steps` chunk steps: the row-group shapes' workgroup size."""
    sgs = max(32, dev.subgroup_size or 1)
    return max(sgs, -(-chunks // steps // sgs) * sgs)


def gemv_refine(shape) -> list:
    """What the tuner tries after picking a shape: an x24 shape's f32 twin (integer dots may be slow)
    and a butterfly shape's twin with a subgroupAdd per row (the butterfly everywhere won 5% on Llama 8B
    Q4_0 and lost 4.5% on 1B Q8_0, H200)."""
    s = full_shape(shape)
    twins = []
    if s[4]:
        twins.append(s[:4] + (0,) + s[5:])
    if s[5]:
        twins.append(s[:5] + (0,) + s[6:])
    return twins


def _gemv_tuning(dev, ws, key: str, glu: bool, shape, rebuild) -> tuple[Tunable, dict]:
    """The Tunable of a decode GEMV over `ws` (gemv's one weight, gemv_pair's two), and the shape's
    gemv.wgsl defines: `shape` if given, else the adapter's tuned one, else gemv_shape's (of the first
    weight) with x24 where x24_ok. Integer dots: x24, or int8 x where the weights are flagged for it."""
    default = gemv_shape(dev, ws[0], glu)
    default = default + (int(x24_ok(ws)), int(bfly_ok(dev, default[1], glu)), 0)
    tune = Tunable(key, lambda: gemv_candidates(dev, ws, glu, default), rebuild, gemv_refine)
    shape = full_shape(shape or dev.tuned.get(key) or default)
    wg, nrows, steps, groups, x24, bfly, pf = shape
    if groups > 1 and not hoist_ok(dev, ws, shape):
        raise ValueError(f"GEMV shape {shape} for {key}: row groups need the {wg} x {steps} lane steps to cover "
                         f"a row's {max(map(gemv_chunks, ws))} chunks, a lane per row ({groups} x {nrows}) and the "
                         f"partial sums to fit workgroup memory")
    x24 = bool(x24) and x24_ok(ws)          # a cached x24 shape under SHADERLM_NO_X24 builds f32
    int8 = all(w.int8_x for w in ws)
    return tune, dict(WG=wg, ROWS=nrows, STEPS=steps, GROUPS=groups, HOIST=groups > 1, PF=groups > 1 and bool(pf),
                      INT_DOT=int8 or x24, X24=x24, **_bfly_defines(dev, nrows, glu, bfly))


def _bfly_defines(dev, rows: int, glu: bool, bfly) -> dict:
    """gemv_rows.wgsl's butterfly reduction (SG_BFLY) of `rows` row sums (and GLU's up rows): the
    values rounded up to BFN (a power of 2), passed as BF_ARGS, and the subgroup size compiled in (SGC)
    so the masks are constants (the kernel checks the subgroup it runs in and falls back)."""
    if not (bfly and bfly_ok(dev, rows, glu)):
        return dict(SG_BFLY=False)
    bfn = bfly_values(rows, glu)
    args = [f"acc{i}" for i in range(rows)] + [f"up{i}" for i in range(rows if glu else 0)]
    return dict(SG_BFLY=True, BFN=bfn, BF2=bfn == 2, BF4=bfn == 4, BF8=bfn == 8, SGC=dev.subgroup_size,
                BF_TAIL=dev.subgroup_size.bit_length() - bfn.bit_length(),
                BF_ARGS=", ".join((args + ["0.0"] * 8)[:8]))


def _gemv_defines(w, c, rows: int, row0: int, *, y_stride: int, eps: float) -> dict:
    """gemv.wgsl's specialization for row-chunk `c` of `w` (rows of it computed from output row0)."""
    return dict(QUANT=w.qtype.kernel, WIDE=True, K=w.cols, NROWS=rows, ROW0=row0, DBASE=c.dbase,
                Y_STRIDE=y_stride, EPS=float(eps))


def gemv(dev, w, x, y, *, y_stride, row0=0, accumulate=False, bias=None, norm=None, eps=0.0,
         glu=False, gelu=False, shape=None) -> list[Dispatch]:
    """The decode GEMV (gemv.wgsl): 16-byte weight loads, x chunk reused over several rows.
    `shape` (full_shape's tuple, or a prefix of it): default the adapter's tuned one, else gemv_shape.
    x24: x as 24-bit fixed point for integer dots (X24, as accurate as f32). With w.int8_x (opt-in,
    not exact) x is rounded to int8 for them instead (INT_DOT without X24)."""
    key = f"gemv {w.qtype.name} {w.rows}x{w.cols}" + " glu" * glu + " norm" * (norm is not None) \
        + " int8x" * w.int8_x
    tune, sd = _gemv_tuning(dev, [w], key, glu, shape, lambda s: gemv(
        dev, w, x, y, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias, norm=norm, eps=eps,
        glu=glu, gelu=gelu, shape=s))
    out = []
    for c in w.chunks:
        rows = c.rows // 2 if glu else c.rows
        pipe = dev.pipeline("gemv", **_gemv_defines(w, c, rows, row0 + c.row0, y_stride=y_stride, eps=eps), **sd,
                            BIAS=bias is not None, ACCUMULATE=accumulate, NORM=norm is not None, GLU=glu,
                            ACT_GELU=gelu)
        gx, gy, _ = grid_1d(dev, cdiv(rows, sd["ROWS"] * sd["GROUPS"]))
        out.append(Dispatch(pipe, dev.bind_group(pipe, [None, None, c.buffer, x, y, bias, norm]),
                            lambda n, gx=gx, gy=gy: (gx, gy, n), label=f"gemv.{w.qtype.name}",
                            bytes=c.buffer.size, tune=tune))
    return out


def can_pair(wa, wb) -> bool:
    """gemv_pair applies: both weights taken by the decode GEMV, one binding each, the same K."""
    return wide_ok(wa) and wide_ok(wb) and wa.cols == wb.cols and len(wa.chunks) == len(wb.chunks) == 1


def gemv_pair(dev, wa, wb, x, y, *, y_stride, norm=None, eps=0.0, shape=None) -> list[Dispatch]:
    """Two weights of different types over the same x in one dispatch (gemv.wgsl DUAL): wa's rows
    then wb's, written consecutively from row 0 (decode's Q+K in Q4_K and V in Q6_K). One binding
    each; one shape for both (default: the tuned one, else wa's gemv_shape)."""
    key = (f"gemv_pair {wa.qtype.name}+{wb.qtype.name} {wa.rows}+{wb.rows}x{wa.cols}"
           + " norm" * (norm is not None) + " int8x" * (wa.int8_x and wb.int8_x))
    tune, sd = _gemv_tuning(dev, [wa, wb], key, False, shape, lambda s: gemv_pair(
        dev, wa, wb, x, y, y_stride=y_stride, norm=norm, eps=eps, shape=s))
    ca, cb = wa.chunks[0], wb.chunks[0]
    pipe = dev.pipeline("gemv", **_gemv_defines(wa, ca, wa.rows, 0, y_stride=y_stride, eps=eps), **sd,
                        DUAL=True, QUANT_B=wb.qtype.kernel, NROWS_B=wb.rows, ROW0_B=wa.rows, DBASE_B=cb.dbase,
                        NORM=norm is not None)
    per = sd["ROWS"] * sd["GROUPS"]          # rows per workgroup
    gx, gy, _ = grid_1d(dev, cdiv(wa.rows, per) + cdiv(wb.rows, per))
    bg = dev.bind_group(pipe, [None, None, ca.buffer, x, y, None, norm, cb.buffer])
    return [Dispatch(pipe, bg, lambda n, gx=gx, gy=gy: (gx, gy, n),
                     label=f"gemv.{wa.qtype.name}+{wb.qtype.name}", bytes=ca.buffer.size + cb.buffer.size,
                     tune=tune)]


def _matmul_tiled(dev, w, x, y, st, *, y_stride, row0, accumulate, bias, from_state_row):
    pipe = dev.pipeline("matmul_tiled", QUANT=w.qtype.kernel, BIAS=bias is not None, ACCUMULATE=accumulate)
    out = []
    for c in w.chunks:
        params = dev.uniform(w.cols, c.rows, row0 + c.row0, c.dbase, y_stride, w.cols, int(from_state_row), 0)
        res = [params, st, c.buffer, x, y] + ([bias] if bias is not None else [])
        gx = cdiv(c.rows, 64)
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n, gx=gx: (gx, cdiv(n, 64)),
                            label=f"matmul_tiled.{w.qtype.name}", bytes=c.buffer.size))
    return out


def rmsnorm(dev, x, w, y, st, *, dim: int, eps: float, from_state_row=False) -> Dispatch:
    pipe = dev.pipeline("rmsnorm", WG=WG)
    bg = dev.bind_group(pipe, [dev.uniform(dim, int(from_state_row), float(eps), 0), st, x, w, y])
    return Dispatch(pipe, bg, lambda n: (n, 1), label="rmsnorm")


def embed(dev, w, tokens, x, st, *, scale: float = 1.0) -> list[Dispatch]:
    pipe = dev.pipeline("embed", QUANT=w.qtype.kernel)
    out = []
    for c in w.chunks:
        params = dev.uniform(w.cols, c.row0, c.rows, c.dbase, float(scale), 0, 0, 0)
        bg = dev.bind_group(pipe, [params, st, tokens, c.buffer, x])
        out.append(Dispatch(pipe, bg, lambda n: (n, 1), label="embed"))
    return out


def rope_store(dev, qkv, inv_freq, k_cache, v_cache, st, *, n_heads, n_kv, head_dim, rope_dim,
               neox: bool) -> Dispatch:
    pipe = dev.pipeline("rope_store", NEOX=neox)
    bg = dev.bind_group(pipe, [dev.uniform(n_heads, n_kv, head_dim, rope_dim), st, qkv, inv_freq,
                               k_cache, v_cache])
    return Dispatch(pipe, bg, lambda n: (n_heads + n_kv, n), label="rope_store")


def attention(dev, qkv, k_cache, v_cache, out, st, *, n_heads, n_kv, head_dim, scale,
              window: int = 0, softcap: float = 0.0, inv_freq=None, rope_dim: int = 0,
              neox: bool = False, shape=None) -> Dispatch:
    """Causal GQA attention over the cache. With `inv_freq` (decode, one token) it also applies
    RoPE to q and the new K and stores the new K/V, replacing rope_store. `shape`: the decode
    kernel's (workgroup size, keys per step, splits, keys per split at least), or a prefix of it;
    attention_shape's where left out. Not autotuned: the best depends on the context length (H200:
    1024 x 4 won at position 256 and lost at 1-128, SmolLM2 tg128 919 -> 847 tok/s)."""
    wg = 64
    fused = inv_freq is not None
    params = dev.uniform(n_heads, n_kv, head_dim, window, float(scale), float(softcap), rope_dim, 0)
    if fused and dev.has_subgroups:
        # one token: subgroup-parallel kernel (keys split over subgroups, lanes over head dims, and
        # over `splits` workgroups a head where the context is long)
        sgs = dev.subgroup_size
        default = attention_shape(dev, n_heads)
        wg, unroll, splits, min_keys = tuple(shape or ()) + default[len(shape or ()):]
        pipe = dev.pipeline("attention_decode", WG=wg, HD=head_dim, PAIRS=cdiv(head_dim // 2, sgs),
                            NEOX=neox, UNROLL=unroll, SPLIT=splits > 1, SPLITS=splits, MINK=min_keys,
                            MERGE=max(wg // sgs, splits))
        res = [params, st, qkv, k_cache, v_cache, out, inv_freq]
        if splits > 1:
            res += [dev.scratch(f"attention partials {n_heads}x{splits}x{head_dim}",
                                4 * n_heads * splits * (2 + head_dim)),
                    dev.scratch(f"attention split counts {n_heads}", 4 * n_heads)]
        return Dispatch(pipe, dev.bind_group(pipe, res), (n_heads, splits, 1), label="attention_decode")
    pipe = dev.pipeline("attention", WG=wg, HD=head_dim, PAIRS=cdiv(head_dim // 2, wg), ROPE=fused, NEOX=neox)
    bg = dev.bind_group(pipe, [params, st, qkv, k_cache, v_cache, out, inv_freq])
    return Dispatch(pipe, bg, lambda n: (n_heads, n), label="attention")


def attention_shape(dev, n_heads: int) -> tuple[int, int, int, int]:
    """The decode attention kernel's (workgroup size, keys per subgroup step, splits, keys per split at
    least): 256 lanes (8 subgroups of 32; 16 of 8 on lavapipe) x 4 keys; a head's keys split over up
    to 256 / n_heads workgroups (at most 16) once it has 256 keys a split, so that a long context keeps
    about 256 workgroups busy. H200, Llama 8B Q4_K_M, tg128 after 8,192 tokens: 121.7 tok/s unsplit,
    260.1 split (round 15). With each trip's K/V loaded a trip ahead (round 16), 256 lanes beat 512:
    8B Q4_K_M +1.1% from position 0, +2.7% after 2,048 tokens, +1.3% after 8,192; 1B Q4_K_M +1.8%,
    SmolLM2 +2.9%. 16 splits, 8 keys a step and 1,024 lanes lost at every depth (bench/NOTES.md).
    SHADERLM_ATTN="WG,UNROLL[,SPLITS[,MIN_KEYS]]" overrides it, for experiments."""
    sgs = dev.subgroup_size
    wg = 256 if sgs >= 16 else 16 * sgs
    shape = [wg, 4, max(1, min(16, 256 // n_heads)), 256]
    env = os.environ.get("SHADERLM_ATTN")
    if env:
        vals = [int(v) for v in env.split(",")]
        shape[:len(vals)] = vals
    return tuple(shape)


def glu(dev, gate_up, out, st, *, ffn: int, gelu=False) -> Dispatch:
    pipe = dev.pipeline("glu", ACT_GELU=gelu)
    bg = dev.bind_group(pipe, [dev.uniform(ffn, 0, 0, 0), st, gate_up, out])
    return Dispatch(pipe, bg, lambda n: (cdiv(ffn, 256), n), label="glu")


def sample(dev, logits, tokens, st, params) -> Dispatch:
    """`params`: a uniform buffer from sample_params(); rewritten by the host when settings change.
    The sampler reads row 0 of `logits` as vec4s (Device buffers are whole vec4s; lanes past the
    vocabulary are masked)."""
    # 512 threads x 16 vec4 loads: on the H200, 512 x 8 was within 2%, 1,024 threads gained with
    # top-k/top-p on 1B and lost on SmolLM2, 256 x 16 lost 40% with top-k/top-p
    lim = int(dev.limits.get("max-compute-invocations-per-workgroup", 256))
    pipe = dev.pipeline("sample", WG=min(512, lim), U=16)
    bg = dev.bind_group(pipe, [params, st, logits, tokens])
    return Dispatch(pipe, bg, (1, 1, 1), label="sample")


def sample_params(vocab: int, temperature=0.0, top_k=0, top_p=1.0, seed=0) -> tuple:
    return (vocab, int(top_k), float(temperature), float(top_p), int(seed) & 0xFFFFFFFF, 0, 0, 0)


# ---- Qwen3 / Gemma 3 ------------------------------------------------------------------------------
def head_norm(dev, qkv, q_w, k_w, st, *, n_heads: int, n_kv: int, head_dim: int, eps: float) -> Dispatch:
    """Per-head RMSNorm of every Q and K head of every token, in place in the qkv rows (before RoPE)."""
    wg = 64
    pipe = dev.pipeline("head_norm", WG=wg)
    bg = dev.bind_group(pipe, [dev.uniform(n_heads, n_kv, head_dim, float(eps)), st, qkv, q_w, k_w])
    return Dispatch(pipe, bg, lambda n: (n_heads + n_kv, n), label="head_norm")


def add_rmsnorm(dev, y, w, x, st, *, dim: int, eps: float, next_w=None, xn=None) -> Dispatch:
    """x[t] += rmsnorm(y[t]) * w; with next_w, also xn[t] = rmsnorm(x[t]) * next_w (the next pre-norm)."""
    nxt = next_w is not None
    pipe = dev.pipeline("add_rmsnorm", WG=WG, NEXT=nxt)
    res = [dev.uniform(dim, 0, float(eps), 0), st, y, w, x] + ([next_w, xn] if nxt else [])
    return Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (n, 1), label="add_rmsnorm")


def softcap(dev, logits, st, *, vocab: int, cap: float) -> Dispatch:
    """logits = cap * tanh(logits / cap) over this batch's logit rows (from st.out_row0)."""
    pipe = dev.pipeline("softcap")
    bg = dev.bind_group(pipe, [dev.uniform(vocab, 0, float(cap), 0), st, logits])
    return Dispatch(pipe, bg, lambda n: (cdiv(vocab, 256), n), label="softcap")
