"""Qwen3 (dense): the llama layer with a per-head RMSNorm on Q and K (attn_q_norm / attn_k_norm,
head_dim weights) after the Q/K projection and before RoPE (NEOX pairs).

Per layer: q, k, v = Wqkv . norm(x); q, k = headnorm(q), headnorm(k); x += Wo . attn(rope(q), rope(k), v);
x += Wdown . (silu(Wgate . norm(x)) * Wup . norm(x)).
"""
from __future__ import annotations

from ..errors import ModelFormatError
from ..kernels import ops
from .llama import Llama


class Qwen3(Llama):
    def _load_weights(self):
        super()._load_weights()
        for i, L in enumerate(self.layers):
            p = f"blk.{i}."
            L["q_norm"] = self.vector(p + "attn_q_norm.weight", required=False)
            L["k_norm"] = self.vector(p + "attn_k_norm.weight", required=False)
            if (L["q_norm"] is None) != (L["k_norm"] is None):
                raise ModelFormatError(f"{self.gguf.path}: layer {i} has only one of attn_q_norm / attn_k_norm")

    def qkv_ops(self, i: int, tt: int) -> list:
        """One dispatch normalizing every Q and K head of every token in place in the qkv rows."""
        c, L = self.cfg, self.layers[i]
        if L["q_norm"] is None:
            return []
        return [ops.head_norm(self.dev, self.qkv, L["q_norm"], L["k_norm"], self.state, n_heads=c.n_heads,
                              n_kv=c.n_kv_heads, head_dim=c.head_dim, eps=c.rms_eps)]
