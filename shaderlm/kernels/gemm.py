"""The prefill GEMMs (tokens a pass > 1): y[t, row0 + r] (+)= W[r] . x[t] for a tile of rows x tokens
a workgroup, each weight tile decoded once into workgroup memory.

  f32 (matmul_tiled.wgsl): W dequantized to f32, 64x64 tiles; exact f32 arithmetic.
  int8 (matmul_q8.wgsl): x rounded to int8 per 32 (or 16) elements first (quantize_q8.wgsl), weights
      as their integer quants, dot4I8Packed in i32 and scales applied per block in f32: several times
      the arithmetic rate, at the cost of x's rounding (as llama.cpp's MMQ kernels).
  int8 for a decode batch's few rows (matmul_few.wgsl): the same integer dots and folds with no tiles,
      each weight run decoded once in registers for every row.
  tensor cores (matmul_tc.wgsl, where the device has exact int8 subgroup matrices): W on one 16-bit grid
      a row and x one a token, each as two int8 digits, products of 16 x 16 x 32 into i32; prompts, and
      decode batches of TC_BATCH_ROWS rows or more.
"""
from __future__ import annotations

from ..gpu.plan import Dispatch
from ..gpu.tuner import Tunable
from . import pipeline
from .grid import ROW_WG, cdiv, grid_1d
from .tuning import tuned_shape
from .weights import row_max

# (rows a thread TM, token vec4s a thread TV, 32-element blocks a K step KB[, threads across the tokens TL
# (default 16), threads WG (default 256)]): tiles of WG / TL TM rows x 4 TL TV tokens, in order of preference.
# The first takes 128 threads: a thread's 64 outputs take nearly all 255 registers, so that two of its
# workgroups share a multiprocessor where one of 256 filled it, and one waits at its barrier while the other runs.
Q8_TILES = ((8, 2, 1, 16, 128), (8, 2, 2), (4, 2, 1), (4, 1, 2), (8, 2, 1), (8, 1, 1), (4, 1, 1))
# for a few tokens (a decode batch's rows past matmul_few's): tiles of 32 or 64 tokens, a token's threads
# few; 8 rows a thread first (128 threads: two workgroups an SM), 4 where that leaves too few workgroups
Q8_FEW_TILES = ((8, 1, 1, 8, 128), (8, 1, 1, 16, 128), (4, 1, 2, 8, 128), (4, 1, 2, 16, 128))
MIN_WORKGROUPS = 100        # the next tile where one leaves fewer workgroups


def matmul_f32(dev, w, x, y, st, *, y_stride, row0, accumulate, bias, from_state_row) -> list[Dispatch]:
    pipe = pipeline(dev, "matmul_tiled", QUANT=w.qtype.kernel, BIAS=bias is not None, ACCUMULATE=accumulate)
    out = []
    for c in w.chunks:
        params = dev.uniform(w.cols, c.rows, row0 + c.row0, c.dbase, y_stride, w.cols, int(from_state_row), 0)
        res = [params, st, c.buffer, x, y] + ([bias] if bias is not None else [])
        gx = cdiv(c.rows, 64)
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n, gx=gx: (gx, cdiv(n, 64)),
                            label=f"matmul_tiled.{w.qtype.name}", bytes=c.buffer.size))
    return out


