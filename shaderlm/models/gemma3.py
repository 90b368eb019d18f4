"""Gemma 3 (text): embeddings scaled by sqrt(dim), per-head Q/K RMSNorm, attention scale from the
config (query_pre_attn_scalar), RMSNorms after the attention and FFN blocks (before the residual
add), a GELU-tanh gated FFN, and sliding-window layers (extra["swa_layers"]) using the local RoPE
base (extra["rope_base_local"], no scaling) next to global layers with the file's RoPE base.

Per layer: x += postnorm_a(Wo . attn(rope(headnorm(Wqkv . norm(x)))));
           x += postnorm_f(Wdown . (gelu(Wgate . norm(x)) * Wup . norm(x))).
Norm weights are used as stored: llama.cpp's converter already added Gemma's +1.
"""
from __future__ import annotations

import numpy as np

from ..kernels import ops
from .qwen3 import Qwen3


class Gemma3(Qwen3):
    def _alloc(self):
        super()._alloc()
        c, x = self.cfg, self.cfg.extra
        self.y = self.dev.buffer(self.batch * c.dim * 4, label="block_out")   # Wo / Wdown output, pre post-norm
        self.swa = list(x.get("swa_layers") or [False] * c.n_layers)
        self.window = int(x.get("sliding_window", 0) or 0)
        local_base = x.get("rope_base_local")
        if any(self.swa) and local_base is not None:
            self.inv_freq_local = self.dev.upload(self.rope_inv_freq(base=local_base, scale=1.0).astype(np.float32),
                                                  label="inv_freq_local")
        else:
            self.inv_freq_local = self.inv_freq

    def _load_weights(self):
        super()._load_weights()
        for i, L in enumerate(self.layers):
            p = f"blk.{i}."
            L["post_attn_norm"] = self.vector(p + "post_attention_norm.weight")
            L["post_ffn_norm"] = self.vector(p + "post_ffw_norm.weight")

    def layer_ops(self, i: int, tt: int) -> list:
        """Decode (tt == 1, fused) folds the pre-norms into the matmuls, RoPE + KV store into attention
        and the activation into the gate/up GEMV. The post-norms need the whole block output, so Wo and
        Wdown write to a scratch buffer and add_rmsnorm adds it into x. Outside fused decode,
        add_rmsnorm also writes the next pre-norm into xn (ffn_norm, then the next layer's attn_norm),
        so only layer 0 runs its own attn_norm (layers are always built in order for one tt)."""
        c, dev, L, st, ex = self.cfg, self.dev, self.layers[i], self.state, self.cfg.extra
        decode = tt == 1 and self.fuse
        eps = c.rms_eps
        gu = L["gate_up"]
        glu_fused = decode and len(gu) == 1 and len(gu[0].chunks) == 1
        out = []
        if decode:
            src, norm = self.x, dict(norm=L["attn_norm"], eps=eps)
        else:
            if i == 0:
                out.append(ops.rmsnorm(dev, self.x, L["attn_norm"], self.xn, st, dim=c.dim, eps=eps))
            src, norm = self.xn, {}
        out += self.qkv_projection(i, tt, src, norm, decode)
        out += self.qkv_ops(i, tt)
        local = self.swa[i]
        inv_freq = self.inv_freq_local if local else self.inv_freq
        attn = dict(n_heads=c.n_heads, n_kv=c.n_kv_heads, head_dim=c.head_dim,
                    scale=float(ex.get("attn_scale", c.head_dim ** -0.5)),
                    window=self.window if local else 0, softcap=float(ex.get("attn_logit_softcap", 0.0) or 0.0))
        if decode:
            out.append(ops.attention(dev, self.qkv, self.k_cache[i], self.v_cache[i], self.attn, st, **attn,
                                     inv_freq=inv_freq, rope_dim=c.rope_dim, neox=c.rope_neox))
        else:
            out.append(ops.rope_store(dev, self.qkv, inv_freq, self.k_cache[i], self.v_cache[i], st,
                                      n_heads=c.n_heads, n_kv=c.n_kv_heads, head_dim=c.head_dim,
                                      rope_dim=c.rope_dim, neox=c.rope_neox))
            out.append(ops.attention(dev, self.qkv, self.k_cache[i], self.v_cache[i], self.attn, st, **attn))
        out += ops.matmul(dev, L["wo"], self.attn, self.y, st, tt=tt, y_stride=c.dim, tiled=self.tiled)
        nxt = {} if glu_fused else dict(next_w=L["ffn_norm"], xn=self.xn)
        out.append(ops.add_rmsnorm(dev, self.y, L["post_attn_norm"], self.x, st, dim=c.dim, eps=eps, **nxt))
        if glu_fused:
            out += ops.matmul(dev, gu[0], self.x, self.h, st, tt=1, y_stride=c.ffn_dim, glu=True, gelu=True,
                              norm=L["ffn_norm"], eps=eps)
        else:
            row0 = 0
            for w in gu:
                out += ops.matmul(dev, w, self.xn, self.gu, st, tt=tt, y_stride=2 * c.ffn_dim, row0=row0,
                                  tiled=self.tiled)
                row0 += w.rows
            out.append(ops.glu(dev, self.gu, self.h, st, ffn=c.ffn_dim, gelu=True))
        out += ops.matmul(dev, L["down"], self.h, self.y, st, tt=tt, y_stride=c.dim, tiled=self.tiled)
        nxt = dict(next_w=self.layers[i + 1]["attn_norm"], xn=self.xn) \
            if not decode and i + 1 < c.n_layers else {}
        out.append(ops.add_rmsnorm(dev, self.y, L["post_ffn_norm"], self.x, st, dim=c.dim, eps=eps, **nxt))
        return out

    def head_ops(self, tt: int, decode: bool = False) -> list:
        out = super().head_ops(tt, decode)
        cap = self.cfg.extra.get("final_logit_softcap")
        if cap:
            out.append(ops.softcap(self.dev, self.logits, self.state, vocab=self.cfg.vocab_size, cap=float(cap)))
        return out
