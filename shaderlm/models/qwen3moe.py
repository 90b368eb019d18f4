"""Qwen3 mixture of experts (llama.cpp arch "qwen3moe"; Qwen3MoeForCausalLM, e.g. Qwen3-30B-A3B):
Qwen3's attention (per-head Q/K norms, NEOX RoPE) with every FFN a mixture of experts:

    p = softmax(Wrouter . norm(x)); e_1..e_k = top-k(p); w_j = p_j / sum p (norm_topk_prob)
    x += sum_j w_j * Wdown_e_j . (silu(Wgate_e_j . norm(x)) * Wup_e_j . norm(x))
"""
from __future__ import annotations

from dataclasses import dataclass

from .qwen3 import Qwen3, Qwen3Args


@dataclass
class Qwen3MoeArgs(Qwen3Args):
    pass


class Qwen3Moe(Qwen3):
    gguf_arch = "qwen3moe"
    hf_architectures = ("Qwen3MoeForCausalLM",)
    hf_model_types = ("qwen3_moe",)
    Args = Qwen3MoeArgs
    presets = {
        "tiny": dict(rope_base=1000000.0, n_experts=8, n_experts_used=2, expert_ffn_dim=64),
        "qwen3-30b-a3b": dict(dim=2048, n_layers=48, n_heads=32, n_kv_heads=4, head_dim=128, ffn_dim=6144,
                              n_experts=128, n_experts_used=8, expert_ffn_dim=768, vocab_size=151936,
                              context_length=40960, rope_base=1000000.0, rms_eps=1e-6, tokenizer="smollm2"),
    }
    hf_names = {**Qwen3.hf_names, "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.gate.weight"}
    hf_expert_names = {"blk.{i}.ffn_gate_exps.weight": "model.layers.{i}.mlp.experts.{j}.gate_proj.weight",
                       "blk.{i}.ffn_up_exps.weight": "model.layers.{i}.mlp.experts.{j}.up_proj.weight",
                       "blk.{i}.ffn_down_exps.weight": "model.layers.{i}.mlp.experts.{j}.down_proj.weight"}