def q8_defines(tm: int, tv: int, kb: int = 1, tl: int = 16, wg: int = 256) -> dict:
    bm, bn = wg // tl * tm, 4 * tl * tv
    if kb * bn > wg or (bm * kb * 4) % wg:
        raise ValueError(f"int8 GEMM tile {(tm, tv, kb, tl, wg)}: a thread per token's K-step scales and whole "
                         f"weight loads a thread are needed")
    return dict(TM=tm, TV=tv, KB=kb, TL=tl, WG=wg, RG=tm // 4, LW=bm * kb * 4 // wg, XL=cdiv(bn * kb * 2, wg),
                BM=bm, BN=bn, WQ=8 * kb * bm // 4, WS=2 * kb * bm // 4, TQ=8 * kb * bn // 4, TD=2 * kb * bn // 4,
                TS=2 * kb * bn // 4)


def tile_size(tile) -> tuple[int, int]:
    """(rows, tokens) of a workgroup's tile (TM, TV[, KB[, TL, WG]])."""
    d = q8_defines(*tile)
    return d["BM"], d["BN"]


def q8_workgroup_bytes(*tile) -> int:
    d = q8_defines(*tile)
    return 2 * 16 * (d["WQ"] + 2 * d["WS"] + d["TQ"] + d["TD"] + d["TS"])


def full_tile(tile) -> tuple:
    """A tile as all five of (TM, TV, KB, TL, WG), the defaults filled in."""
    return (*tile, *(1, 16, 256)[len(tile) - 2:])


def tile_valid(tile) -> bool:
    """`tile` is five ints q8_defines takes (a cached tile this kernel could be given)."""
    try:
        return len(tile) == 5 and all(0 < v <= 1024 for v in tile) and bool(q8_defines(*tile))
    except ValueError:
        return False


def k_step_fit(tile, cols: int) -> tuple:
    """`tile` with K steps of 32 where K = cols is no whole number of its K steps."""
    return tuple(tile) if cols % (32 * tile[2]) == 0 else (tile[0], tile[1], 1, *tile[3:])


def tile_label(tile) -> str:
    """A tile as rows x tokens / threads."""
    d = q8_defines(*tile)
    return f"{d['BM']}x{d['BN']}/{d['WG']}"


def tile_fits(dev, tile, cols: int) -> bool:
    """The adapter can run `tile` over K = cols: its workgroup memory and threads, whole K steps."""
    return (q8_workgroup_bytes(*tile) <= dev.limit("max-compute-workgroup-storage-size", 16384)
            and tile[4] <= dev.limit("max-compute-invocations-per-workgroup", 256) and cols % (32 * tile[2]) == 0)


def q8_candidates(dev, cols: int, default, few: bool = False) -> list[tuple]:
    """The tiles the tuner tries for a prompt's int8 GEMM (with `few`, a decode batch's): q8_tile's pick
    first, then every Q8_TILES tile (Q8_FEW_TILES first with `few`) this adapter runs (K steps of 32 where
    K needs them). A token's result is the same bits in all of them."""
    tiles = [full_tile(k_step_fit(t, cols)) for t in (Q8_FEW_TILES + Q8_TILES if few else Q8_TILES)]
    return list(dict.fromkeys([full_tile(default)] + [t for t in tiles if tile_fits(dev, t, cols)]))


def q8_tile(dev, rows: int, cols: int, tokens: int, tiles=None) -> tuple:
    """The first of `tiles` that leaves MIN_WORKGROUPS workgroups or more for `tokens` (else the one
    leaving the most), within the adapter's workgroup memory, with K steps of 32 where K needs them.
    Default tiles: Q8_TILES, or for 64 tokens or fewer those of Q8_FEW_TILES and Q8_TILES whose
    tokens are the fewest that hold them."""
    if tiles is None and tokens <= 64:
        bn = max(32, 1 << (tokens - 1).bit_length())
        tiles = [t for t in Q8_FEW_TILES + Q8_TILES if tile_size(t)[1] == bn]
    tiles = [k_step_fit(t, cols) for t in tiles or Q8_TILES]
    fits = [t for t in dict.fromkeys(tiles) if tile_fits(dev, full_tile(t), cols)]
    groups = {t: cdiv(rows, tile_size(t)[0]) * cdiv(tokens, tile_size(t)[1]) for t in fits}
    for t, n in groups.items():
        if n >= MIN_WORKGROUPS:
            return t
    return max(fits, key=groups.get)


def quantize_q8(dev, x, st, *, k: int, tokens: int, from_state_row: bool, run: int, rows_per_token: int = 1,
                norm=None, eps: float = 0.0, glu_input: dict | None = None,
                digits: bool = False, ready: bool = False) -> tuple[list[Dispatch], tuple]:
    """x's rows (k floats each, at most `tokens` of them; rows_per_token a token) as int8 blocks with a
    scale per `run` (16 or 32) elements: the dispatch and its three buffers. The buffers are scratch
    shared by every GEMM of this shape: plans run their dispatches in order. `norm` (a weight buffer):
    x RMS-normed first, as ops.rmsnorm would write it; `glu_input` (activation defines): x is [gate | up]
    rows of 2k floats and their gated activation is rounded, as ops.glu would write it. `digits`: for
    matmul_tc instead, a token's row on one 16-bit grid as two int8 digit planes, and its grid step
    (two buffers). `ready`: the GEMM before rounded this x the same way into these buffers: no dispatch."""
    if norm is not None and (glu_input is not None or from_state_row or rows_per_token != 1):
        raise ValueError("quantize_q8 folds a norm only into plain rows from the first")
    if digits and rows_per_token != 1:
        raise ValueError("quantize_q8 rounds to digits only a row a token")
    nb = k // 32
    if digits:
        bufs = (dev.scratch(f"tc.digits.{tokens}x{k}", 2 * tokens * k), dev.scratch(f"tc.steps.{tokens}", 4 * tokens))
        wg = ROW_WG
    else:
        bufs = q8_blocks(dev, k, tokens)
        # a normed row in one workgroup (a power of 2 of threads for its tree), a thread its blocks
        wg = min(ROW_WG, max(64, 1 << (nb - 1).bit_length())) if norm is not None else 64
    if ready:
        return [], bufs
    normed = {"BPT": cdiv(nb, wg)} if norm is not None and not digits else {}     # the normed pass's blocks a thread
    pipe = pipeline(dev, "quantize_q8", RUN32=run == 32, WG=wg, NORM=norm is not None, TOKEN=digits,
                    REDUCE=norm is not None or digits,          # the workgroup reductions (reduce.wgsl)
                    GLU=glu_input is not None, **normed, **(glu_input or {}))
    res = [dev.uniform(k, int(from_state_row), rows_per_token, tokens * k // 4), st, x, *bufs]
    if norm is not None:
        res += [None] * (6 - len(res)) + [norm, dev.uniform(float(eps), 0, 0, 0)]
    gx = 1 if digits or norm is not None else cdiv(nb, wg)
    return [Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (gx, n * rows_per_token),
                     label="quantize_tc" if digits else "quantize_q8")], bufs


def q8_blocks(dev, k: int, tokens: int) -> tuple:
    """The scratch buffers (words, scales, sums) of `tokens` rows of k values rounded in int8 blocks
    (quantize_q8.wgsl's layout), shared by every GEMM of this shape: plans run their dispatches in order."""
    nb = k // 32
    return (dev.scratch(f"q8.words.{tokens}x{k}", tokens * k), dev.scratch(f"q8.scales.{tokens}x{k}", tokens * nb * 8),
            dev.scratch(f"q8.sums.{tokens}x{k}", tokens * nb * 8))


def on_tensor_cores(dev, max_tokens: int, decode_batch: bool) -> bool:
    """Whether matmul_q8 (no tile asked for) runs on matmul_tc: prompts from TC_MIN_TOKENS, decode batches
    from TC_BATCH_ROWS, where the adapter has them."""
    return max_tokens >= (TC_BATCH_ROWS if decode_batch else TC_MIN_TOKENS) and tensor_cores(dev)


def decode_batch_x(dev, w, max_tokens: int, tile=None) -> tuple | None:
    """A decode batch's int8 GEMM over w (matmul_q8's `tile`) rounds its x into int8 blocks (not the
    tensor cores' digits): (their buffers, the run length), for a kernel that writes x to write them too
    (matmul_q8's `x_ready`); None on the tensor cores."""
    if tile is None and on_tensor_cores(dev, max_tokens, True):
        return None
    return q8_blocks(dev, w.cols, max_tokens), w.qtype.iq8_run


def shared_run(ws) -> int | None:
    """The run length a decode batch's int8 GEMMs over one x (matmuls into consecutive rows: Q/K/V,
    gate/up) round it in: the longest of their quantized types', so that one rounding pass serves them
    all (a type of runs of 16 reads each half's scale and sum, equal in a run of 32: a coarser x for it,
    one dispatch fewer a layer). None where no type is quantized in blocks."""
    return max((w.qtype.iq8_run for w in ws if w.qtype.blocked), default=None)


def _type_defines(w) -> dict:
    """The int8 GEMMs' defines for the weight's type: its decoder, whether its runs have mins, its run
    length, whether it loads its runs in 16 bytes (W4)."""
    return dict(QUANT=w.qtype.kernel, MINS=w.qtype.iq8_min, RUN32=w.qtype.iq8_run == 32,
                W4=w.qtype.raw8_int8)


def _xbufs(w, xbufs: tuple) -> tuple:
    """The GEMM's x bindings: x's sums only for a type with mins (MINS)."""
    xq, xd, xs = xbufs
    return xq, xd, xs if w.qtype.iq8_min else None


SPLIT_GROUPS = 512
MIN_SLICE = 512                     # elements of K a slice at least
PARTIALS = 2 * 64 * SPLIT_GROUPS    # partial sums a token of a split GEMM holds at most (rows x slices)


def k_slices(rows: int, cols: int) -> int:
    """How many slices of K a few-token GEMM of this matrix splits into (each MIN_SLICE elements or more,
    a multiple of 64): enough for SPLIT_GROUPS workgroups of 64 rows. A function of the matrix alone, so
    that a token's sums are added in the same order in every batch."""
    return _halvings(cdiv(rows, 64), cols, SPLIT_GROUPS, 64, MIN_SLICE)


def _halvings(tiles: int, cols: int, target: int, k_step: int, min_slice: int) -> int:
    """Slices of K (a power of two) for a GEMM of `tiles` workgroups: K halved until they make `target`,
    while each slice stays whole K steps of `k_step` and at least `min_slice` elements."""
    s = 1
    while tiles * s < target and cols % (2 * k_step * s) == 0 and cols // (2 * s) >= min_slice:
        s *= 2
    return s


FEW_TOKENS = 48                     # decode batches of this many rows or fewer run matmul_few; larger ones the
                                    # split GEMM (from 64 rows as fast or faster)
# matmul_few's built-in shape: a thread's rows (their sums and x in registers), the threads sharing a row's runs
# (a token's sums depend on them: a matrix keeps its shape at every batch size), a workgroup's threads at least
# (whole row groups: lanes x the token groups) and a thread's tokens. More tokens take more thread groups, each
# decoding the rows' runs again (from L1): two groups of 8 tokens on 4 rows beat one thread's 16 on 2
FEW_SHAPE = (4, 16, 64, 8)
# the shapes the tuner tries for each matrix, after the built-in one: more lanes on K leave more workgroups
# where a matrix has few rows (V, a small model's); more tokens a thread decode each run for more of them
FEW_SHAPES = ((4, 16, 128, 8), (4, 32, 128, 8), (4, 64, 128, 8), (2, 16, 64, 8), (2, 32, 64, 8), (4, 16, 64, 16),
              (2, 16, 64, 16))
FEW_TUNING_ROWS = 16                # Serving.tune times them on the largest step up to this many rows


def few_shape_valid(shape) -> bool:
    """`shape` is (rows a thread, lanes, threads, tokens a thread) matmul_few builds (a cached shape this kernel
    could be given)."""
    return (len(shape) == 4 and 1 <= shape[0] <= 8 and shape[1] in (8, 16, 32, 64)
            and shape[2] in (16, 32, 64, 128, 256, 512, 1024) and 1 <= shape[3] <= 16)


def few_layout(shape, tokens: int) -> dict:
    """matmul_few's defines for `shape` and a batch of `tokens` rows (BM: rows a workgroup)."""
    r, lanes, threads, tokens_a_thread = shape
    ts = cdiv(tokens, tokens_a_thread)                  # thread groups sharing the tokens
    nt = cdiv(tokens, ts)
    bm = cdiv(threads, lanes * ts) * r
    return dict(R=r, L=lanes, TS=ts, NT=nt, WG=bm // r * ts * lanes, PART=bm * ts * nt * lanes, BM=bm)


def few_fits(dev, shape) -> bool:
    """The adapter's workgroup threads and memory hold matmul_few in `shape` at every batch it runs (up to
    FEW_TOKENS rows), so that a matrix keeps it at every batch size."""
    lay = few_layout(shape, FEW_TOKENS)
    return (lay["WG"] <= dev.limit("max-compute-invocations-per-workgroup", 256)
            and 4 * lay["PART"] <= dev.limit("max-compute-workgroup-storage-size", 16384))


def few_shape_label(shape) -> str:
    """matmul_few's shape as `shaderlm tune` shows it: rows r, lanes l, threads t, tokens a thread n."""
    return "{}r.{}l.{}t.{}n".format(*shape)


def _tuned_or(dev, key: str, usable, default):
    """`key`'s cached shape where `usable` (this kernel builds it on this adapter), else `default`."""
    tuned = tuned_shape(dev, key)
    return tuned if tuned is not None and usable(tuned) else default


def matmul_few(dev, w, x, y, st, *, max_tokens, y_stride, row0, accumulate, bias, from_state_row, run: int,
               **fused) -> list[Dispatch]:
    """The int8 GEMM for a few tokens (a decode batch's rows; matmul_few.wgsl): each weight run decoded
    once into registers and dotted with every token's, no workgroup tiles. The matrix's tuned shape
    (key "... batch", one for every batch size, so that a token's sums are the same for every max_tokens),
    else the built-in one. `run`: x's run length; `fused`: quantize_q8's norm / eps / glu_input / ready."""
    out, xbufs = quantize_q8(dev, x, st, k=w.cols, tokens=max_tokens, from_state_row=from_state_row,
                             run=run, **fused)
    gemms = dict(max_tokens=max_tokens, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias,
                 from_state_row=from_state_row)
    key = f"matmul_few {w.qtype.name} {w.rows}x{w.cols} batch"
    tune = Tunable(key, lambda: [s for s in dict.fromkeys((FEW_SHAPE, *FEW_SHAPES)) if few_fits(dev, s)],
                   lambda s: _few_gemms(dev, w, xbufs, y, st, shape=s, tune=tune, **gemms))
    shape = _tuned_or(dev, key, lambda s: few_shape_valid(s) and few_fits(dev, s), FEW_SHAPE)
    return out + _few_gemms(dev, w, xbufs, y, st, shape=shape, tune=tune, **gemms)


def _few_gemms(dev, w, xbufs, y, st, *, shape, max_tokens, y_stride, row0, accumulate, bias, from_state_row,
               tune=None) -> list[Dispatch]:
    """matmul_few's dispatches over x's rounding `xbufs` in `shape`: one a row chunk."""
    lay = few_layout(shape, max_tokens)
    bm = lay.pop("BM")
    types = _type_defines(w)
    if w.qtype.raw32:                       # a row's runs in 16-byte loads, each a trip ahead
        types.update(W4=True, RAW32=True)
    pipe = pipeline(dev, "matmul_few", **types, BIAS=bias is not None, ACCUMULATE=accumulate, **lay)
    out = []
    for c in w.chunks:
        params = dev.uniform(w.cols, c.rows, row0 + c.row0, c.dbase, y_stride, int(from_state_row), max_tokens, 0)
        res = [params, st, c.buffer, *_xbufs(w, xbufs), y] + ([bias] if bias is not None else [])
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), grid_1d(dev, cdiv(c.rows, bm)),
                            label=f"matmul_few.{w.qtype.name}", bytes=c.buffer.size, tune=tune))
    return out


