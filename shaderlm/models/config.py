"""Architecture-neutral model hyper-parameters, filled from GGUF metadata (or an HF config.json)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    arch: str                 # "llama", "qwen2", "qwen3", "gemma3", ...
    n_layers: int
    dim: int                  # hidden size (embedding_length)
    n_heads: int
    n_kv_heads: int
    head_dim: int             # per-head size of Q/K (attention.key_length, else dim // n_heads)
    ffn_dim: int
    vocab_size: int
    context_length: int
    rms_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_dim: int = 0         # rotated dims per head (rope.dimension_count), 0 = head_dim
    rope_neox: bool = False   # llama.cpp "NEOX" mode: rotate (i, i + d/2) instead of (2i, 2i+1)
    rope_scale: float = 1.0   # linear scaling factor (positions divided by this)
    name: str = ""
    extra: dict = field(default_factory=dict)   # arch-specific values (sliding window, softcaps, ...)

    def __post_init__(self):
        if not self.rope_dim:
            self.rope_dim = self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim
