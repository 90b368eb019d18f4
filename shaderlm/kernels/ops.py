"""Thin Python over the WGSL kernels: each function builds the Dispatch objects for one op.

Nothing here runs per token: dispatches (pipeline + bind group + grid) are built once at load and
replayed by a Plan. Grids that depend on the token count are functions of n. Every op takes the
shared `st` state buffer (State in state.wgsl: pos, n, tok, out_row0).
"""
from __future__ import annotations

from ..gpu.plan import Dispatch
from . import pipeline
from .gemv import gemv, wide_ok
from .grid import cdiv, grid_1d

WG = 256            # threads per workgroup for the simple elementwise/row kernels


def matmul(dev, w, x, y, st, *, tt: int, y_stride: int, row0: int = 0, accumulate=False, bias=None,
           from_state_row=False, norm=None, eps: float = 0.0, glu=False, gelu=False,
           tiled: bool = True) -> list[Dispatch]:
    """y[t, row0 + r] (+)= W[r] . x[t] for every row-chunk of W; x rows are w.cols floats.

    tt == 1: the decode GEMV (gemv.py where the type has a wide decoder, else matmul.wgsl), which can
    also fold in the RMSNorm of x (`norm`: the norm weight buffer) and, for a [gate; up] weight, the
    gated activation (`glu`).
    tt > 1: batched tokens, the 64x64-tiled GEMM (matmul_tiled.wgsl) when K allows and `tiled`,
    else matmul.wgsl taking tt tokens per pass over the weights (better for a few tokens)."""
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
    pipe = pipeline(dev, "matmul", QUANT=w.qtype.kernel, TT=tt, WG=wg, BIAS=bias is not None,
                    ACCUMULATE=accumulate, NORM=norm is not None, GLU=glu, ACT_GELU=gelu)
    lim = dev.limit("max-compute-workgroups-per-dimension", 65535)
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


def _matmul_tiled(dev, w, x, y, st, *, y_stride, row0, accumulate, bias, from_state_row):
    pipe = pipeline(dev, "matmul_tiled", QUANT=w.qtype.kernel, BIAS=bias is not None, ACCUMULATE=accumulate)
    out = []
    for c in w.chunks:
        params = dev.uniform(w.cols, c.rows, row0 + c.row0, c.dbase, y_stride, w.cols, int(from_state_row), 0)
        res = [params, st, c.buffer, x, y] + ([bias] if bias is not None else [])
        gx = cdiv(c.rows, 64)
        out.append(Dispatch(pipe, dev.bind_group(pipe, res), lambda n, gx=gx: (gx, cdiv(n, 64)),
                            label=f"matmul_tiled.{w.qtype.name}", bytes=c.buffer.size))
    return out


def rmsnorm(dev, x, w, y, st, *, dim: int, eps: float, from_state_row=False) -> Dispatch:
    pipe = pipeline(dev, "rmsnorm", WG=WG)
    bg = dev.bind_group(pipe, [dev.uniform(dim, int(from_state_row), float(eps), 0), st, x, w, y])
    return Dispatch(pipe, bg, lambda n: (n, 1), label="rmsnorm")


def embed(dev, w, tokens, x, st, *, scale: float = 1.0) -> list[Dispatch]:
    pipe = pipeline(dev, "embed", QUANT=w.qtype.kernel)
    out = []
    for c in w.chunks:
        params = dev.uniform(w.cols, c.row0, c.rows, c.dbase, float(scale), 0, 0, 0)
        bg = dev.bind_group(pipe, [params, st, tokens, c.buffer, x])
        out.append(Dispatch(pipe, bg, lambda n: (n, 1), label="embed"))
    return out


def rope_store(dev, qkv, inv_freq, k_cache, v_cache, st, *, n_heads, n_kv, head_dim, rope_dim,
               neox: bool) -> Dispatch:
    pipe = pipeline(dev, "rope_store", NEOX=neox)
    bg = dev.bind_group(pipe, [dev.uniform(n_heads, n_kv, head_dim, rope_dim), st, qkv, inv_freq,
                               k_cache, v_cache])
    return Dispatch(pipe, bg, lambda n: (n_heads + n_kv, n), label="rope_store")