TC_TILE = (128, 128, 512)           # matmul_tc.wgsl's rows, tokens and threads (16 subgroups of 32 x 32) for a prompt
# a prompt's tiles the tuner tries for each matrix, the default first: smaller ones leave more workgroups
# where a matrix has few rows (a small model's)
TC_PROMPT_TILES = (TC_TILE, (64, 128, 256), (128, 64, 512), (64, 64, 256))
TC_K_STEP = 64                      # elements of K it stages at once (a last half step is zeros)
TC_MIN_TOKENS = 128                 # fewer leave most of a tile's products unused: matmul_q8 takes them
# A decode batch of this many rows or more takes matmul_tc, up to TC_BATCH_TILE's tokens in its tiles (a
# pass over the weights costs about the same whatever the tokens: below this, matmul_q8 and matmul_few win)
TC_BATCH_ROWS = 48
# a decode batch's tiles the tuner tries for each matrix (rows, tokens, threads), the default first (8 subgroups
# of 32 x 16): the best differs by matrix, and a matrix keeps its tile at every batch size
TC_BATCH_TILES = ((64, 64, 256), (64, 64, 128), (128, 64, 512), (128, 64, 256))
TC_BATCH_TILE = TC_BATCH_TILES[0]
TC_EMULATE = False                  # tests: matmul_tc's matrix operations in plain WGSL, on any adapter (slow)
TC_SPLIT_BELOW = 128                # a matrix whose tiles make fewer workgroups (a wave or less on a large GPU)
TC_SPLIT_TARGET = 256               # has K split in slices until they make this many
TC_MIN_SLICE = 512                  # elements of K a slice at least
TC_PARTIALS = 2 * TC_SPLIT_TARGET * TC_TILE[0] * TC_TILE[1]    # partial sums a split GEMM holds at most


