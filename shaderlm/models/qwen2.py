"""Qwen2 / Qwen2.5 (llama.cpp arch "qwen2"; Qwen2ForCausalLM): the llama layer with Q/K/V biases and
NEOX RoPE pairs (i, i + d/2). Sliding windows only where config.json turns them on."""
from __future__ import annotations

from dataclasses import dataclass

from .args import ModelArgs, hf_layer_types
from .transformer import Transformer


@dataclass
class Qwen2Args(ModelArgs):
    rms_eps: float = 1e-6
    rope_neox: bool = True
    attn_bias: bool = True

    @classmethod
    def hf_window(cls, h, n_layers):
        if not h.get("use_sliding_window"):
            return 0, None
        return h.get_int("sliding_window", 0), hf_layer_types(h, n_layers)


class Qwen2(Transformer):
    gguf_arch = "qwen2"
    hf_architectures = ("Qwen2ForCausalLM",)
    hf_model_types = ("qwen2",)
    Args = Qwen2Args
    presets = {
        "tiny": dict(rope_base=1000000.0),
        "qwen2.5-7b": dict(dim=3584, n_layers=28, n_heads=28, n_kv_heads=4, ffn_dim=18944, vocab_size=152064,
                           context_length=32768, rope_base=1000000.0, tokenizer="smollm2"),
        "qwen2.5-0.5b": dict(dim=896, n_layers=24, n_heads=14, n_kv_heads=2, ffn_dim=4864, vocab_size=151936,
                             context_length=32768, rope_base=1000000.0, tied=True, tokenizer="smollm2"),
    }
