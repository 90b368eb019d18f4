"""Llama family: Llama 2/3, Mistral, SmolLM2 (arch "llama"), Qwen2/2.5 (QKV bias).

Per layer: x += Wo . attn(rope(Wqkv . norm(x))); x += Wdown . (silu(Wgate . norm(x)) * Wup . norm(x)).
"""
from __future__ import annotations

import math

from ..kernels import ops
from .transformer import Transformer


class Llama(Transformer):
    def _load_weights(self):
        c = self.cfg
        self.tok_embd = self.matrix("token_embd.weight")
        self.out_norm = self.vector("output_norm.weight")
        self.lm_head = self.matrix("output.weight", required=False) or self.tok_embd
        self.layers = []
        for i in range(c.n_layers):
            p = f"blk.{i}."
            L = {"attn_norm": self.vector(p + "attn_norm.weight"), "ffn_norm": self.vector(p + "ffn_norm.weight")}
            # Q, K, V (and gate, up) read the same input: one matmul when they share a type
            L["qkv"] = self.qkv_weights(p)
            L["qkv_bias"] = [self.vector(p + n, required=False) for n in ("attn_q.bias", "attn_k.bias", "attn_v.bias")]
            L["wo"] = self.matrix(p + "attn_output.weight")
            L["gate_up"] = self.gate_up_weights(p)
            L["down"] = self.matrix(p + "ffn_down.weight")
            if any(b is not None for b in L["qkv_bias"]):
                L["qkv_bias"] = [self._bias_cat(L["qkv_bias"])]
            else:
                L["qkv_bias"] = None
            self.layers.append(L)

    def qkv_weights(self, p: str) -> list:
        """Hook: layer p's Q, K, V projections (rows stacked in that order). Q, K, V read the same
        input: one matmul for those that share a type."""
        q, k, v = p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"
        if self.fusable(q, k, v):
            return [self.matrix(q, k, v)]
        if self.fusable(q, k):              # Q4_K_M: q, k in Q4_K, v in Q6_K
            return [self.matrix(q, k), self.matrix(v)]
        return [self.matrix(q), self.matrix(k), self.matrix(v)]

    def gate_up_weights(self, p: str) -> list:
        """Hook: layer p's gate and up projections ([gate; up] rows), fused when they share a type."""
        gate, up = p + "ffn_gate.weight", p + "ffn_up.weight"
        return [self.matrix(gate, up)] if self.fusable(gate, up) else [self.matrix(gate), self.matrix(up)]

    def attn_params(self, i: int) -> dict:
        """Hook: layer i's attention scale and sliding window (0: none). The window is set for HF
        Mistral/Phi-3 configs (extra["sliding_window"], optionally only on extra["swa_layers"])."""
        ex = self.cfg.extra
        window = int(ex.get("sliding_window", 0) or 0)
        swa = ex.get("swa_layers")
        if swa is not None and not swa[i]:
            window = 0
        return dict(scale=float(ex.get("attn_scale", 1.0 / math.sqrt(self.cfg.head_dim))), window=window)

    def _bias_cat(self, parts):
        """Q, K, V biases as one vector over the qkv rows (zeros where a bias is absent)."""
        import numpy as np
        c = self.cfg
        sizes = (c.q_dim, c.kv_dim, c.kv_dim)
        vals = [np.zeros(s, np.float32) if b is None else self.dev.read(b, np.float32)[:s]
                for b, s in zip(parts, sizes)]
        return self.dev.upload(np.concatenate(vals), label="qkv_bias")

    def qkv_projection(self, i: int, tt: int, src, norm: dict, decode: bool) -> list:
        """Layer i's Q/K/V matmuls into the qkv rows (a shared bias is indexed by output row). In decode,
        Q+K of one type and V of another (Q4_K_M) run as one dispatch (ops.gemv_pair)."""
        c, L = self.cfg, self.layers[i]
        bias = L["qkv_bias"][0] if L["qkv_bias"] else None
        parts, qkv_w = L["qkv"], c.q_dim + 2 * c.kv_dim
        if decode and len(parts) == 2 and bias is None and ops.can_pair(*parts):
            return ops.gemv_pair(self.dev, parts[0], parts[1], src, self.qkv, y_stride=qkv_w, **norm)
        out, row0 = [], 0
        for w in parts:
            out += ops.matmul(self.dev, w, src, self.qkv, self.state, tt=tt, y_stride=qkv_w, row0=row0,
                              bias=bias, tiled=self.tiled, **norm)
            row0 += w.rows
        return out

    def qkv_ops(self, i: int, tt: int) -> list:
        """Hook: dispatches on the projected qkv rows before RoPE (Qwen3's per-head Q/K norm)."""
        return []

    def layer_ops(self, i: int, tt: int) -> list:
        """One layer's dispatches. Decode (tt == 1) folds the norms into the matmuls, RoPE and the
        KV store into attention and the activation into the gate/up matmul: 5 dispatches a layer
        when Q/K/V and gate/up each share a type."""
        c, dev, L, st = self.cfg, self.dev, self.layers[i], self.state
        decode = tt == 1 and self.fuse
        out = []
        if decode:
            src, norm = self.x, dict(norm=L["attn_norm"], eps=c.rms_eps)
        else:
            out.append(ops.rmsnorm(dev, self.x, L["attn_norm"], self.xn, st, dim=c.dim, eps=c.rms_eps))
            src, norm = self.xn, {}
        out += self.qkv_projection(i, tt, src, norm, decode)
        out += self.qkv_ops(i, tt)
        attn = dict(n_heads=c.n_heads, n_kv=c.n_kv_heads, head_dim=c.head_dim, **self.attn_params(i))
        if decode:
            out.append(ops.attention(dev, self.qkv, self.k_cache[i], self.v_cache[i], self.attn, st, **attn,
                                     inv_freq=self.inv_freq, rope_dim=c.rope_dim, neox=c.rope_neox))
        else:
            out.append(ops.rope_store(dev, self.qkv, self.inv_freq, self.k_cache[i], self.v_cache[i], st,
                                      n_heads=c.n_heads, n_kv=c.n_kv_heads, head_dim=c.head_dim,
                                      rope_dim=c.rope_dim, neox=c.rope_neox))
            out.append(ops.attention(dev, self.qkv, self.k_cache[i], self.v_cache[i], self.attn, st, **attn))
        out += ops.matmul(dev, L["wo"], self.attn, self.x, st, tt=tt, y_stride=c.dim, accumulate=True,
                          tiled=self.tiled)
        gu = L["gate_up"]
        if decode and len(gu) == 1 and len(gu[0].chunks) == 1:
            out += ops.matmul(dev, gu[0], self.x, self.h, st, tt=1, y_stride=c.ffn_dim, glu=True,
                              norm=L["ffn_norm"], eps=c.rms_eps)
        else:
            out.append(ops.rmsnorm(dev, self.x, L["ffn_norm"], self.xn, st, dim=c.dim, eps=c.rms_eps))
            row0 = 0
            for w in gu:
                out += ops.matmul(dev, w, self.xn, self.gu, st, tt=tt, y_stride=2 * c.ffn_dim, row0=row0,
                                  tiled=self.tiled)
                row0 += w.rows
            out.append(ops.glu(dev, self.gu, self.h, st, ffn=c.ffn_dim))
        out += ops.matmul(dev, L["down"], self.h, self.x, st, tt=tt, y_stride=c.dim, accumulate=True,
                          tiled=self.tiled)
        return out