def tuning_tokens(tokens: int) -> int:
    """A pass's tokens as a GEMM's tuning key counts them: rounded up to a power of 2, so that contexts
    (and decode batches) of about the same size share a tuning."""
    return 1 << (tokens - 1).bit_length()


def tc_slices(rows: int, cols: int, tokens: int, tile: tuple = TC_TILE) -> int:
    """How many slices of K matmul_tc splits a matrix into for `tokens` tokens in tiles of `tile`'s rows x
    tokens (their sums added in order by matmul_split): 1 unless its tiles make under TC_SPLIT_BELOW
    workgroups."""
    tiles = cdiv(rows, tile[0]) * cdiv(tokens, tile[1])
    return 1 if tiles >= TC_SPLIT_BELOW else _halvings(tiles, cols, TC_SPLIT_TARGET, TC_K_STEP, TC_MIN_SLICE)


def _tc_row_bytes() -> int:
    """Bytes a staged row of a K step in matmul_tc: 16 of padding keep ldmatrix off bank conflicts
    (emulated, none: its tiles then fit 32 KiB, what CPU adapters offer)."""
    return TC_K_STEP if TC_EMULATE else TC_K_STEP + 16


def tensor_cores(dev) -> bool:
    """Whether prompts' GEMMs (and large decode batches') run on matmul_tc: exact int8 subgroup matrices
    (or TC_EMULATE), and room for its prompt tile."""
    return (dev.has_int8_matrix or TC_EMULATE) and tc_tile_fits(dev, TC_TILE)


