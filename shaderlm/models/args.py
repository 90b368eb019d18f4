"""The hyper-parameters every decoder-only architecture has, read from GGUF metadata (llama.cpp's keys)
or a Hugging Face config.json, and written back as GGUF keys. An architecture subclasses ModelArgs
with its own fields and extends the readers where its keys differ."""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import ModelFormatError, UnsupportedError


# the sizes' keys in a GGUF file / a config.json, for messages
SIZE_KEYS = dict(n_layers="block_count / num_hidden_layers", dim="embedding_length / hidden_size",
                 n_heads="attention.head_count / num_attention_heads",
                 n_kv_heads="attention.head_count_kv / num_key_value_heads", head_dim="attention.key_length / head_dim",
                 ffn_dim="feed_forward_length / intermediate_size", vocab_size="vocab_size / the embedding's rows",
                 context_length="context_length / max_position_embeddings",
                 n_experts="expert_count / num_experts", n_experts_used="expert_used_count / num_experts_per_tok",
                 expert_ffn_dim="expert_feed_forward_length / moe_intermediate_size")


@dataclass
class ModelArgs:
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
    rope_scale: float = 1.0   # linear RoPE scaling: positions divided by this
    sliding_window: int = 0   # keys a query sees in a windowed layer (0: none)
    swa_layers: list | None = None   # which layers use the window (None: all of them, when it is set)
    tied: bool = False        # the LM head is the token embedding
    attn_bias: bool = False   # Q/K/V biases
    qk_norm: bool = False     # per-head RMSNorm of Q and K before RoPE
    name: str = ""
    n_experts: int = 0        # a mixture of experts' FFN: experts per layer (0: a dense FFN)
    n_experts_used: int = 0   # experts each token's router picks
    expert_ffn_dim: int = 0   # an expert's FFN size
    expert_norm: bool = True  # the picked experts' weights renormalised to sum to 1 (else softmax over all)
    rope_scaling: dict = field(default_factory=dict)   # the file's rope.scaling.* keys (LongRoPE's)

    # transformers 5 may give RoPE settings per layer type: the one the global layers use
    hf_rope_layer_type: ClassVar[str | None] = None

    def __post_init__(self):
        if not self.rope_dim:
            self.rope_dim = self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def windowed(self, layer: int) -> bool:
        return bool(self.sliding_window) and (self.swa_layers is None or bool(self.swa_layers[layer]))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def check(self, where: str):
        """Raise ModelFormatError naming `where` when the sizes cannot describe a model."""
        sizes = dict(n_layers=self.n_layers, dim=self.dim, n_heads=self.n_heads, n_kv_heads=self.n_kv_heads,
                     head_dim=self.head_dim, ffn_dim=self.ffn_dim, vocab_size=self.vocab_size,
                     context_length=self.context_length)
        bad = [k for k, v in sizes.items() if not (isinstance(v, int) and v > 0)]
        if bad:
            k = bad[0]
            raise ModelFormatError(f"{where}: {k} ({SIZE_KEYS[k]}) is {sizes[k]}: it should be a positive whole number")
        if self.n_heads % self.n_kv_heads:
            raise ModelFormatError(f"{where}: the head count ({self.n_heads}) is not a multiple of the KV head "
                                   f"count ({self.n_kv_heads})")
        if not 0 < self.rope_dim <= self.head_dim or self.rope_dim % 2:
            raise ModelFormatError(f"{where}: the RoPE dimension count ({self.rope_dim}) must be even, positive "
                                   f"and at most the head size ({self.head_dim})")
        finite_positive = dict(rms_eps=self.rms_eps, rope_base=self.rope_base, rope_scale=self.rope_scale)
        bad = {k: v for k, v in finite_positive.items() if not (v > 0 and math.isfinite(v))}
        if bad:
            raise ModelFormatError(f"{where}: {bad} should be finite and positive")
        if self.sliding_window < 0:
            raise ModelFormatError(f"{where}: negative sliding window {self.sliding_window}")
        if self.n_experts:
            experts = dict(n_experts=self.n_experts, n_experts_used=self.n_experts_used,
                           expert_ffn_dim=self.expert_ffn_dim)
            bad = [k for k, v in experts.items() if not (isinstance(v, int) and v > 0)]
            if bad:
                raise ModelFormatError(f"{where}: {bad[0]} ({SIZE_KEYS[bad[0]]}) is {experts[bad[0]]}: a mixture of "
                                       f"experts needs it positive")
            if self.n_experts_used > self.n_experts:
                raise ModelFormatError(f"{where}: {self.n_experts_used} experts used per token "
                                       f"({SIZE_KEYS['n_experts_used']}), more than the {self.n_experts} experts")
        if self.swa_layers is not None and len(self.swa_layers) != self.n_layers:
            raise ModelFormatError(f"{where}: {len(self.swa_layers)} sliding-window flags for {self.n_layers} layers")

    # ---- GGUF ----------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, f, arch: str):
        """From a GGUFFile's metadata (keys under `arch`.) and tensor list."""
        args = cls(**cls.gguf_fields(f, arch))
        args.check(f.path)
        return args

    @classmethod
    def gguf_fields(cls, f, a: str) -> dict:
        """The constructor's keyword arguments from GGUF metadata: subclasses add their own."""
        n_heads = f.get_int(f"{a}.attention.head_count")
        dim = f.get_int(f"{a}.embedding_length")
        if n_heads <= 0:
            raise ModelFormatError(f"{f.path}: {a}.attention.head_count is {n_heads}")
        head_dim = f.get_int(f"{a}.attention.key_length", 0) or dim // n_heads
        n_experts = f.get_int(f"{a}.expert_count", 0)
        expert_ffn = f.get_int(f"{a}.expert_feed_forward_length", 0)
        ffn = f.get_int(f"{a}.feed_forward_length", None)
        if ffn is None and n_experts:
            ffn = expert_ffn
        if ffn is None:
            t = f.tensors.get("blk.0.ffn_gate.weight") or f.tensors.get("blk.0.ffn_up.weight")
            if t is None:
                f.require(f"{a}.feed_forward_length")
            ffn = t.shape[0]
        emb = f.tensors.get("token_embd.weight")
        tokens = f.metadata.get("tokenizer.ggml.tokens")
        vocab = f.get_int(f"{a}.vocab_size", 0)
        if not vocab and isinstance(tokens, list) and tokens:
            vocab = len(tokens)
        if not vocab and emb is not None:
            vocab = emb.shape[0]
        if not vocab:
            f.require(f"{a}.vocab_size")
        if isinstance(tokens, list) and tokens and len(tokens) != vocab:    # llama.cpp's vocabulary is its token list
            raise ModelFormatError(f"{f.path}: the token list (tokenizer.ggml.tokens) has {len(tokens):,} tokens, "
                                   f"the model's vocabulary {vocab:,}")
        if emb is not None and emb.shape != (vocab, dim):
            raise ModelFormatError(f"{f.path}: tensor 'token_embd.weight' has shape {emb.shape}, expected "
                                   f"(vocab_size={vocab}, embedding_length={dim})")
        scaling = {k[len(f"{a}.rope.scaling."):]: v for k, v in f.metadata.items()
                   if k.startswith(f"{a}.rope.scaling.")}
        stype = f.get_str(f"{a}.rope.scaling.type", None)
        rope_scale = 1.0
        if stype == "linear":
            rope_scale = f.get_float(f"{a}.rope.scaling.factor", 1.0) or 1.0
        elif stype is None and f"{a}.rope.scale_linear" in f.metadata:   # pre-2024 key
            rope_scale = f.get_float(f"{a}.rope.scale_linear")
        elif stype not in (None, "none") and not cls.gguf_rope_type_ok(stype):
            raise UnsupportedError(f"{f.path}: RoPE scaling {stype!r} ({a}.rope.scaling.type) is not supported "
                                   f"(supported: linear)")
        name = f.get_str("general.name", "") or f.get_str("general.basename", "") \
            or os.path.splitext(os.path.basename(f.path))[0]
        fields = dataclasses.fields(cls)
        defaults = {x.name: x.default for x in fields if x.default is not dataclasses.MISSING}
        return dict(
            n_layers=f.layer_count(f"{a}.block_count", "blk."), dim=dim, n_heads=n_heads,
            n_kv_heads=f.get_int(f"{a}.attention.head_count_kv", n_heads), head_dim=head_dim, ffn_dim=ffn,
            vocab_size=vocab, context_length=f.get_int(f"{a}.context_length"),
            rms_eps=f.get_float(f"{a}.attention.layer_norm_rms_epsilon", defaults["rms_eps"]),
            rope_base=f.get_float(f"{a}.rope.freq_base", 10000.0),
            rope_dim=f.get_int(f"{a}.rope.dimension_count", 0) or head_dim, rope_scale=rope_scale,
            tied="output.weight" not in f.tensors,
            attn_bias="blk.0.attn_q.bias" in f.tensors or "blk.0.attn_qkv.bias" in f.tensors,
            qk_norm="blk.0.attn_q_norm.weight" in f.tensors, name=str(name), rope_scaling=scaling,
            n_experts=n_experts, n_experts_used=f.get_int(f"{a}.expert_used_count", 0) if n_experts else 0,
            expert_ffn_dim=(expert_ffn or ffn) if n_experts else 0,
            expert_norm=f.get_bool(f"{a}.expert_weights_norm", defaults["expert_norm"]))

    def write_gguf(self, w, arch: str):
        """This config's keys into a gguf.GGUFWriter (general.architecture = `arch`)."""
        w.add_name(self.name)
        w.add_context_length(self.context_length)
        w.add_embedding_length(self.dim)
        w.add_block_count(self.n_layers)
        w.add_feed_forward_length(self.ffn_dim)
        w.add_head_count(self.n_heads)
        w.add_head_count_kv(self.n_kv_heads)
        w.add_key_length(self.head_dim)
        w.add_value_length(self.head_dim)
        w.add_rope_dimension_count(self.rope_dim)
        w.add_rope_freq_base(float(self.rope_base))
        w.add_layer_norm_rms_eps(float(self.rms_eps))
        w.add_vocab_size(self.vocab_size)
        if self.n_experts:
            w.add_expert_count(self.n_experts)
            w.add_expert_used_count(self.n_experts_used)
            w.add_expert_feed_forward_length(self.expert_ffn_dim)
            w.add_expert_weights_norm(self.expert_norm)
        if self.rope_scale != 1.0:
            import gguf
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(self.rope_scale)

    # ---- Hugging Face --------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, folder) -> tuple:
        """(args, extra tensors by GGUF name) from an HFFolder's config.json: the extra tensors are
        what llama.cpp's converter would write that the checkpoint holds as settings (RoPE factors)."""
        fields, extra = cls.hf_fields(folder)
        args = cls(**fields)
        args.check(folder.where)
        return args, extra

    @classmethod
    def hf_fields(cls, h) -> tuple[dict, dict]:
        """The constructor's keyword arguments from config.json, and the extra tensors: subclasses add
        their own. Q and K are used as Hugging Face stores them (rotate_half pairs: NEOX RoPE)."""
        dim, n_heads = h.get_int("hidden_size"), h.get_int("num_attention_heads")
        if n_heads <= 0:
            raise ModelFormatError(f"{h.where}: num_attention_heads is {n_heads}")
        head_dim = h.get_int("head_dim", cls.hf_head_dim(dim, n_heads))
        emb = h.tensors.get("model.embed_tokens.weight")
        if emb is None:
            raise ModelFormatError(f"{h.path}: tensor model.embed_tokens.weight is missing")
        if len(emb.shape) != 2 or emb.shape[1] != dim:
            raise ModelFormatError(f"{h.path}: model.embed_tokens.weight has shape {emb.shape}, expected (vocab, "
                                   f"hidden_size={dim})")
        act = h.get_str("hidden_act", None) or h.get_str("hidden_activation", None) or "silu"
        if act not in cls.hf_activations():
            raise UnsupportedError(f"{h.path}: activation {act!r} is not supported for {h.architecture} "
                                   f"({', '.join(cls.hf_activations())})")
        if h.get("mlp_bias"):
            raise UnsupportedError(f"{h.path}: MLP biases (mlp_bias: true) are not supported")
        rp = hf_rope_params(h, cls.hf_rope_layer_type)
        partial = h.get_float("partial_rotary_factor", h.get_float("partial_rotary_factor", 1.0),
                              within=rp) or 1.0
        if not 0 < partial <= 1:
            raise ModelFormatError(f"{h.where}: 'partial_rotary_factor' should be in (0, 1], got {partial}")
        rope_dim = int(head_dim * partial)
        rope_dim -= rope_dim % 2
        ctx = h.get_int("max_position_embeddings", 4096)
        extra, rope_scale, rtype = {}, 1.0, rp["rope_type"]
        if rtype == "linear":
            rope_scale = h.get_float("factor", 1.0, within=rp) or 1.0
        elif rtype == "llama3":
            extra["rope_freqs.weight"] = llama3_rope_factors(checked_llama3(h, rp), float(rp["rope_theta"]), rope_dim)
        elif rtype != "default" and not cls.hf_rope_type_ok(rtype):
            raise UnsupportedError(f"{h.path}: RoPE scaling {rtype!r} is not supported for {h.architecture} "
                                   f"(supported: linear, llama3)")
        name = h.get_str("_name_or_path", None) or os.path.basename(os.path.normpath(h.path))
        n_layers = h.layer_count("num_hidden_layers", "model.layers.")
        window, swa_layers = cls.hf_window(h, n_layers)
        n_experts = h.get_int("num_experts", 0) or h.get_int("num_local_experts", 0)
        experts = {}
        if n_experts:
            experts = dict(n_experts=n_experts, n_experts_used=h.get_int("num_experts_per_tok"),
                           expert_ffn_dim=h.get_int("moe_intermediate_size", 0) or h.get_int("intermediate_size"),
                           expert_norm=h.get_bool("norm_topk_prob", True))
            if h.get("mlp_only_layers") or h.get_int("decoder_sparse_step", 1) != 1:
                raise UnsupportedError(f"{h.path}: dense layers among the expert layers (mlp_only_layers, "
                                       f"decoder_sparse_step) are not supported")
        return dict(**experts,n_layers=n_layers, dim=dim, n_heads=n_heads,
                    n_kv_heads=h.get_int("num_key_value_heads", n_heads), head_dim=head_dim,
                    ffn_dim=h.get_int("intermediate_size"), vocab_size=emb.shape[0], context_length=ctx,
                    rms_eps=h.get_float("rms_norm_eps", 1e-6), rope_base=float(rp["rope_theta"]),
                    rope_dim=rope_dim, rope_neox=True, rope_scale=rope_scale, sliding_window=window,
                    swa_layers=swa_layers, tied="lm_head.weight" not in h.tensors, attn_bias="model.layers.0.self_attn.q_proj.bias" in h.tensors,
                    qk_norm="model.layers.0.self_attn.q_norm.weight" in h.tensors, name=str(name)), extra

    @classmethod
    def hf_head_dim(cls, dim: int, n_heads: int) -> int:
        """The head size where config.json has no head_dim."""
        return dim // n_heads

    @classmethod
    def hf_window(cls, h, n_layers: int) -> tuple[int, list | None]:
        """(sliding window, which layers use it) from config.json: by default every layer is windowed."""
        return h.get_int("sliding_window", 0), None

    @classmethod
    def hf_activations(cls) -> tuple:
        return ("silu",)

    @classmethod
    def gguf_rope_type_ok(cls, rope_type: str) -> bool:
        """An architecture that reads another GGUF RoPE scaling type itself says so here."""
        return False

    @classmethod
    def hf_rope_type_ok(cls, rope_type: str) -> bool:
        """An architecture that reads another RoPE scaling type itself says so here."""
        return False

    def hf_config(self) -> dict:
        """config.json keys for these args (transformers 4.x layout, which 5.x also reads)."""
        return {"vocab_size": self.vocab_size, "hidden_size": self.dim, "intermediate_size": self.ffn_dim,
                "num_hidden_layers": self.n_layers, "num_attention_heads": self.n_heads,
                "num_key_value_heads": self.n_kv_heads, "head_dim": self.head_dim,
                "max_position_embeddings": self.context_length, "rms_norm_eps": self.rms_eps,
                "rope_theta": self.rope_base, "tie_word_embeddings": bool(self.tied), "hidden_act": "silu",
                **({"num_experts": self.n_experts, "num_local_experts": self.n_experts,
                    "num_experts_per_tok": self.n_experts_used, "moe_intermediate_size": self.expert_ffn_dim,
                    "norm_topk_prob": self.expert_norm} if self.n_experts else {})}


