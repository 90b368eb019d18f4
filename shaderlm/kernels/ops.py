"""Thin Python over the WGSL kernels: each function builds the Dispatch objects for one op.

Nothing here runs per token: dispatches (pipeline + bind group + grid) are built once at load and
replayed by a Plan. Grids that depend on the token count are functions of n. Every op takes the
shared `st` state buffer (State in state.wgsl: pos, n, tok, out_row0).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..gpu.plan import Dispatch
from . import gemm, pipeline
from .gemv import act_defines, gemv, wide_ok
from .grid import ROW_WG, cdiv



@dataclass
class Paging:
    """A paged KV cache (kernels/paged.wgsl): the page table, and for a batched step (`rows` given,
    kernels/batch_rows.wgsl) each row's sequence slot and each slot's position and stretch of the
    token buffer. `ragged`: a prompt pass over up to that many sequences, whose table and rows' slots and
    positions `rows` holds (batch_rows.wgsl's RAGGED: seq_pos is not read, so not given)."""
    pages: object               # u32 per (slot, page index): pool page ids
    page: int                   # positions a page holds
    max_pages: int              # table entries per slot
    rows: object = None         # u32 per batch row: its slot, or 0xFFFFFFFF (a padding row)
    seq_pos: object = None      # u32 per slot: the position of the token it feeds next
    hist: int = 0               # tokens per slot in the token buffer
    ragged: int = 0             # a prompt pass's most sequences (0: not a prompt pass)

    def row_defines(self) -> dict:
        return dict(BATCH=self.rows is not None, HIST=self.hist, RAGGED=self.ragged > 0, RSEQS=self.ragged)

    def defines(self) -> dict:
        return dict(PAGED=True, PAGE=self.page, MAXP=self.max_pages, **self.row_defines())

    def bindings(self, res: list) -> list:
        """`res` padded to bindings 0..12 with, batched, rows (10) and seq_pos (11), and pages (12)."""
        batched = self.rows is not None
        return res + [None] * (10 - len(res)) + [self.rows, self.seq_pos if batched else None, self.pages]


def int8_gemm(w, *, tt: int, tiled: bool, int8: bool) -> bool:
    """Whether matmul runs w as an int8 GEMM (gemm.matmul_q8): its x pass can fold in an RMSNorm before
    it or the gated activation of [gate | up] rows (matmul's norm, glu_input)."""
    return tt > 1 and tiled and w.cols % 32 == 0 and int8 and w.qtype.blocked


def matmul(dev, w, x, y, st, *, tt: int, y_stride: int, row0: int = 0, accumulate=False, bias=None,
           from_state_row=False, norm=None, eps: float = 0.0, glu=False, gelu=False, act=None, glu_input=False,
           tiled: bool = True, int8: bool = False, q8_tile=None, max_tokens: int = 0, batch: int = 0,
           nt_max: int = 1, decode_batch: bool = False, x_after=None, x_run: int | None = None,
           x_ready: bool = False) -> list[Dispatch]:
    """y[t, row0 + r] (+)= W[r] . x[t] for every row-chunk of W; x rows are w.cols floats.

    tt == 1: the decode GEMV (gemv.py where the type has a wide decoder, else matmul.wgsl), which can
    also fold in the RMSNorm of x (`norm`: the norm weight buffer) and, for a [gate; up] weight, the
    gated activation (`glu`; GELU with `gelu`, else `act`: gemv.act_defines).
    tt > 1: batched tokens, a tiled GEMM (gemm.py) when K allows and `tiled`: on int8 activations with
    `int8` where the type is quantized in blocks (x's rows, at most max_tokens (default tt) of them,
    quantized into scratch buffers, where `norm` and `glu_input` (x holds [gate | up] rows: the input is
    their gated activation, GELU with `gelu`, else `act`) are folded in;
    `decode_batch`: x is a serving step's rows, gemm.matmul_q8), else f32;
    without `tiled`, matmul.wgsl taking tt tokens per pass over the weights (better for a few tokens).
    batch: a fixed number of rows, each a token of its own sequence (a serving step's; the decode GEMV's
    batch), whatever the plan's token count. `x_after`: the weight of the matmul just before this one,
    over the same x (its rows, norm and input) with the same options: an int8 GEMM then reuses x's
    rounding where it is the same (gemm.matmul_q8). `x_run`: the run length a decode batch's int8 GEMMs
    over that x round it in (gemm.shared_run), so that types of runs of 16 and 32 share one rounding.
    `x_ready`: a decode batch's int8 GEMM whose x the kernel before rounded (gemm.decode_batch_x)."""
    if tt > 1 and tiled and w.cols % 32 == 0:
        kw = dict(y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias, from_state_row=from_state_row)
        if int8_gemm(w, tt=tt, tiled=tiled, int8=int8):
            if glu:
                raise ValueError("the tiled GEMM does not fuse the activation after a [gate; up] weight")
            fused = dict(norm=norm, eps=eps, glu_input=act_defines(gelu, act) if glu_input else None)
            x_after = x_after if x_after is not None and int8_gemm(x_after, tt=tt, tiled=tiled, int8=int8) else None
            return gemm.matmul_q8(dev, w, x, y, st, max_tokens=max(max_tokens, tt), tile=q8_tile,
                                  decode_batch=decode_batch, x_after=x_after, x_run=x_run, x_ready=x_ready,
                                  **kw, **fused)
        if norm is not None or glu or glu_input:
            raise ValueError("the f32 GEMM does not fuse norm/glu; run them as separate ops")
        return gemm.matmul_f32(dev, w, x, y, st, **kw)
    if glu_input:
        raise ValueError("only the int8 GEMM takes x as [gate | up] rows (glu_input)")
    if glu and len(w.chunks) != 1:
        raise ValueError(f"{w.name}: GLU fusion needs gate and up in one binding")
    if tt == 1 and not from_state_row and wide_ok(w):
        return gemv(dev, w, x, y, y_stride=y_stride, row0=row0, accumulate=accumulate, bias=bias,
                    norm=norm, eps=eps, glu=glu, gelu=gelu, act=act, batch=batch, nt_max=nt_max)
    wg = 256 if dev.has_subgroups else 64
    rows_per_wg = max(1, wg // dev.subgroup_size) if dev.has_subgroups else 1
    pipe = pipeline(dev, "matmul", QUANT=w.qtype.kernel, TT=tt, WG=wg, BIAS=bias is not None,
                    ACCUMULATE=accumulate, NORM=norm is not None, GLU=glu, **act_defines(gelu, act))
    lim = dev.limit("max-compute-workgroups-per-dimension", 65535)
    out = []
    for c in w.chunks:
        rows = c.rows // 2 if glu else c.rows
        params = dev.uniform(w.cols, rows, row0 + c.row0, c.dbase, y_stride, w.cols,
                             int(from_state_row), float(eps))
        res = [params, st, c.buffer, x, y, bias, norm]
        gx = min(cdiv(rows, rows_per_wg), lim)
        grid = (gx, cdiv(batch, tt)) if batch else (lambda n, gx=gx: (gx, cdiv(n, tt)))
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), grid, label=f"matmul.{w.qtype.name}",
                            bytes=c.buffer.size))
    return out