def tc_tile_valid(tile) -> bool:
    """`tile` is a (rows, tokens, threads) matmul_tc builds (a cached decode batch's tile): whole subgroups
    of 32 rows x 16 tokens or more, and one to eight threads staging a row's K step."""
    if len(tile) != 3 or not all(0 < v <= 1024 for v in tile):
        return False
    bm, bn, wg = tile
    return (bm % 32 == 0 and bn % 16 == 0 and wg % 32 == 0 and wg % bm == 0 and wg <= 8 * bm
            and (bm * bn) % (16 * wg) == 0)


def tc_tile_label(tile) -> str:
    """A tensor-core tile as rows x tokens / threads (as tile_label shows an int8 GEMM's)."""
    return "{}x{}/{}".format(*tile)


def _tc_workgroup_words(tile) -> tuple[int, int]:
    """matmul_tc's workgroup buffers in `tile` (i32 words: WSW, XS): both digits of a K step of W's rows and
    of x's tokens, or after the loop its subgroups' sums, whichever is more."""
    bm, bn, wg = tile
    rw = _tc_row_bytes() // 4
    return max(2 * bm * rw, 8 * wg), max(2 * bn * rw, 8 * wg)


def tc_tile_fits(dev, tile) -> bool:
    """The adapter's workgroup memory and threads hold matmul_tc in `tile`."""
    return (4 * sum(_tc_workgroup_words(tile)) <= dev.limit("max-compute-workgroup-storage-size", 0)
            and tile[2] <= dev.limit("max-compute-invocations-per-workgroup", 0))


def batch_tile_key(key: str) -> bool:
    """Whether a tuning key is a decode batch's GEMM tile or shape (matmul_tc's, matmul_q8's or matmul_few's
    "... batch")."""
    return key.startswith(("matmul_tc ", "matmul_q8 ", "matmul_few ")) and key.endswith(" batch")