def hf_layer_types(h, n_layers: int) -> list | None:
    """config.json's `layer_types` as sliding-window flags per layer (None where absent or short)."""
    types = h.get("layer_types")
    if isinstance(types, list) and len(types) >= n_layers:
        return [t == "sliding_attention" for t in types[:n_layers]]
    return None


def hf_rope_params(h, layer_type: str | None = None) -> dict:
    """RoPE settings of config.json in either layout: transformers 5's ``rope_parameters`` (per layer
    type) or the older ``rope_theta`` + ``rope_scaling`` (+ ``rope_local_base_freq`` of windowed layers)."""
    rp = h.get("rope_parameters")
    if isinstance(rp, dict):
        if layer_type is not None and isinstance(rp.get(layer_type), dict):
            rp = rp[layer_type]
        out = dict(rp)
    else:
        scaling = h.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            raise ModelFormatError(f"{h.where}: 'rope_scaling' should be an object, got {scaling!r}")
        out = dict(scaling)
        if layer_type == "sliding_attention":
            out = {"rope_theta": h.get("rope_local_base_freq", 10000.0)}
        else:
            out["rope_theta"] = h.get("rope_theta", 10000.0)
    out["rope_type"] = out.get("rope_type") or out.get("type") or "default"
    if not isinstance(out["rope_type"], str):
        raise ModelFormatError(f"{h.where}: RoPE scaling type should be a string, got {out['rope_type']!r}")
    theta = out.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ModelFormatError(f"{h.where}: 'rope_theta' should be a positive number, got {theta!r}")
    return out