def moe_route(dev, logits, ids, weights, *, experts: int, k: int, renorm: bool, batch: int = 0) -> Dispatch:
    """Each token's k experts with the largest router `logits` (rows of `experts` floats) into `ids`
    and their weights into `weights` (k per token): the softmax over the k (`renorm`) or over all."""
    # subgroup rounds where a 64-wide workgroup is whole subgroups and a lane's experts fit its 32-bit mask
    sg_pick = dev.has_subgroups and 64 % dev.subgroup_size == 0 and experts <= 32 * dev.subgroup_size
    wg = 64 if sg_pick else min(256, max(64, 1 << (experts - 1).bit_length()),
                                dev.limit("max-compute-invocations-per-workgroup", 256))
    if k > experts:
        raise ValueError(f"{k} experts a token out of {experts}")
    pipe = pipeline(dev, "moe_route", E=experts, K=k, RNORM=renorm, WG=wg, SG_PICK=sg_pick)
    bg = dev.bind_group(pipe, [logits, ids, weights])
    return Dispatch(pipe, bg, (batch, 1, 1) if batch else (lambda n: (n, 1, 1)), label="moe_route")


def moe_combine(dev, y, weights, x, st, *, dim: int, slots: int, ids=None, bias=None) -> Dispatch:
    """x[t] += sum_j weights[t, j] * y[t * slots + j] (+ the picked experts' down bias, by `ids`)."""
    pipe = pipeline(dev, "moe_combine", K=slots, EXPERT_BIAS=bias is not None)
    res = [dev.uniform(dim, 0, 0, 0), st, y, weights, x] + ([ids, bias] if bias is not None else [])
    return Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (cdiv(dim, 256), n), label="moe_combine")


