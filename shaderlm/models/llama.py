"""Llama 2/3/3.1/3.2, SmolLM2 (llama.cpp arch "llama"; LlamaForCausalLM), Mistral (MistralForCausalLM,
read as llama, as llama.cpp does) and Mixtral (MixtralForCausalLM; in a GGUF, llama with
llama.expert_count: every FFN a mixture of experts, Transformer.moe_ops). The layer is Transformer's own:

    x += Wo . attn(rope(Wq . norm(x)), rope(Wk . norm(x)), Wv . norm(x))
    x += Wdown . (silu(Wgate . norm(x)) * Wup . norm(x))

llama.cpp's converter permutes Q and K rows from Hugging Face's rotate_half pairs (i, i + d/2) to
interleaved pairs (2i, 2i + 1), so a GGUF llama rotates interleaved pairs and an HF folder, read as
it is stored, rotate_half pairs.
"""
from __future__ import annotations

from dataclasses import dataclass

from .args import ModelArgs
from .transformer import Transformer

LLAMA3_ROPE_8B = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=8192)


@dataclass
class LlamaArgs(ModelArgs):
    pass


class Llama(Transformer):
    gguf_arch = "llama"
    hf_architectures = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
    hf_model_types = ("llama", "mistral", "mixtral")
    Args = LlamaArgs
    presets = {
        "smollm2-135m": dict(dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152,
                             context_length=8192, rope_base=100000.0, tied=True, tokenizer="smollm2"),
        "llama-3.2-1b": dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256,
                             context_length=131072, rope_base=500000.0, tied=True, tokenizer="smollm2",
                             rope_freqs=dict(LLAMA3_ROPE_8B, factor=32.0)),
        "llama-3.1-8b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256,
                             context_length=131072, rope_base=500000.0, tokenizer="smollm2",
                             rope_freqs=LLAMA3_ROPE_8B),
        "mixtral-8x7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, n_experts=8,
                             n_experts_used=2, expert_ffn_dim=14336, vocab_size=32000, context_length=32768,
                             rope_base=1000000.0),
        "mistral-7b": dict(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=32768,
                           context_length=32768, rope_base=1000000.0),
    }

    hf_names = {**Transformer.hf_names, "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.block_sparse_moe.gate.weight"}
    hf_expert_names = {"blk.{i}.ffn_gate_exps.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight",
                       "blk.{i}.ffn_up_exps.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w3.weight",
                       "blk.{i}.ffn_down_exps.weight": "model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight"}

    @staticmethod
    def gguf_permuted_heads(name: str, args: ModelArgs) -> int | None:
        """Q and K rows (and biases) go from rotate_half to interleaved pairs in a GGUF: per head."""
        return {"attn_q": args.n_heads, "attn_k": args.n_kv_heads}.get(name.split(".")[-2])
