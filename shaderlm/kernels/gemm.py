"""The prefill GEMMs (tokens a pass > 1): y[t, row0 + r] (+)= W[r] . x[t] for a tile of rows x tokens
a workgroup, each weight tile decoded once into workgroup memory.

  f32 (matmul_tiled.wgsl): W dequantized to f32, 64x64 tiles; exact f32 arithmetic.
  int8 (matmul_q8.wgsl): x rounded to int8 per 32 (or 16) elements first (quantize_q8.wgsl), weights
      as their integer quants, dot4I8Packed in i32 and scales applied per block in f32: several times
      the arithmetic rate, at the cost of x's rounding (as llama.cpp's MMQ kernels).
"""
from __future__ import annotations

from ..gpu.plan import Dispatch
from . import pipeline
from .grid import cdiv

# (rows a thread TM, token vec4s a thread TV, 32-element blocks a K step KB): tiles of 16 TM rows x
# 64 TV tokens, in order of preference
Q8_TILES = ((8, 2, 2), (4, 2, 1), (4, 1, 2), (8, 2, 1), (8, 1, 1), (4, 1, 1))
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


def q8_defines(tm: int, tv: int, kb: int = 1) -> dict:
    bm, bn = 16 * tm, 64 * tv
    return dict(TM=tm, TV=tv, KB=kb, RG=tm // 4, LW=tm * kb // 4, XL=max(1, tv * kb // 2), BM=bm, BN=bn,
                WQ=8 * kb * bm // 4, WS=2 * kb * bm // 4, TQ=8 * kb * bn // 4, TD=2 * kb * bn // 4,
                TS=2 * kb * bn // 4)


def q8_workgroup_bytes(tm: int, tv: int, kb: int = 1) -> int:
    d = q8_defines(tm, tv, kb)
    return 2 * 16 * (d["WQ"] + 2 * d["WS"] + d["TQ"] + d["TD"] + d["TS"])


def q8_tile(dev, rows: int, cols: int, tokens: int, tiles=Q8_TILES) -> tuple[int, int, int]:
    """The first of `tiles` that leaves MIN_WORKGROUPS workgroups or more for `tokens` (else the one
    leaving the most), within the adapter's workgroup memory and dividing `cols` in K steps."""
    room = dev.limit("max-compute-workgroup-storage-size", 16384)
    fits = [t for t in tiles if q8_workgroup_bytes(*t) <= room and cols % (32 * t[2]) == 0]
    groups = {t: cdiv(rows, 16 * t[0]) * cdiv(tokens, 64 * t[1]) for t in fits}
    for t, n in groups.items():
        if n >= MIN_WORKGROUPS:
            return t
    return max(fits, key=groups.get)


def quantize_q8(dev, x, st, *, k: int, tokens: int, from_state_row: bool, run: int,
                rows_per_token: int = 1) -> tuple[list[Dispatch], tuple]:
    """x's rows (k floats each, at most `tokens` of them; rows_per_token a token) as int8 blocks with a
    scale per `run` (16 or 32) elements: the dispatch and its three buffers. The buffers are scratch
    shared by every GEMM of this shape: plans run their dispatches in order."""
    nb = k // 32
    xq = dev.scratch(f"q8.words.{tokens}x{k}", tokens * k)
    xd = dev.scratch(f"q8.scales.{tokens}x{k}", tokens * nb * 8)
    xs = dev.scratch(f"q8.sums.{tokens}x{k}", tokens * nb * 8)
    pipe = pipeline(dev, "quantize_q8", RUN32=run == 32)
    bg = dev.bind_group(pipe, [dev.uniform(k, int(from_state_row), rows_per_token, 0), st, x, xq, xd, xs])
    gx = cdiv(nb, 64)
    return [Dispatch(pipe, bg, lambda n: (gx, n * rows_per_token), label="quantize_q8")], (xq, xd, xs)


def _type_defines(w) -> dict:
    """matmul_q8's defines for the weight's type: its decoder, whether its runs have mins, its run length."""
    return dict(QUANT=w.qtype.kernel, MINS=w.qtype.iq8_min, RUN32=w.qtype.iq8_run == 32)


def _xbufs(w, xbufs: tuple) -> tuple:
    """The GEMM's x bindings: x's sums only for a type with mins (MINS)."""
    xq, xd, xs = xbufs
    return xq, xd, xs if w.qtype.iq8_min else None


def matmul_q8(dev, w, x, y, st, *, max_tokens, y_stride, row0, accumulate, bias, from_state_row,
              tile=None) -> list[Dispatch]:
    """x has at most max_tokens rows; `tile`: (TM, TV[, KB]) for every row chunk, else q8_tile's
    choice (KB 1 where K is not a multiple of 32 KB)."""
    out, xbufs = quantize_q8(dev, x, st, k=w.cols, tokens=max_tokens, from_state_row=from_state_row,
                             run=w.qtype.iq8_run)
    for c in w.chunks:
        tm, tv, kb = (*(tile or q8_tile(dev, c.rows, w.cols, max_tokens)), 1)[:3]
        kb = kb if w.cols % (32 * kb) == 0 else 1
        pipe = pipeline(dev, "matmul_q8", **_type_defines(w), BIAS=bias is not None, ACCUMULATE=accumulate,
                        **q8_defines(tm, tv, kb))
        params = dev.uniform(w.cols, c.rows, row0 + c.row0, c.dbase, y_stride, int(from_state_row), 0, 0)
        res = [params, st, c.buffer, *_xbufs(w, xbufs), y] + ([bias] if bias is not None else [])
        gx, bn = cdiv(c.rows, 16 * tm), 64 * tv
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n, gx=gx, bn=bn: (gx, cdiv(n, bn)),
                            label=f"matmul_q8.{w.qtype.name}", bytes=c.buffer.size))
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
    bn = 64 * tv
    # K steps of 32: 64 lost on the experts' GEMMs (docs/performance.md)
    tm = tm or q8_tile(dev, rows_e, w.cols, cdiv(max_tokens * slots, experts), tiles=((8, tv, 1), (4, tv, 1)))[0]
    xrows = max_tokens * (slots if per_pair_x else 1)
    out, xbufs = quantize_q8(dev, x, st, k=w.cols, tokens=xrows, from_state_row=False, run=w.qtype.iq8_run,
                             rows_per_token=slots if per_pair_x else 1)
    c = w.chunks[0]
    pipe = pipeline(dev, "matmul_q8", **_type_defines(w), BIAS=bias is not None, ACCUMULATE=False, EXPERTS=True,
                    XDIV=1 if per_pair_x else slots, **q8_defines(tm, tv))
    params = dev.uniform(w.cols, rows_e, 0, c.dbase, y_stride, 0, 0, 0)
    res = [params, None, c.buffer, *_xbufs(w, xbufs), y, bias, tiles, order]   # tokens from the tiles, not st
    gx = cdiv(rows_e, 16 * tm)
    grid = lambda n: (gx, cdiv(n * slots, bn) + min(experts, n * slots))      # noqa: E731  (tiles: moe_tiles.wgsl)
    return out + [Dispatch(pipe, dev.bind_group(pipe, res), grid, label=f"matmul_q8.{w.qtype.name}.experts",
                           bytes=c.buffer.size)]