def rmsnorm(dev, x, w, y, st, *, dim: int, eps: float, from_state_row=False, gather=None) -> Dispatch:
    """y's rows: x's rows (from st.out_row0 where `from_state_row`) normed. `gather`: (a buffer of x row
    indices, rows): y's rows from those rows of x."""
    pipe = pipeline(dev, "rmsnorm", WG=ROW_WG, GATHER=gather is not None)
    params = dev.uniform(dim, int(from_state_row), float(eps), 0)
    if gather is not None:
        src, rows = gather
        return Dispatch(pipe, dev.bind_group(pipe, [params, None, x, w, y, src]), (rows, 1, 1), label="rmsnorm")
    return Dispatch(pipe, dev.bind_group(pipe, [params, st, x, w, y]), lambda n: (n, 1), label="rmsnorm")


def _sinks(sinks, defines: dict, res: list) -> tuple[dict, list]:
    """A kernel's defines and bindings with attention sinks (SINKS: a logit per head at binding 9), or
    as they are without."""
    return ({**defines, "SINKS": True}, res + [None] * (9 - len(res)) + [sinks]) if sinks is not None \
        else (defines, res)


def _paged(paging, defines: dict, res: list) -> tuple[dict, list]:
    """A kernel's defines and bindings with a paged cache's (or as they are, without one)."""
    return ({**defines, **paging.defines()}, paging.bindings(res)) if paging else (defines, res)


def embed(dev, w, tokens, x, st, *, scale: float = 1.0, paging: Paging | None = None) -> list[Dispatch]:
    """x rows from the token ids in `tokens` (from st.tok; with a batched paging, each row's sequence's
    next token)."""
    batched = paging is not None and paging.rows is not None
    out = []
    for c in w.chunks:
        res = [dev.uniform(w.cols, c.row0, c.rows, c.dbase, float(scale), 0, 0, 0), st, tokens, c.buffer, x]
        if batched:
            pipe = pipeline(dev, "embed", QUANT=w.qtype.kernel, **paging.row_defines())
            res += [None] * 5 + [paging.rows, paging.seq_pos]
        else:
            pipe = pipeline(dev, "embed", QUANT=w.qtype.kernel)
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (n, 1), label="embed"))
    return out


def rope_store(dev, qkv, inv_freq, k_cache, v_cache, st, *, n_heads, n_kv, head_dim, rope_dim,
               neox: bool, paging: Paging | None = None) -> Dispatch:
    defines, res = _paged(paging, dict(NEOX=neox), [dev.uniform(n_heads, n_kv, head_dim, rope_dim), st, qkv,
                                                     inv_freq, k_cache, v_cache])
    pipe = pipeline(dev, "rope_store", **defines)
    return Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (n_heads + n_kv, n), label="rope_store")