# the most rows of the decode step Serving.tune times a batch's GEMM tiles on (the tensor cores' batch tiles
# hold this many tokens)
TILE_TUNING_ROWS = TC_BATCH_TILE[1]


def batch_tuning_rows(key: str) -> int:
    """The most rows of the decode step that a batch key (batch_tile_key) is timed on: matmul_few's shapes
    at a batch size it runs, the tiles at TILE_TUNING_ROWS."""
    return FEW_TUNING_ROWS if key.startswith("matmul_few ") else TILE_TUNING_ROWS


def matmul_tc(dev, w, x, y, st, *, max_tokens, y_stride, row0, accumulate, bias, from_state_row,
              decode_batch: bool = False, **fused) -> list[Dispatch]:
    """The GEMM on tensor cores (matmul_tc.wgsl; the device's has_int8_matrix): x rounded to two int8
    digits on one grid a token, the weights decoded to theirs (one grid a row, weights.row_max) as
    they are staged. A prompt takes the matrix's tuned tile for its pass's tokens; a decode batch (up to
    TC_BATCH_TILE's tokens) the matrix's tuned batch tile, and its slices of K are a function of the
    matrix and that tile (its sums are integers until each slice's scaling), so that a token's result
    is the same in every batch.
    `fused`: quantize_q8's norm / eps / glu_input / ready."""
    out, (xq, xd) = quantize_q8(dev, x, st, k=w.cols, tokens=max_tokens, from_state_row=from_state_row,
                                run=32, digits=True, **fused)
    gemms = dict(max_tokens=max_tokens, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias,
                 from_state_row=from_state_row)
    if decode_batch and max_tokens > TC_BATCH_TILE[1]:
        return out + _tc_gemms(dev, w, xq, xd, y, st, tile=TC_TILE, decode_batch=True, **gemms)
    if decode_batch:
        key, tiles, default = f"matmul_tc {w.qtype.name} {w.rows}x{w.cols} batch", TC_BATCH_TILES, TC_BATCH_TILE
    else:
        key = f"matmul_tc {w.qtype.name} {w.rows}x{w.cols} t{tuning_tokens(max_tokens)}"
        tiles, default = TC_PROMPT_TILES, TC_TILE
    tune = Tunable(key, lambda: [t for t in tiles if tc_tile_fits(dev, t)],
                   lambda s: _tc_gemms(dev, w, xq, xd, y, st, tile=s, decode_batch=decode_batch, tune=tune, **gemms))
    tile = _tuned_or(dev, key, lambda t: tc_tile_valid(t) and tc_tile_fits(dev, t), default)
    return out + _tc_gemms(dev, w, xq, xd, y, st, tile=tile, decode_batch=decode_batch, tune=tune, **gemms)


def _tc_gemms(dev, w, xq, xd, y, st, *, tile, max_tokens, y_stride, row0, accumulate, bias, from_state_row,
              decode_batch, tune=None) -> list[Dispatch]:
    """matmul_tc's dispatches over x's digits (xq, xd) in `tile` (rows, tokens, threads): one a row chunk,
    and where K is split, the slices' sums."""
    out = []
    bm, bn, wg = tile
    rw = _tc_row_bytes() // 4
    wsw, xs = _tc_workgroup_words(tile)
    for c in w.chunks:
        slices = tc_slices(c.rows, w.cols, bn if decode_batch else max_tokens, (bm, bn))
        kw = dict(BIAS=bias is not None, ACCUMULATE=accumulate) if slices == 1 else dict(PARTIALS=True)
        pipe = pipeline(dev, "matmul_tc", QUANT=w.qtype.kernel, W4=w.qtype.raw8, **kw, SPLIT=slices, WG=wg,
                        BM=bm, BN=bn, NJ=bm * bn // (16 * wg), EW=TC_K_STEP // 8 * bm // wg,
                        XV=cdiv(TC_K_STEP // 8 * bn, wg), WSW=wsw, XS=xs,
                        RS=4 * rw, EMULATE=TC_EMULATE, KS=TC_K_STEP, KU=TC_K_STEP // 32, TAIL=w.cols % TC_K_STEP != 0)
        params = dev.uniform(w.cols, c.rows, row0 + c.row0, c.dbase, y_stride, int(from_state_row),
                             max_tokens * w.cols // 4, max_tokens)
        part = y if slices == 1 else dev.scratch("tc.partials", 4 * TC_PARTIALS)
        res = [params, st, c.buffer, row_max(dev, w, c), xq, xd, part] + ([bias] if bias is not None and slices == 1 else [])
        gx = cdiv(c.rows, bm)
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n, gx=gx, z=slices, bn=bn: (gx, cdiv(n, bn), z),
                            label=f"matmul_tc.{w.qtype.name}", bytes=c.buffer.size, tune=tune))
        if slices > 1:
            out.append(_split_sum(dev, c, part, y, st, slices=slices, row0=row0, y_stride=y_stride,
                                  part_tokens=max_tokens, from_state_row=from_state_row, bias=bias,
                                  accumulate=accumulate, tune=tune))
    return out


def _split_sum(dev, c, part, y, st, *, slices, row0, y_stride, part_tokens, from_state_row, bias, accumulate,
               tune=None) -> Dispatch:
    """matmul_split: y (+)= the `slices` partial sums of chunk c's outputs (part_tokens tokens a slice),
    added in slice order, then the epilogue (bias, accumulate). `tune`: the GEMM's Tunable (the tuner
    rebuilds the two together)."""
    pipe = pipeline(dev, "matmul_split", SPLIT=slices, BIAS=bias is not None, ACCUMULATE=accumulate)
    params = dev.uniform(c.rows, row0 + c.row0, y_stride, part_tokens, int(from_state_row), 0, 0, 0)
    res = [params, st, part, None, None, None, y] + ([bias] if bias is not None else [])
    gx = cdiv(c.rows, 256)
    return Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (gx, n), label="matmul_split", tune=tune)


