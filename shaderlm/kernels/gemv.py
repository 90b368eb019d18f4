"""The decode GEMV (gemv.wgsl, gemv_rows.wgsl): one token's x times a compact quantized matrix, and
the shapes it can run in, which the tuner searches per adapter.

A lane loads a chunk of a row's wide block at a time (16-byte loads) and reuses its slice of x over
several rows; x comes in as integer digits for integer dots where the weight type allows: int8 where
the weights are flagged for it (int8 activations: the default on GPUs, not exact), else 24-bit fixed
point (x24: each 16-element run of x as integers below 2^22 times a power-of-two scale, three signed
byte digits; its rounding is under 4 f32 ulps of the run's largest element, the order of an f32 dot's
own); or as f32 (the tuner's twin of each integer shape, for adapters whose integer dots are slow).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from ..gpu.plan import Dispatch
from ..gpu.tuner import Tunable
from . import pipeline
from .grid import cdiv, grid_1d
from .tuning import tuned_shape
from .weights import GPUWeight


class GemvShape(NamedTuple):
    wg: int              # lanes per workgroup
    rows: int            # rows per row group
    steps: int = 1       # chunk steps per trip over a row
    groups: int = 1      # row groups per workgroup (HOIST: x converted once for all of them)
    int_x: int = 0       # x as integer digits for integer dots (x24, or int8 where the weights are flagged)
    bfly: int = 0        # one subgroup butterfly reduces a group's row sums
    prefetch: int = 0    # the next row group's weights loaded a group ahead (with groups > 1)

    @classmethod
    def of(cls, shape) -> "GemvShape":
        """A shape from a tuple or list of 2 to 7 ints (the rest take their defaults)."""
        return cls(*(int(v) for v in shape))

    @staticmethod
    def valid(shape) -> bool:
        """A cached list this kernel could be given."""
        return (len(shape) == 7 and all(0 < v <= 4096 for v in shape[:4]) and all(v in (0, 1) for v in shape[4:]))

    def label(self) -> str:
        """WGxROWS[xSTEPS][/GROUPS][ int][ bf][ pf]"""
        s = "x".join(map(str, self[:3] if self.steps != 1 else self[:2]))
        return s + f"/{self.groups}" * (self.groups > 1) + " int" * self.int_x + " bf" * self.bfly + " pf" * self.prefetch


def wide_ok(w) -> bool:
    """The decode GEMV takes this weight: its type has a wide decoder and K whole wide blocks."""
    q = w.qtype
    return q.wide is not None and w.cols % q.wide[0] == 0


def can_pair(wa, wb) -> bool:
    """gemv_pair applies: both weights taken by the decode GEMV, one binding each, the same K."""
    return wide_ok(wa) and wide_ok(wb) and wa.cols == wb.cols and len(wa.chunks) == len(wb.chunks) == 1


def chunks_per_row(w) -> int:
    """The decode GEMV's chunks (one lane's share of a wide block at a time) in a row of `w`."""
    block, per_block, _ = w.qtype.wide
    return w.cols // block * per_block


def int_x_ok(ws) -> bool:
    """The weights' GEMV can take x as integer digits: their decoders have the integer dot, and x is
    either flagged for int8 (int8 activations) or allowed 24-bit fixed point (x24). Where the adapter's
    integer dots are slow, the tuner's f32 twin wins instead (refine)."""
    return all(w.qtype.int8_dot and (w.int8_x or w.x24) for w in ws)