def attention(dev, qkv, k_cache, v_cache, out, st, *, n_heads, n_kv, head_dim, scale,
              window: int = 0, softcap: float = 0.0, inv_freq=None, rope_dim: int = 0,
              neox: bool = False, shape=None, paging: Paging | None = None, batch: int = 0,
              tiled: bool = True, prefill_tile=None, sinks=None, head_norm=None, q8_out=None,
              v_apart=None) -> Dispatch:
    """Causal GQA attention over the cache. With `inv_freq` (decode, one token a sequence) it also
    applies RoPE to q and the new K and stores the new K/V, replacing rope_store. `shape`: the decode
    kernel's (workgroup size, keys per step, splits, keys per split at least), or a prefix of it;
    attention_shape's where left out. Not autotuned: the best depends on the context length.
    `paging`: a paged cache; with its rows, `batch` rows of a serving step, each its own sequence.
    Unfused and unbatched, with `tiled` (prompt chunks): attention_prefill.wgsl with `prefill_tile`
    (queries, keys) or prefill_attention_tile's where one fits; else (a decode step's single query, on
    adapters that do not fuse it) attention.wgsl, a workgroup a query.
    `sinks`: a buffer of one logit per head that joins each softmax's denominator and weighs no value
    (gpt-oss's attention sinks). `head_norm`: (q weights, k weights, eps), Qwen3's per-head RMSNorm of
    q and the new K, folded into the subgroup decode kernel (fused_head_norm says where). `q8_out`: (the
    buffers, run length) of gemm.decode_batch_x: a batch's output also rounded for the int8 GEMM after
    (rounds_attention_output says where). `v_apart`: a buffer of a batch's new V rows ([row][n_kv x
    head_dim]) that their own GEMM wrote, instead of qkv's (takes_v_apart says where)."""
    wg = 64
    fused = inv_freq is not None
    params = dev.uniform(n_heads, n_kv, head_dim, window, float(scale), float(softcap), rope_dim, 0)
    if fused and dev.has_subgroups:
        # one token a sequence: subgroup-parallel kernel (keys split over subgroups, lanes over head
        # dims, and over `splits` workgroups a head where the context is long)
        sgs = dev.subgroup_size
        wg, unroll, splits, min_keys = decode_attention_shape(dev, n_heads, shape)
        need = decode_attention_bytes(dev, head_dim, wg, splits, q8_out is not None)
        room = dev.limit("max-compute-workgroup-storage-size", 16384)
        if need > room:
            raise ValueError(f"decode attention shape {shape}: its merge buffers need {need} bytes of workgroup "
                             f"memory, over this adapter's {room}")
        heads = n_heads * max(batch, 1)
        batched = paging is not None and paging.rows is not None
        res = [params, None if batched else st, qkv, k_cache, v_cache, out, inv_freq]     # batched: no State
        if splits > 1:
            res += [dev.scratch(f"attention partials {heads}x{splits}x{head_dim}", 4 * heads * splits * (2 + head_dim)),
                    dev.scratch(f"attention split counts {heads}", 4 * heads)]
        defines, res = _paged(paging, *_sinks(sinks, dict(WG=wg, HD=head_dim, PAIRS=cdiv(head_dim // 2, sgs),
                                                           NEOX=neox, UNROLL=unroll, SPLIT=splits > 1, SPLITS=splits,
                                                           MINK=min_keys, MERGE=_decode_merge(dev, wg, splits)), res))
        more = {}                                   # binding -> buffer
        if head_norm is not None:
            q_w, k_w, eps = head_norm
            defines, more = {**defines, "HEAD_NORM": True, "HN_EPS": float(eps)}, {13: q_w, 14: k_w}
        if q8_out is not None:
            if not batched or head_dim % 32:
                raise ValueError("the decode attention rounds its output for a batch's int8 GEMM only, in whole blocks")
            (xq, xd, xs), run = q8_out
            defines, more = {**defines, "Q8OUT": True, "RUN32": run == 32}, {**more, 15: xq, 16: xd, 17: xs}
        if v_apart is not None:
            if not batched:
                raise ValueError("the decode attention takes the new V rows apart only in a batch")
            defines, more = {**defines, "VAPART": True}, {**more, 18: v_apart}
        res = [more.get(i, r) for i, r in enumerate(res + [None] * (max(more, default=0) + 1 - len(res)))]
        pipe = pipeline(dev, "attention_decode", **defines)
        return Dispatch(pipe, dev.bind_group(pipe, res), (n_heads, splits, max(batch, 1)), label="attention_decode")
    if head_norm is not None or q8_out is not None or v_apart is not None:
        raise ValueError("the per-head norm, the output's rounding and V apart are the subgroup decode kernel's only")
    ragged = paging.ragged if paging else 0
    tile = None if fused or not tiled or (paging and paging.rows is not None and not ragged) else (
        prefill_tile or prefill_attention_tile(dev, head_dim))
    if tile:
        bq = tile[0]
        defines, res = _paged(paging, *_sinks(sinks, _prefill_tile_defines(head_dim, *tile),
                                              [params, None if ragged else st, qkv, k_cache, v_cache, out]))
        pipe = pipeline(dev, "attention_prefill", **defines)
        # ragged: a grid z a sequence, each with as many query tiles as the pass could give it
        grid = (lambda n: (n_heads, cdiv(n, bq), ragged)) if ragged else (lambda n: (n_heads, cdiv(n, bq)))
        return Dispatch(pipe, dev.bind_group(pipe, res), grid, label="attention_prefill")
    defines, res = _paged(paging, *_sinks(sinks, dict(WG=wg, HD=head_dim, PAIRS=cdiv(head_dim // 2, wg), ROPE=fused,
                                                       NEOX=neox), [params, st, qkv, k_cache, v_cache, out, inv_freq]))
    pipe = pipeline(dev, "attention", **defines)
    return Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (n_heads, n), label="attention")


def _decode_merge(dev, wg: int, splits: int) -> int:
    """attention_decode.wgsl's MERGE: the partial softmaxes it merges (its subgroups', or its splits')."""
    return max(wg // dev.subgroup_size, splits)


def decode_attention_bytes(dev, head_dim: int, wg: int, splits: int, q8_out: bool = False) -> int:
    """attention_decode.wgsl's workgroup memory: a softmax state (3 floats) and a head's output for each
    of the MERGE partials, and a flag; with q8_out, the head's output once more (Q8OUT)."""
    return 4 * _decode_merge(dev, wg, splits) * (3 + head_dim) + 4 + 4 * head_dim * q8_out


def fused_head_norm(dev, fused_decode: bool) -> bool:
    """attention() can fold a per-head norm in: the fused decode step on an adapter with subgroups."""
    return fused_decode and dev.has_subgroups


def rounds_attention_output(dev, fused_decode: bool, n_heads: int, head_dim: int, shape=None) -> bool:
    """attention() can round a batch's output for the int8 GEMM after it (q8_out): the fused decode step
    on an adapter with subgroups, heads of whole blocks of 32, room for the head's output once more, and
    for its 16 storage bindings at most."""
    if not (fused_decode and dev.has_subgroups and head_dim % 32 == 0 and dev.max_buffers >= 16):
        return False
    wg, _, splits, _ = decode_attention_shape(dev, n_heads, shape)
    return decode_attention_bytes(dev, head_dim, wg, splits, True) <= dev.limit("max-compute-workgroup-storage-size",
                                                                                  16384)


def takes_v_apart(dev, fused_decode: bool) -> bool:
    """attention() can take a batch's new V rows from a buffer of their own (v_apart): the fused decode
    step on an adapter with subgroups, with room for its 17 storage bindings at most."""
    return fused_decode and dev.has_subgroups and dev.max_buffers >= 17


PREFILL_ATTENTION_TILES = ((64, 32), (64, 16), (32, 32), (32, 16), (16, 32))     # (queries, keys), by preference


def prefill_attention_tile(dev, head_dim: int) -> tuple[int, int] | None:
    """The first (queries, keys) tile of attention_prefill.wgsl that fits the adapter's workgroup memory
    and the kernel's thread layout, or None (then attention.wgsl's workgroup a query serves)."""
    for tile in PREFILL_ATTENTION_TILES:
        if prefill_attention_tile_ok(dev, head_dim, *tile):
            return tile
    return None


# attention_prefill.wgsl's threads, and the blocks a thread computes: query rows it scores (x SK keys)
# and rows of the output it sums (x OV vec4s of the head)
PREFILL_THREADS, PREFILL_SCORE_ROWS, PREFILL_SUM_ROWS = 256, 2, 4


def _prefill_tile_defines(head_dim: int, bq: int, bk: int) -> dict:
    """attention_prefill.wgsl's defines for a (queries, keys) tile: its threads' blocks (SK keys of SR
    rows scored, OV vec4s of PR rows summed, LD vec4s of K and V loaded)."""
    h4, wg, sr, pr = head_dim // 4, PREFILL_THREADS, PREFILL_SCORE_ROWS, PREFILL_SUM_ROWS
    return dict(HD=head_dim, BQ=bq, BK=bk, WG=wg, SR=sr, PR=pr, SK=bq * bk // (sr * wg), OV=h4 * bq // (pr * wg),
                LD=bk * h4 // wg)


def prefill_attention_tile_ok(dev, head_dim: int, bq: int, bk: int) -> bool:
    """The tile's workgroup memory fits and its thread layout covers it: whole blocks of SR rows x SK keys
    and PR rows x OV vec4s for its threads, whole vec4 loads of the key tile."""
    h4, wg, sr, pr = head_dim // 4, PREFILL_THREADS, PREFILL_SCORE_ROWS, PREFILL_SUM_ROWS
    if head_dim % 4 or (bq * bk) % (sr * wg) or (h4 * bq) % (pr * wg) or (bk * h4) % wg or (sr * wg) % bq:
        return False
    # its workgroup arrays: q as f16 quads and a key tile of vec4s (rows a vec4 apart), the weights
    # (rows 4 floats apart), the partial maxima (SR WG) and a float a query
    size = 8 * bq * (h4 + 1) + 16 * bk * (h4 + 1) + 4 * (bk * (bq + 4) + sr * wg + bq)
    return size <= dev.limit("max-compute-workgroup-storage-size", 16384)


def decode_attention_shape(dev, n_heads: int, shape=None) -> tuple[int, int, int, int]:
    """The decode kernel's shape: `shape` (a prefix of one), the rest attention_shape's."""
    return tuple(shape or ()) + attention_shape(dev, n_heads)[len(shape or ()):]


def attention_shape(dev, n_heads: int) -> tuple[int, int, int, int]:
    """The decode attention kernel's (workgroup size, keys per subgroup step, splits, keys per split at
    least): 256 lanes (8 subgroups of 32; 16 of 8 on lavapipe) x 4 keys; a head's keys split over up
    to 256 / n_heads workgroups (at most 16) once it has 256 keys a split, so that a long context keeps
    about 256 workgroups busy (docs/performance.md has what was measured)."""
    sgs = dev.subgroup_size
    wg = 256 if sgs >= 16 else 16 * sgs
    return wg, 4, max(1, min(16, 256 // n_heads)), 256


def glu(dev, gate_up, out, st, *, ffn: int, gelu=False, act=None, rows_per_token: int = 1) -> Dispatch:
    """out rows = the gated activation of gate_up's [gate; up] rows (GELU with `gelu`, else `act`:
    gemv.act_defines)."""
    pipe = pipeline(dev, "glu", **act_defines(gelu, act))
    bg = dev.bind_group(pipe, [dev.uniform(ffn, rows_per_token, 0, 0), st, gate_up, out])
    return Dispatch(pipe, bg, lambda n: (cdiv(ffn, 256), n * rows_per_token), label="glu")


TOPN = 20           # the most likely tokens a logprobs request may ask for (OpenAI's top_logprobs limit)


def sample(dev, logits, tokens, st, params, *, paging: Paging | None = None, batch: int = 0,
           logprobs=None, vocab: int = 0) -> list[Dispatch]:
    """`params`: a uniform buffer from sample_params(); rewritten by the host when settings change.
    The sampler reads row 0 of `logits` as vec4s (Device buffers are whole vec4s; lanes past the
    vocabulary are masked). With a batched paging: `batch` rows of logits (each a whole number of
    vec4s), each sampled for its row's sequence with that slot's entry of `params` (a storage array);
    with `logprobs` (a buffer of 1 + 2 * TOPN floats a slot position), also each row's log-probabilities:
    the token drawn's and its slot's top_logprobs most likely tokens' (kernels/sample.wgsl), the rows'
    log-sum-exps from partials over the `vocab` logits made by a dispatch before (kernels/logsumexp.wgsl)."""
    # 512 threads x 16 vec4 loads in flight each: the measured best (docs/performance.md)
    lim = dev.limit("max-compute-invocations-per-workgroup", 256)
    if paging is None:
        if logprobs is not None:
            raise ValueError("log-probabilities come with a batched sampler (a paging with rows)")
        pipe = pipeline(dev, "sample", WG=min(512, lim), U=16)
        return [Dispatch(pipe, dev.bind_group(pipe, [params, st, logits, tokens]), (1, 1, 1), label="sample")]
    out, lse, parts = [], None, 0
    if logprobs is not None:
        if vocab < 1:
            raise ValueError("log-probabilities need the vocabulary's size")
        wg, u = 256, 4                     # a part: 4,096 logits, a thread's 4 vec4 loads in flight
        parts = cdiv(cdiv(vocab, 4), wg * u)
        lse = dev.scratch(f"sample.lse.{batch}x{parts}", 8 * batch * parts)
        pp = pipeline(dev, "logsumexp", WG=wg, U=u, VOCAB=vocab, PARTS=parts)
        out.append(Dispatch(pp, dev.bind_group(pp, [logits, paging.rows, lse]), (parts, batch, 1), label="logsumexp"))
    pipe = pipeline(dev, "sample", WG=min(512, lim), U=16, BATCH=True, HIST=paging.hist, LOGPROBS=logprobs is not None,
                    TOPN=TOPN, PARTS=parts)
    bg = dev.bind_group(pipe, [params, None, logits, tokens, logprobs, lse] + [None] * 4 + [paging.rows, paging.seq_pos])
    return out + [Dispatch(pipe, bg, (batch, 1, 1), label="sample")]


def sample_params(vocab: int, temperature=0.0, top_k=0, top_p=1.0, seed=0, top_logprobs=0) -> tuple:
    """A sequence's settings (kernels/sampling.wgsl): the sampler's, and how many of the most likely
    tokens its logprobs rows give."""
    if not 0 <= top_logprobs <= TOPN:
        raise ValueError(f"top_logprobs {top_logprobs} outside 0..{TOPN}")
    return (vocab, int(top_k), float(temperature), float(top_p), int(seed) & 0xFFFFFFFF, int(top_logprobs), 0, 0)


# ---- per-head norms, post-norms, softcaps --------------------------------------------------------
def head_norm(dev, qkv, q_w, k_w, st, *, n_heads: int, n_kv: int, head_dim: int, eps: float) -> Dispatch:
    """Per-head RMSNorm of every Q and K head of every token, in place in the qkv rows (before RoPE)."""
    wg = 64
    pipe = pipeline(dev, "head_norm", WG=wg)
    bg = dev.bind_group(pipe, [dev.uniform(n_heads, n_kv, head_dim, float(eps)), st, qkv, q_w, k_w])
    return Dispatch(pipe, bg, lambda n: (n_heads + n_kv, n), label="head_norm")


def add_rmsnorm(dev, y, w, x, st, *, dim: int, eps: float, next_w=None, xn=None) -> Dispatch:
    """x[t] += rmsnorm(y[t]) * w; with next_w, also xn[t] = rmsnorm(x[t]) * next_w (the next pre-norm)."""
    nxt = next_w is not None
    pipe = pipeline(dev, "add_rmsnorm", WG=ROW_WG, NEXT=nxt)
    res = [dev.uniform(dim, 0, float(eps), 0), st, y, w, x] + ([next_w, xn] if nxt else [])
    return Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (n, 1), label="add_rmsnorm")


def softcap(dev, logits, st, *, vocab: int, cap: float, stride: int = 0, rows: int = 0) -> Dispatch:
    """logits = cap * tanh(logits / cap) over this batch's logit rows (from st.out_row0; `rows`: that
    many, st aside), `stride` floats apart (default: vocab)."""
    pipe = pipeline(dev, "softcap", ROWS=rows > 0)
    bg = dev.bind_group(pipe, [dev.uniform(vocab, stride or vocab, float(cap), rows), None if rows else st, logits])
    grid = (cdiv(vocab, 256), rows, 1) if rows else (lambda n: (cdiv(vocab, 256), n))
    return Dispatch(pipe, bg, grid, label="softcap")