def attention(dev, qkv, k_cache, v_cache, out, st, *, n_heads, n_kv, head_dim, scale,
              window: int = 0, softcap: float = 0.0, inv_freq=None, rope_dim: int = 0,
              neox: bool = False, shape=None) -> Dispatch:
    """Causal GQA attention over the cache. With `inv_freq` (decode, one token) it also applies
    RoPE to q and the new K and stores the new K/V, replacing rope_store. `shape`: the decode
    kernel's (workgroup size, keys per step, splits, keys per split at least), or a prefix of it;
    attention_shape's where left out. Not autotuned: the best depends on the context length."""
    wg = 64
    fused = inv_freq is not None
    params = dev.uniform(n_heads, n_kv, head_dim, window, float(scale), float(softcap), rope_dim, 0)
    if fused and dev.has_subgroups:
        # one token: subgroup-parallel kernel (keys split over subgroups, lanes over head dims, and
        # over `splits` workgroups a head where the context is long)
        sgs = dev.subgroup_size
        default = attention_shape(dev, n_heads)
        wg, unroll, splits, min_keys = tuple(shape or ()) + default[len(shape or ()):]
        pipe = pipeline(dev, "attention_decode", WG=wg, HD=head_dim, PAIRS=cdiv(head_dim // 2, sgs),
                        NEOX=neox, UNROLL=unroll, SPLIT=splits > 1, SPLITS=splits, MINK=min_keys,
                        MERGE=max(wg // sgs, splits))
        res = [params, st, qkv, k_cache, v_cache, out, inv_freq]
        if splits > 1:
            res += [dev.scratch(f"attention partials {n_heads}x{splits}x{head_dim}",
                                4 * n_heads * splits * (2 + head_dim)),
                    dev.scratch(f"attention split counts {n_heads}", 4 * n_heads)]
        return Dispatch(pipe, dev.bind_group(pipe, res), (n_heads, splits, 1), label="attention_decode")
    pipe = pipeline(dev, "attention", WG=wg, HD=head_dim, PAIRS=cdiv(head_dim // 2, wg), ROPE=fused, NEOX=neox)
    bg = dev.bind_group(pipe, [params, st, qkv, k_cache, v_cache, out, inv_freq])
    return Dispatch(pipe, bg, lambda n: (n_heads, n), label="attention")


def attention_shape(dev, n_heads: int) -> tuple[int, int, int, int]:
    """The decode attention kernel's (workgroup size, keys per subgroup step, splits, keys per split at
    least): 256 lanes (8 subgroups of 32; 16 of 8 on lavapipe) x 4 keys; a head's keys split over up
    to 256 / n_heads workgroups (at most 16) once it has 256 keys a split, so that a long context keeps
    about 256 workgroups busy (docs/performance.md has what was measured)."""
    sgs = dev.subgroup_size
    wg = 256 if sgs >= 16 else 16 * sgs
    return wg, 4, max(1, min(16, 256 // n_heads)), 256


def glu(dev, gate_up, out, st, *, ffn: int, gelu=False) -> Dispatch:
    pipe = pipeline(dev, "glu", ACT_GELU=gelu)
    bg = dev.bind_group(pipe, [dev.uniform(ffn, 0, 0, 0), st, gate_up, out])
    return Dispatch(pipe, bg, lambda n: (cdiv(ffn, 256), n), label="glu")


def sample(dev, logits, tokens, st, params) -> Dispatch:
    """`params`: a uniform buffer from sample_params(); rewritten by the host when settings change.
    The sampler reads row 0 of `logits` as vec4s (Device buffers are whole vec4s; lanes past the
    vocabulary are masked)."""
    # 512 threads x 16 vec4 loads in flight each: the measured best (docs/performance.md)
    lim = dev.limit("max-compute-invocations-per-workgroup", 256)
    pipe = pipeline(dev, "sample", WG=min(512, lim), U=16)
    bg = dev.bind_group(pipe, [params, st, logits, tokens])
    return Dispatch(pipe, bg, (1, 1, 1), label="sample")


def sample_params(vocab: int, temperature=0.0, top_k=0, top_p=1.0, seed=0) -> tuple:
    return (vocab, int(top_k), float(temperature), float(top_p), int(seed) & 0xFFFFFFFF, 0, 0, 0)


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
    pipe = pipeline(dev, "add_rmsnorm", WG=WG, NEXT=nxt)
    res = [dev.uniform(dim, 0, float(eps), 0), st, y, w, x] + ([next_w, xn] if nxt else [])
    return Dispatch(pipe, dev.bind_group(pipe, res), lambda n: (n, 1), label="add_rmsnorm")


def softcap(dev, logits, st, *, vocab: int, cap: float) -> Dispatch:
    """logits = cap * tanh(logits / cap) over this batch's logit rows (from st.out_row0)."""
    pipe = pipeline(dev, "softcap")
    bg = dev.bind_group(pipe, [dev.uniform(vocab, 0, float(cap), 0), st, logits])
    return Dispatch(pipe, bg, lambda n: (cdiv(vocab, 256), n), label="softcap")
