"""Phi-3 (mini/medium): the llama layer with a fused QKV projection (attn_qkv: [q; k; v] rows), a fused
gate/up projection (ffn_up: [gate; up] rows, so the gate/up matmul and GLU run as for llama), NEOX RoPE,
an optional sliding window, and LongRoPE ("su") scaling when the model has rope_factors_long/short:

    theta_i = pos * base^(-2i/d) / factors[i],  cos/sin multiplied by attn_factor

with the long factors when the allocated context is over the original training context (llama.cpp's
rule; transformers switches by the current sequence length instead, so the two agree whenever the
context is allocated to match: up to original_context_length, or beyond it with prompts that are too).
The attn_factor multiplies both q and k, so it is folded into the attention scale (attn_factor^2),
which is exact when RoPE covers the whole head (every Phi-3 model).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UnsupportedError
from .llama import Llama


class Phi3(Llama):
    def qkv_weights(self, p: str) -> list:
        if self.tensor(p + "attn_qkv.weight", required=False) is not None:
            return [self.matrix(p + "attn_qkv.weight")]
        return super().qkv_weights(p)

    def gate_up_weights(self, p: str) -> list:
        if self.tensor(p + "ffn_gate.weight", required=False) is None:
            return [self.matrix(p + "ffn_up.weight")]          # [gate; up] stacked, as llama's fused pair
        return super().gate_up_weights(p)

    def _longrope(self):
        c = self.cfg
        sc = c.extra.get("rope_scaling") or {}
        orig = int(sc.get("original_context_length", 0) or 0) or c.context_length
        factor = c.context_length / orig
        attn_factor = sc.get("attn_factor")
        if attn_factor is None:
            attn_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        return orig, float(attn_factor)

    def rope_inv_freq(self, base=None, scale=None) -> np.ndarray:
        c = self.cfg
        long_t = self.tensor("rope_factors_long.weight", required=False)
        short_t = self.tensor("rope_factors_short.weight", required=False)
        if long_t is None or short_t is None:
            return super().rope_inv_freq(base, scale)
        orig, _ = self._longrope()
        t = long_t if self.ctx > orig else short_t
        factors = np.frombuffer(t.data, np.float32).astype(np.float64)
        i = np.arange(c.rope_dim // 2, dtype=np.float64)
        freq = (c.rope_base if base is None else base) ** (-2.0 * i / c.rope_dim) / factors[: len(i)]
        return freq / (2 * np.pi)

    def attn_params(self, i: int) -> dict:
        p = super().attn_params(i)
        if self.tensor("rope_factors_long.weight", required=False) is not None:
            _, mscale = self._longrope()
            if mscale != 1.0 and self.cfg.rope_dim != self.cfg.head_dim:
                raise UnsupportedError(f"{self.gguf.path}: LongRoPE attention factor with partial rotary "
                                       f"dimensions ({self.cfg.rope_dim} of {self.cfg.head_dim}) is not supported")
            p["scale"] *= mscale * mscale
        return p
