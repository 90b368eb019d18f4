"""Phi-3 mini/medium (llama.cpp arch "phi3"; Phi3ForCausalLM): the llama layer with a fused QKV
projection (attn_qkv: [q; k; v] rows), a fused gate/up projection (ffn_up: [gate; up] rows, so the
gate/up matmul and GLU run as for llama), NEOX RoPE, an optional sliding window, and LongRoPE ("su")
scaling when the model has rope_factors_long/short:

    theta_i = pos * base^(-2i/d) / factors[i],  cos/sin multiplied by attn_factor

with the long factors when the allocated context is over the original training context (llama.cpp's
rule; transformers switches by the current sequence length instead, so the two agree whenever the
context is allocated to match). The attn_factor multiplies both q and k, so it is folded into the
attention scale (attn_factor^2), which is exact when RoPE covers the whole head (every Phi-3 model).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from .args import ModelArgs, hf_rope_params
from .transformer import Transformer


@dataclass
class Phi3Args(ModelArgs):
    rope_neox: bool = True
    fused_qkv: bool = True
    fused_gate_up: bool = True

    @classmethod
    def gguf_fields(cls, f, a):
        out = super().gguf_fields(f, a)
        fused_gate_up = "blk.0.ffn_gate.weight" not in f.tensors
        if fused_gate_up and not f.get_int(f"{a}.feed_forward_length", 0):
            out["ffn_dim"] //= 2                   # read off ffn_up, which holds gate and up
        out.update(fused_qkv="blk.0.attn_qkv.weight" in f.tensors, fused_gate_up=fused_gate_up,
                   sliding_window=f.get_int(f"{a}.attention.sliding_window", 0))
        return out

    def write_gguf(self, w, arch):
        super().write_gguf(w, arch)
        if self.sliding_window:
            w.add_sliding_window(int(self.sliding_window))
        sc = self.rope_scaling or {}
        if "attn_factor" in sc:
            w.add_rope_scaling_attn_factors(float(sc["attn_factor"]))
        if "original_context_length" in sc:
            w.add_rope_scaling_orig_ctx_len(int(sc["original_context_length"]))

    @classmethod
    def hf_rope_type_ok(cls, rope_type):
        return rope_type in ("longrope", "su")

    @classmethod
    def hf_fields(cls, h):
        out, extra = super().hf_fields(h)
        rp = hf_rope_params(h)
        if rp["rope_type"] in ("longrope", "su"):
            ctx, rope_dim = out["context_length"], out["rope_dim"]
            orig = int(rp.get("original_max_position_embeddings") or h.get("original_max_position_embeddings") or ctx)
            factor = rp.get("factor") or ctx / orig
            attn_factor = rp.get("attention_factor")
            if attn_factor is None:
                attn_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
            try:
                long_f = np.asarray(rp["long_factor"], np.float32)
                short_f = np.asarray(rp["short_factor"], np.float32)
            except (KeyError, TypeError, ValueError) as e:
                raise ModelFormatError(f"{h.where}: LongRoPE needs long_factor and short_factor lists ({e})") from None
            if long_f.shape != (rope_dim // 2,) or short_f.shape != (rope_dim // 2,):
                raise ModelFormatError(f"{h.where}: long_factor/short_factor need {rope_dim // 2} values")
            extra.update({"rope_factors_long.weight": long_f, "rope_factors_short.weight": short_f})
            out["rope_scaling"] = {"type": "longrope", "original_context_length": orig,
                                   "attn_factor": float(attn_factor)}
        out.update(fused_qkv="model.layers.0.self_attn.qkv_proj.weight" in h.tensors,
                   fused_gate_up="model.layers.0.mlp.gate_proj.weight" not in h.tensors)
        return out, extra

    def hf_config(self):
        out = super().hf_config()
        out["sliding_window"] = self.sliding_window or None
        return out


class Phi3(Transformer):
    gguf_arch = "phi3"
    hf_architectures = ("Phi3ForCausalLM",)
    hf_model_types = ("phi3",)
    Args = Phi3Args
    hf_names = {**Transformer.hf_names,
                "blk.{i}.attn_qkv.weight": "model.layers.{i}.self_attn.qkv_proj.weight",
                "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.gate_up_proj.weight"}
    presets = {
        "phi3-mini": dict(dim=3072, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=8192, vocab_size=32064,
                          context_length=4096, rope_base=10000.0, sliding_window=2047),
    }

    @classmethod
    def layer_specs(cls, a, p):
        out = []
        for name, shape in super().layer_specs(a, p):
            if a.fused_qkv and name in (p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"):
                if name.endswith("attn_q.weight"):
                    out.append((p + "attn_qkv.weight", (a.q_dim + 2 * a.kv_dim, a.dim)))
            elif a.fused_gate_up and name in (p + "ffn_gate.weight", p + "ffn_up.weight"):
                if name.endswith("ffn_up.weight"):
                    out.append((p + "ffn_up.weight", (2 * a.ffn_dim, a.dim)))
            else:
                out.append((name, shape))
        return out

    def qkv_weights(self, p):
        if self.args.fused_qkv:
            return [self.matrix(p + "attn_qkv.weight")]
        return super().qkv_weights(p)

    def gate_up_weights(self, p):
        if self.args.fused_gate_up:
            return [self.matrix(p + "ffn_up.weight")]          # [gate; up] stacked, as llama's fused pair
        return super().gate_up_weights(p)

    def _longrope(self):
        a = self.args
        sc = a.rope_scaling or {}
        orig = int(sc.get("original_context_length", 0) or 0) or a.context_length
        factor = a.context_length / orig
        attn_factor = sc.get("attn_factor")
        if attn_factor is None:
            attn_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        return orig, float(attn_factor)

    def rope_inv_freq(self, base=None, scale=None):
        a = self.args
        long_t = self.source.tensors.get("rope_factors_long.weight")
        short_t = self.source.tensors.get("rope_factors_short.weight")
        if long_t is None or short_t is None:
            return super().rope_inv_freq(base, scale)
        orig, _ = self._longrope()
        t = long_t if self.ctx > orig else short_t
        factors = np.frombuffer(t.data, np.float32).astype(np.float64)
        i = np.arange(a.rope_dim // 2, dtype=np.float64)
        freq = (a.rope_base if base is None else base) ** (-2.0 * i / a.rope_dim) / factors[: len(i)]
        return freq / (2 * np.pi)

    def attention_params(self, i):
        p = super().attention_params(i)
        if "rope_factors_long.weight" in self.source.tensors:
            _, mscale = self._longrope()
            if mscale != 1.0 and self.args.rope_dim != self.args.head_dim:
                raise UnsupportedError(f"{self.source.path}: LongRoPE attention factor with partial rotary "
                                       f"dimensions ({self.args.rope_dim} of {self.args.head_dim}) is not supported")
            p["scale"] *= mscale * mscale
        return p