def default_shape(dev, w, glu: bool = False, copies: int = 1) -> GemvShape:
    """The built-in shape for `w`, before tuning.

    The workgroup strides over a row's chunks: its size is the largest power of two from 32 to 128
    (and at least the subgroup) not over the chunk count, so no lane idles on the first pass. Rows per
    workgroup: enough that a lane has about 128 bytes of loads in flight per chunk step, but no more
    than keeps about 768 workgroups over the grid's `copies` of the rows (a token's picked experts; small
    matrices need the parallelism more; in whole decode steps fewer rows won over isolated-GEMV sweeps'
    choice). One chunk step a trip, one row group."""
    chunks, load = chunks_per_row(w), w.qtype.wide[2]
    lim = dev.limit("max-compute-invocations-per-workgroup", 256)
    wg = 32
    while wg * 2 <= min(chunks, 128, lim):
        wg *= 2
    wg = min(max(wg, dev.subgroup_size or 1), lim)
    load *= 2 if glu else 1
    out_rows = w.rows // 2 if glu else w.rows
    rows = max(1, min(8, round(128 / load), out_rows * copies // 768))
    return GemvShape(wg, rows)


def bfly_values(rows: int, glu: bool) -> int:
    """The row sums a group of `rows` rows reduces (and GLU's up rows), rounded up to a power of 2:
    what gemv_rows.wgsl's butterfly (SG_BFLY) takes."""
    return 1 << (rows * (2 if glu else 1) - 1).bit_length()


def bfly_ok(dev, rows: int, glu: bool) -> bool:
    """gemv_rows.wgsl can reduce a group's row sums in one butterfly: subgroups, and 2 to 8 values
    within the subgroup size."""
    return dev.has_subgroups and 2 <= bfly_values(rows, glu) <= min(8, dev.subgroup_size or 1)


def fits(dev, shape, nt: int = 1) -> bool:
    """The partial sums of `shape` for nt tokens a workgroup fit the adapter's workgroup memory."""
    s = GemvShape.of(shape)
    part = nt * (s.groups * s.rows + 1) * s.wg // 2 + s.wg      # floats: part, norm_part, the reduction buffer
    return 4 * part <= dev.limit("max-compute-workgroup-storage-size", 16384)


def hoist_ok(dev, ws, shape) -> bool:
    """gemv.wgsl can run `shape` with several row groups per workgroup (HOIST): one trip covers every
    chunk of a row, and the partial sums fit the adapter's workgroup memory."""
    s = GemvShape.of(shape)
    return (s.wg * s.steps >= max(map(chunks_per_row, ws)) and s.groups * s.rows <= s.wg and fits(dev, s))


def batch_split(dev, shape, batch: int, nt_max: int = 1) -> tuple[int, int]:
    """(tokens a workgroup, token groups) for a batch of `batch` tokens in `shape`: up to nt_max tokens
    a workgroup (their x digits are in registers) as workgroup memory allows, the rest in groups side
    by side in the grid."""
    nt = max(1, min(batch, nt_max))
    while nt > 1 and not fits(dev, shape, nt):
        nt -= 1
    return nt, cdiv(batch, nt)


def hoist_lanes(dev, chunks: int, steps: int) -> int:
    """The fewest lanes (a multiple of the subgroup size or of 32, whichever is larger) covering a
    row's `chunks` in `steps` chunk steps: the row-group shapes' workgroup size."""
    sgs = max(32, dev.subgroup_size or 1)
    return max(sgs, -(-chunks // steps // sgs) * sgs)


def candidates(dev, ws, glu: bool, default: GemvShape) -> list[GemvShape]:
    """Shapes the tuner tries for a decode GEMV over weights `ws` (one, or gemv_pair's two): the
    default first, then workgroups of 32-256 lanes (at least the subgroup, at most twice the chunks
    of a row, so no more than half the lanes idle) by 1-8 rows (1-4 with GLU, whose rows read two
    weight rows), one chunk step per trip; and 2 steps for 2, 4 (and 8) rows where a row has chunks
    for both. Then several row groups per workgroup (HOIST): the fewest lanes that cover a row's
    chunks in 1 or 2 steps, by 1, 2, 4 or 8 rows (not 8 with GLU) and 2, 4 or 8 groups, where that
    leaves at least 128 workgroups; each with and without the prefetch. All in the default's x mode
    (the best one's f32 twin and butterfly twin are tried after: refine)."""
    def shape(g, r, steps=1, groups=1, pf=0):        # in the default's x mode, the butterfly where it fits
        return GemvShape(g, r, steps, groups, default.int_x, int(default.bfly and bfly_ok(dev, r, glu)), pf)
    chunks = min(map(chunks_per_row, ws))
    lim = dev.limit("max-compute-invocations-per-workgroup", 256)
    sgs = max(32, dev.subgroup_size or 1)
    wgs = [g for g in (32, 64, 128, 256) if sgs <= g <= min(lim, 2 * chunks)] or [default.wg]
    rows = (1, 2, 3, 4) if glu else (1, 2, 3, 4, 6, 8)
    out = [shape(*default[:4], default.prefetch)] + [shape(g, r) for g in wgs for r in rows]
    out += [shape(g, r, 2) for g in wgs for r in rows if r in (2, 4, 8) and 2 * g <= chunks]
    most = max(map(chunks_per_row, ws))
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


def refine(shape) -> list[GemvShape]:
    """What the tuner tries after picking a shape: an integer-x shape's f32 twin (integer dots may be slow)
    and a butterfly shape's twin with a subgroupAdd per row (the butterfly wins on some matrices and
    loses on others)."""
    s = GemvShape.of(shape)
    return [t for t, on in ((s._replace(int_x=0), s.int_x), (s._replace(bfly=0), s.bfly)) if on]


def lane_arithmetic(dev, shape, glu: bool) -> tuple:
    """What decides a token's sums in gemv.wgsl: the lanes (a lane's chunks are those i, i + WG, ..),
    integer or f32 x, and how the row sums are reduced (the butterfly where it applies, else a
    subgroupAdd a row). Rows, chunk steps, row groups and the prefetch only regroup the same operations."""
    s = GemvShape.of(shape)
    return s.wg, s.int_x, int(bool(s.bfly) and bfly_ok(dev, s.rows, glu))


def batch_candidates(dev, ws, glu: bool, one: GemvShape, nt: int) -> list[GemvShape]:
    """Shapes for a batch's GEMV (nt tokens a workgroup) with the lane arithmetic of `one`, the shape
    a single token runs, so that a sequence's tokens do not depend on its batch: `one` first, then
    its workgroup with 1-8 rows (1-4 with GLU), one or two chunk steps a trip (two where a row has the
    chunks), and 2, 4 or 8 row groups (HOIST, with and without the prefetch) where they cover a row
    and leave at least 128 workgroups."""
    chunks = min(map(chunks_per_row, ws))
    out_rows = sum(w.rows // 2 if glu else w.rows for w in ws)
    out = [one]
    for r in (1, 2, 3, 4) if glu else (1, 2, 3, 4, 6, 8):
        for steps in (1, 2) if 2 * one.wg <= chunks else (1,):
            out.append(one._replace(rows=r, steps=steps, groups=1, prefetch=0))
        for steps in (1, 2):
            for groups in (2, 4, 8):
                if out_rows >= 128 * r * groups:
                    out += [one._replace(rows=r, steps=steps, groups=groups, prefetch=pf) for pf in (1, 0)]
    return [b for b in dict.fromkeys(out) if batch_shape_ok(dev, ws, glu, b, one, nt)]


def batch_shape_ok(dev, ws, glu: bool, shape, one: GemvShape, nt: int) -> bool:
    """A batch's GEMV can run `shape` with nt tokens a workgroup, and a token's sums are those `one` gives it."""
    s = GemvShape.of(shape)
    return (lane_arithmetic(dev, s, glu) == lane_arithmetic(dev, one, glu) and fits(dev, s, nt)
            and (s.groups == 1 or hoist_ok(dev, ws, s)))


def batch_key(key: str) -> bool:
    """Whether a tuning key is a batch's GEMV shape (_tuning's "gemv... ntN")."""
    return re.fullmatch(r"gemv.* nt\d+", key) is not None


def _tuning(dev, ws, key: str, glu: bool, shape, rebuild, batch: int = 0, nt_max: int = 1,
            copies: int = 1) -> tuple[Tunable, dict]:
    """The Tunable of a decode GEMV over `ws` (gemv's one weight, gemv_pair's two), and the shape's
    gemv.wgsl defines: `shape` if given, else the adapter's tuned one, else default_shape's (of the
    first weight) with integer x where int_x_ok: int8 where the weights are flagged, else x24.
    `batch` tokens (0: one, or as many as the grid's z) share each weight load. Where a workgroup takes
    several of them, the shape is tuned of its own (key "... ntNT": batch_candidates), keeping the lane
    arithmetic of the single token's, so that a token's arithmetic is the same in any batch."""
    base = default_shape(dev, ws[0], glu, copies)
    default = base._replace(int_x=int(int_x_ok(ws)), bfly=int(bfly_ok(dev, base.rows, glu)))
    one = GemvShape.of(tuned_shape(dev, key) or default)
    nt = batch_split(dev, one, batch, nt_max)[0] if batch else 1
    own = None
    if nt > 1:
        key = f"{key} nt{nt}"
        tune = Tunable(key, lambda: batch_candidates(dev, ws, glu, one, nt), rebuild)
        own = tuned_shape(dev, key)
        if own is not None and not batch_shape_ok(dev, ws, glu, own, one, nt):
            own = None                    # tuned against another single-token shape
    else:
        tune = Tunable(key, lambda: candidates(dev, ws, glu, default), rebuild, refine)
    s = GemvShape.of(shape or own or one)
    if s.groups > 1 and not hoist_ok(dev, ws, s):
        raise ValueError(f"GEMV shape {tuple(s)} for {key}: row groups need the {s.wg} x {s.steps} lane steps to "
                         f"cover a row's {max(map(chunks_per_row, ws))} chunks, a lane per row ({s.groups} x "
                         f"{s.rows}) and the partial sums to fit workgroup memory")
    int_x = bool(s.int_x) and int_x_ok(ws)      # a cached integer-x shape with x24 turned off builds f32
    int8 = int_x and all(w.int8_x for w in ws)
    x24 = int_x and not int8
    nt, tg = batch_split(dev, s, batch, nt_max) if batch else (1, 1)
    return tune, dict(WG=s.wg, ROWS=s.rows, STEPS=s.steps, GROUPS=s.groups, HOIST=s.groups > 1,
                      PF=s.groups > 1 and bool(s.prefetch), INT_DOT=int_x, X24=x24,
                      NT=nt, TG=tg, NB=batch or 0xFFFFFFFF, MULTI=nt > 1, **_bfly_defines(dev, s.rows, glu, s.bfly, nt))


def _bfly_defines(dev, rows: int, glu: bool, bfly, nt: int) -> dict:
    """gemv_rows.wgsl's butterfly reduction (SG_BFLY) of `rows` row sums (and GLU's up rows): the
    values rounded up to BFN (a power of 2), passed as BF_ARGS_j for token j, and the subgroup size
    compiled in (SGC) so the masks are constants (the kernel checks the subgroup it runs in and falls back)."""
    if not (bfly and bfly_ok(dev, rows, glu)):
        return dict(SG_BFLY=False)
    bfn = bfly_values(rows, glu)

    def args(j):
        names = [f"acc{i}_{j}" for i in range(rows)] + [f"up{i}_{j}" for i in range(rows if glu else 0)]
        return ", ".join((names + ["0.0"] * 8)[:8])
    return dict(SG_BFLY=True, BFN=bfn, BF2=bfn == 2, BF4=bfn == 4, BF8=bfn == 8, SGC=dev.subgroup_size,
                BF_TAIL=dev.subgroup_size.bit_length() - bfn.bit_length(),
                **{f"BF_ARGS_{j}": args(j) for j in range(nt)})


def act_defines(gelu: bool = False, act=None) -> dict:
    """activation.wgsl's defines for the gated FFN's activation: SiLU, GELU-tanh (`gelu`, or act="gelu"),
    or act=("oai", limit, alpha): gpt-oss's clamped SwiGLU. Without `act`, exactly the defines `gelu`
    alone gave (the same pipelines)."""
    if act is None or act == "silu":
        return dict(ACT_GELU=bool(gelu))
    if act == "gelu":
        return dict(ACT_GELU=True)
    kind, limit, alpha = act
    if kind != "oai":
        raise ValueError(f"unknown activation {act!r}")
    return dict(ACT_GELU=False, ACT_OAI=True, LIMIT=float(limit), ALPHA=float(alpha))


def _defines(w, c, rows: int, row0: int, *, y_stride: int, eps: float) -> dict:
    """gemv.wgsl's specialization for row-chunk `c` of `w` (rows of it computed from output row0)."""
    return dict(QUANT=w.qtype.kernel, WIDE=True, K=w.cols, NROWS=rows, ROW0=row0, DBASE=c.dbase,
                Y_STRIDE=y_stride, EPS=float(eps))


def _grid(dev, n_groups: int, batch: int):
    """The grid of `n_groups` workgroups: for a batch, fixed; else grid z is the token count."""
    gx, gy, _ = grid_1d(dev, n_groups)
    return (gx, gy, 1) if batch else (lambda n: (gx, gy, n))


def gemv(dev, w, x, y, *, y_stride, row0=0, accumulate=False, bias=None, norm=None, eps=0.0,
         glu=False, gelu=False, act=None, shape=None, batch: int = 0, nt_max: int = 1) -> list[Dispatch]:
    """y[t, row0 + r] (+)= W[r] . x[t]: optionally x RMS-normed by `norm` first, a bias added, and
    for a [gate; up] weight the gated activation (`glu`, GELU with `gelu`, else `act`: act_defines)
    written. One token (or as many as the grid's z), or `batch` tokens sharing each weight load.
    `shape`: a GemvShape (or a prefix of one); default the adapter's tuned one, else default_shape."""
    key = f"gemv {w.qtype.name} {w.rows}x{w.cols}" + " glu" * glu + " norm" * (norm is not None) \
        + " int8x" * w.int8_x
    tune, sd = _tuning(dev, [w], key, glu, shape, lambda s: gemv(
        dev, w, x, y, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias, norm=norm, eps=eps,
        glu=glu, gelu=gelu, act=act, shape=s, batch=batch, nt_max=nt_max), batch, nt_max)
    out = []
    for c in w.chunks:
        rows = c.rows // 2 if glu else c.rows
        pipe = pipeline(dev, "gemv", **_defines(w, c, rows, row0 + c.row0, y_stride=y_stride, eps=eps), **sd,
                        BIAS=bias is not None, ACCUMULATE=accumulate, NORM=norm is not None, GLU=glu,
                        **act_defines(gelu, act))
        grid = _grid(dev, cdiv(rows, sd["ROWS"] * sd["GROUPS"]) * sd["TG"], batch)
        out.append(Dispatch(pipe, dev.bind_group(pipe, [None, None, c.buffer, x, y, bias, norm]), grid,
                            label=f"gemv.{w.qtype.name}", bytes=c.buffer.size, tune=tune))
    return out


def gemv_pair(dev, wa, wb, x, y, *, y_stride, norm=None, eps=0.0, shape=None, batch: int = 0,
              nt_max: int = 1) -> list[Dispatch]:
    """Two weights of different types over the same x in one dispatch (gemv.wgsl DUAL): wa's rows
    then wb's, written consecutively from row 0 (decode's Q+K in Q4_K and V in Q6_K). One binding
    each; one shape for both (default: the tuned one, else wa's default_shape); tokens as gemv's."""
    key = (f"gemv_pair {wa.qtype.name}+{wb.qtype.name} {wa.rows}+{wb.rows}x{wa.cols}"
           + " norm" * (norm is not None) + " int8x" * (wa.int8_x and wb.int8_x))
    tune, sd = _tuning(dev, [wa, wb], key, False, shape, lambda s: gemv_pair(
        dev, wa, wb, x, y, y_stride=y_stride, norm=norm, eps=eps, shape=s, batch=batch, nt_max=nt_max), batch, nt_max)
    ca, cb = wa.chunks[0], wb.chunks[0]
    pipe = pipeline(dev, "gemv", **_defines(wa, ca, wa.rows, 0, y_stride=y_stride, eps=eps), **sd,
                    DUAL=True, QUANT_B=wb.qtype.kernel, NROWS_B=wb.rows, ROW0_B=wa.rows, DBASE_B=cb.dbase,
                    NORM=norm is not None)
    per = sd["ROWS"] * sd["GROUPS"]          # rows per workgroup
    grid = _grid(dev, (cdiv(wa.rows, per) + cdiv(wb.rows, per)) * sd["TG"], batch)
    bg = dev.bind_group(pipe, [None, None, ca.buffer, x, y, None, norm, cb.buffer])
    return [Dispatch(pipe, bg, grid, label=f"gemv.{wa.qtype.name}+{wb.qtype.name}",
                     bytes=ca.buffer.size + cb.buffer.size, tune=tune)]


def expert_gemv(dev, w, experts: int, x, y, ids, *, slots: int, y_stride: int, weights=None, norm=None,
                eps=0.0, glu=False, gelu=False, act=None, bias=None, shape=None, batch: int = 0) -> list[Dispatch]:
    """The decode GEMV over a mixture of experts' stacked matrices `w` (`experts` blocks of rows; with
    `glu` each block is an expert's [gate; up]): for each token, its `slots` picked experts (ids[t *
    slots + j] on the GPU) and nothing else read.
    Without `weights`: row t * slots + j of y is expert j's output for token t (x row t).
    With `weights`: y[t] += sum_j weights[t * slots + j] * (expert j of token t) . x[t * slots + j].
    `bias`: per expert, indexed as its rows (with `glu` each expert's [gate; up] biases), added to the
    expert's dot products before the activation and the weight (gpt-oss's experts).
    One token (or as many as the grid's z), or `batch` tokens side by side in the grid."""
    if len(w.chunks) != 1 or w.rows % experts:
        raise ValueError(f"{w.name}: {experts} experts' rows must be in one binding")
    rows_e = w.rows // experts
    out_rows = rows_e // 2 if glu else rows_e
    summed = weights is not None
    # shapes are picked for the row a workgroup reduces: with `weights`, the token's experts' rows as one
    view = GPUWeight(w.name, w.qtype, rows_e, w.cols * (slots if summed else 1), w.chunks, w.nbytes, w.int8_x, w.x24)
    key = f"gemv {w.qtype.name} {rows_e}x{w.cols}" + " glu" * glu + " norm" * (norm is not None) \
        + f" experts{slots}" + " sum" * summed + " int8x" * w.int8_x
    copies = 1 if summed else slots              # the rows' copies in the grid, a token
    lanes = batch * copies
    tune, sd = _tuning(dev, [view], key, glu, shape, lambda s: expert_gemv(
        dev, w, experts, x, y, ids, slots=slots, y_stride=y_stride, weights=weights, norm=norm, eps=eps, glu=glu,
        gelu=gelu, act=act, bias=bias, shape=s, batch=batch), lanes, copies=copies)
    c = w.chunks[0]
    pipe = pipeline(dev, "gemv", **_defines(w, c, out_rows, 0, y_stride=y_stride, eps=eps), **sd,
                    E_BIAS=bias is not None, ACCUMULATE=summed, NORM=norm is not None, GLU=glu,
                    **act_defines(gelu, act), EXPERTS=True, EXPERT_SUM=summed, ESLOTS=slots, EROWS=rows_e)
    n_groups = cdiv(out_rows, sd["ROWS"] * sd["GROUPS"]) * sd["TG"]
    gx, gy, _ = grid_1d(dev, n_groups)
    grid = (gx, gy, 1) if batch else (lambda n: (gx, gy, n * copies))
    bg = dev.bind_group(pipe, [None, None, c.buffer, x, y, bias, norm, None, ids, weights])
    # what a token reads: its picked experts' rows only
    return [Dispatch(pipe, bg, grid, label=f"gemv.{w.qtype.name}.experts", bytes=c.buffer.size * slots // experts,
                     tune=tune)]