def matmul_q8(dev, w, x, y, st, *, max_tokens, y_stride, row0, accumulate, bias, from_state_row,
              tile=None, decode_batch: bool = False, x_after=None, x_run: int | None = None,
              x_ready: bool = False, **fused) -> list[Dispatch]:
    """x has at most max_tokens rows; `tile`: (TM, TV[, KB[, TL, WG]]) for every row chunk, else for a
    prompt the adapter's tuned tile, else q8_tile's choice (KB 1 where K is not a multiple of 32 KB); a
    prompt's GEMMs carry a Tunable for the tile (a token's result is the same in every tile).
    `decode_batch` (x: a serving step's rows): up to FEW_TOKENS tokens matmul_few; more, K in k_slices'
    slices (their tiles alone would leave the GPU idle), their partial sums added in order by a second
    dispatch. On a device with exact int8 subgroup matrices, a
    prompt's GEMMs (TC_MIN_TOKENS or more, no tile asked for) and a decode batch's of TC_BATCH_ROWS or
    more run on them (matmul_tc).
    `x_after`: a weight this GEMM's x (the same rows, norm and activation) was just taken by, through
    this function with the same tokens and `x_run`: x's rounding is reused where it is the same (the
    tensor cores' digits whatever the types; int8 runs of the same length).
    `x_run`: for a decode batch, the run length x is rounded in (shared_run: 32 lets a type of runs of
    16 share x with one of 32, a dispatch fewer in a step of a few rows; a prompt keeps each type's runs).
    `x_ready`: the kernel before wrote x's rounding (decode_batch_x's buffers and run): no x pass.
    `fused`: quantize_q8's norm / eps / glu_input."""
    on_tc = tile is None and on_tensor_cores(dev, max_tokens, decode_batch)
    if x_ready and (on_tc or not decode_batch or x_run not in (None, w.qtype.iq8_run)):
        raise ValueError(f"{w.name}: x is rounded before only for a decode batch's int8 blocks in its own runs")
    x_run = x_run if decode_batch else None
    if x_run not in (None, 32, w.qtype.iq8_run):
        raise ValueError(f"{w.name}: {w.qtype.name} takes x in runs of {w.qtype.iq8_run} or 32, not {x_run}")
    run = x_run or w.qtype.iq8_run
    fused["ready"] = x_ready or x_after is not None and (on_tc or (x_run or x_after.qtype.iq8_run) == run)
    kw = dict(max_tokens=max_tokens, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias,
              from_state_row=from_state_row, **fused)
    if on_tc:
        return matmul_tc(dev, w, x, y, st, decode_batch=decode_batch, **kw)
    if decode_batch and max_tokens <= FEW_TOKENS:
        return matmul_few(dev, w, x, y, st, run=run, **kw)
    out, xbufs = quantize_q8(dev, x, st, k=w.cols, tokens=max_tokens, from_state_row=from_state_row,
                             run=run, **fused)
    gemms = dict(max_tokens=max_tokens, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias,
                 from_state_row=from_state_row, decode_batch=decode_batch)
    if tile is not None:
        return out + _q8_gemms(dev, w, xbufs, y, st, tile=tile, **gemms)
    key = f"matmul_q8 {w.qtype.name} {w.rows}x{w.cols} t{tuning_tokens(max_tokens)}"
    key += " batch" * decode_batch
    default = q8_tile(dev, w.chunks[0].rows, w.cols, max_tokens)
    tune = Tunable(key, lambda: q8_candidates(dev, w.cols, default, few=decode_batch),
                   lambda s: _q8_gemms(dev, w, xbufs, y, st, tile=s, tune=tune, **gemms))
    tile = _tuned_or(dev, key, lambda t: tile_valid(t) and tile_fits(dev, t, w.cols), None)
    return out + _q8_gemms(dev, w, xbufs, y, st, tile=tile, tune=tune, **gemms)