def checked_llama3(h, rp: dict) -> dict:
    """Llama 3.1 RoPE scaling settings from config.json (`rp`, of source `h`), checked."""
    out = {"factor": h.get_float("factor", within=rp),
           "low_freq_factor": h.get_float("low_freq_factor", 1.0, within=rp),
           "high_freq_factor": h.get_float("high_freq_factor", 4.0, within=rp),
           "original_max_position_embeddings": h.get_float(
               "original_max_position_embeddings", h.get_float("original_context_length", 8192, within=rp), within=rp)}
    if not (out["factor"] > 0 and out["original_max_position_embeddings"] > 0
            and out["high_freq_factor"] > out["low_freq_factor"] > 0):
        raise ModelFormatError(f"{h.where}: llama3 RoPE scaling needs factor > 0, an original context > 0 and "
                               f"high_freq_factor > low_freq_factor > 0; got {out}")
    return out


def llama3_rope_factors(rp: dict, base: float, rope_dim: int) -> np.ndarray:
    """Llama 3.1 RoPE scaling as per-pair frequency divisors (llama.cpp's rope_freqs tensor)."""
    factor = float(rp["factor"])
    low, high = float(rp.get("low_freq_factor", 1.0)), float(rp.get("high_freq_factor", 4.0))
    old = float(rp.get("original_max_position_embeddings", rp.get("original_context_length", 8192)))
    freqs = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (old / wavelen - low) / (high - low)
    out = np.where(wavelen < old / high, 1.0,
                   np.where(wavelen > old / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)
