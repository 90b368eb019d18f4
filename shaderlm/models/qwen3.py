"""Qwen3, dense (llama.cpp arch "qwen3"; Qwen3ForCausalLM): the llama layer with a per-head RMSNorm
on Q and K after their projection and before RoPE (NEOX pairs), no biases.

    q, k, v = Wqkv . norm(x); q, k = headnorm(q), headnorm(k); x += Wo . attn(rope(q), rope(k), v)
    x += Wdown . (silu(Wgate . norm(x)) * Wup . norm(x))
"""
from __future__ import annotations

from dataclasses import dataclass

from .qwen2 import Qwen2Args
from .transformer import Transformer


@dataclass
class Qwen3Args(Qwen2Args):
    attn_bias: bool = False
    qk_norm: bool = True


class Qwen3(Transformer):
    gguf_arch = "qwen3"
    hf_architectures = ("Qwen3ForCausalLM",)
    hf_model_types = ("qwen3",)
    Args = Qwen3Args
    presets = {
        "tiny": dict(rope_base=1000000.0),
        "qwen3-0.6b": dict(dim=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, ffn_dim=3072,
                           vocab_size=151936, context_length=40960, rope_base=1000000.0, tied=True,
                           tokenizer="smollm2"),
    }