def _q8_gemms(dev, w, xbufs, y, st, *, tile, max_tokens, y_stride, row0, accumulate, bias, from_state_row,
              decode_batch, tune=None) -> list[Dispatch]:
    """matmul_q8's GEMM dispatches over x's rounding `xbufs`: one a row chunk in `tile` (else q8_tile's
    for the chunk), and for a decode batch the split sums."""
    out = []
    for c in w.chunks:
        slices = k_slices(c.rows, w.cols) if decode_batch else 1
        d = q8_defines(*k_step_fit(full_tile(tile or q8_tile(dev, c.rows, w.cols, max_tokens)), w.cols // slices))
        kw = dict(BIAS=bias is not None, ACCUMULATE=accumulate) if slices == 1 else dict(PARTIALS=True)
        pipe = pipeline(dev, "matmul_q8", **_type_defines(w), **kw, SPLIT=slices, **d)
        params = dev.uniform(w.cols, c.rows, row0 + c.row0, c.dbase, y_stride, int(from_state_row), max_tokens, 0)
        part = y if slices == 1 else dev.scratch(f"q8.partials.{max_tokens}", 4 * max_tokens * PARTIALS)
        res = [params, st, c.buffer, *_xbufs(w, xbufs), part] + ([bias] if bias is not None and slices == 1 else [])
        gx, bn = cdiv(c.rows, d["BM"]), d["BN"]
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n, gx=gx, bn=bn, z=slices: (gx, cdiv(n, bn), z),
                            label=f"matmul_q8.{w.qtype.name}", bytes=c.buffer.size, tune=tune))
        if slices > 1:
            out.append(_split_sum(dev, c, part, y, st, slices=slices, row0=row0, y_stride=y_stride,
                                  part_tokens=max_tokens, from_state_row=from_state_row, bias=bias,
                                  accumulate=accumulate, tune=tune))
    return out


def expert_groups(dev, ids, st, *, experts: int, slots: int, max_tokens: int) -> tuple[Dispatch, tuple]:
    """A prompt batch's (token, slot) pairs grouped by their expert (`ids`, `slots` a token) into tiles
    of up to 64 TV pairs of one expert (moe_tiles.wgsl), for every expert GEMM of the layer: the dispatch
    and (tiles, pairs, TV). TV 1 where an expert sees 64 pairs or fewer on average: most fill little of a tile."""
    pairs = max_tokens * slots
    tv = 1 if cdiv(pairs, experts) <= 64 else 2
    bn = 64 * tv
    tiles = dev.scratch(f"moe.tiles.{pairs}.{experts}.{bn}", 16 * (cdiv(pairs, bn) + experts))
    order = dev.scratch(f"moe.pairs.{pairs}", 4 * pairs)
    pipe = pipeline(dev, "moe_tiles", E=experts, K=slots, BN=bn)
    return Dispatch(pipe, dev.bind_group(pipe, [st, ids, order, tiles]), (1, 1, 1), label="moe_tiles"), (tiles, order, tv)


def expert_matmul_q8(dev, w, experts: int, x, y, st, groups: tuple, *, slots: int, per_pair_x: bool,
                     max_tokens: int, y_stride: int, bias=None, tm=None) -> list[Dispatch]:
    """The int8 GEMM over a mixture of experts' stacked matrices (`experts` blocks of rows) for a prompt
    batch: each expert's rows times the rows of the pairs that picked it, in the tiles of `groups`
    (expert_groups). x rows: a token's (shared by its slots), or with `per_pair_x` a pair's own; y
    rows: a pair's (token * slots + slot). Reads each picked expert once per tile of pairs. `tm`: the
    rows a thread (default q8_tile's, for the tiles' TV)."""
    tiles, order, tv = groups
    rows_e = w.rows // experts
    # K steps of 32: 64 lost on the experts' GEMMs (docs/performance.md)
    tm = tm or q8_tile(dev, rows_e, w.cols, cdiv(max_tokens * slots, experts), tiles=((8, tv, 1), (4, tv, 1)))[0]
    xrows = max_tokens * (slots if per_pair_x else 1)
    out, xbufs = quantize_q8(dev, x, st, k=w.cols, tokens=xrows, from_state_row=False, run=w.qtype.iq8_run,
                             rows_per_token=slots if per_pair_x else 1)
    c = w.chunks[0]
    d = q8_defines(tm, tv)
    pipe = pipeline(dev, "matmul_q8", **_type_defines(w), BIAS=bias is not None, ACCUMULATE=False, EXPERTS=True,
                    XDIV=1 if per_pair_x else slots, SPLIT=1, **d)
    params = dev.uniform(w.cols, rows_e, 0, c.dbase, y_stride, 0, 0, 0)
    res = [params, None, c.buffer, *_xbufs(w, xbufs), y, bias, tiles, order]   # tokens from the tiles, not st
    gx, bn = cdiv(rows_e, d["BM"]), d["BN"]
    grid = lambda n: (gx, cdiv(n * slots, bn) + min(experts, n * slots))      # noqa: E731  (tiles: moe_tiles.wgsl)
    return out + [Dispatch(pipe, dev.bind_group(pipe, res), grid, label=f"matmul_q8.{w.qtype.name}.experts",
                           bytes=c.buffer.size)]
