"""Hugging Face checkpoint folders: config.json + *.safetensors (+ index) + tokenizer.json.

:class:`HFCheckpoint` looks like a :class:`~shaderlm.formats.gguf.GGUFFile` to the architectures:
``.path``, ``.metadata``, ``.tensors`` (GGUF tensor names -> objects with ``.type``, ``.shape``,
``.n_bytes``, ``.data``), ``config()`` -> ModelConfig.  Tensor names are mapped to llama.cpp's in one
table (:data:`_LAYER_NAMES`), so a model class needs no HF-specific code.  What differs from a
llama.cpp GGUF is handled here:

* Q and K projections are used as Hugging Face stores them: their rotary pairs are (i, i + d/2)
  ("rotate_half", llama.cpp's NEOX mode), so ``rope_neox`` is true for every HF architecture; a GGUF
  written from the folder (:mod:`shaderlm.formats.convert`) permutes llama's rows as llama.cpp's
  converter does and is read back with interleaved pairs.
* Gemma's RMSNorm multiplies by (1 + w): its norm weights get the +1 here (small, made f32 in RAM).
* RoPE scaling from config.json: ``linear`` (a position divisor), ``llama3`` (Llama 3.1/3.2: per-pair
  frequency divisors, served as the ``rope_freqs.weight`` tensor llama.cpp's converter would write),
  ``longrope``/``su`` (Phi-3: ``rope_factors_long/short.weight`` and the attention factor).
* Weights stay in the safetensors memory maps (F32, F16, BF16 kept as they are); with ``quantize``
  each matrix is converted to Q8_0/Q4_K when the model reads it, a bounded chunk of rows at a time.
  :meth:`release` drops a tensor's pages from the resident set once it is on the GPU.
"""
from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..models.config import ModelConfig
from .quantize import QUANTIZE_TYPES, encode_rows, n_bytes, target_type
from .safetensors import FLOAT_DTYPES, SafetensorsFile
from .source import ModelSource

__all__ = ["HF_ARCHITECTURES", "HFCheckpoint", "HFTensor", "is_hf_folder", "hf_to_gguf_name"]

# config.json "architectures"[0] (or model_type) -> shaderlm arch (llama.cpp's name)
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3", "Gemma3ForConditionalGeneration": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3",
                "gemma3": "gemma3", "phi3": "phi3"}

# HF names (after the prefix normalisation below) -> GGUF names. {i} is the layer.
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",          # gemma3: post_attention_norm (below)
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",         # gemma3
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",   # gemma3
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",                # phi3
    "self_attn.q_norm.weight": "attn_q_norm.weight",               # qwen3, gemma3
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",                    # phi3: [gate; up] stacked
}
_GEMMA_LAYER_NAMES = dict(_LAYER_NAMES, **{"post_attention_layernorm.weight": "post_attention_norm.weight"})
# multimodal wrappers keep the text model under another prefix
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."))
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def hf_to_gguf_name(name: str, arch: str) -> str | None:
    """The GGUF name of an HF tensor (None for tensors shaderlm does not use, e.g. a vision tower)."""
    for a, b in _PREFIXES:
        if name.startswith(a):
            name = b + name[len(a):]
            break
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    m = _LAYER_RE.match(name)
    if m:
        table = _GEMMA_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
        g = table.get(m.group(2))
        return f"blk.{m.group(1)}.{g}" if g else None
    return None


def is_hf_folder(path) -> bool:
    return os.path.isdir(os.fspath(path))


class HFTensor:
    """A tensor under its GGUF name: from a safetensors map as it is, or produced on demand (norm + 1,
    quantized on load, RoPE factors).  ``data`` is a flat uint8 array of ``n_bytes`` bytes of ``type``."""

    def __init__(self, name, type_, shape, source=None, make=None):
        self.name, self.type, self.shape = name, type_, tuple(int(d) for d in shape)
        self.source = source            # (SafetensorsFile, SafeTensor) or None
        self._make = make
        self.n_bytes = n_bytes(self.shape, self.type)
        self.offset = 0

    @property
    def data(self) -> np.ndarray:
        if self._make is not None:
            return self._make()
        return self.source[1].data

    @property
    def n_elements(self) -> int:
        return int(math.prod(self.shape))

    def dequantize(self) -> np.ndarray:
        from .gguf import TensorInfo
        return TensorInfo(self.name, self.type, self.shape, self.n_bytes, self.data).dequantize()

    def __repr__(self):
        return f"HFTensor({self.name!r}, {self.type}, {self.shape})"


def _rows_f32(st):
    """A function (r0, r1) -> float32 rows of a 2-D SafeTensor, read from the map."""
    cols = st.shape[-1] if st.shape else 1
    per = {"F32": 4, "F16": 2, "BF16": 2}[st.dtype]

    def rows(r0, r1):
        raw = st.data[r0 * cols * per: r1 * cols * per]
        if st.dtype == "F32":
            return raw.view(np.float32)
        if st.dtype == "F16":
            return raw.view(np.float16).astype(np.float32)
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return rows


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing ({what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFormatError(f"{path}: cannot read {what}: {e}") from None


def _llama3_factors(rp: dict, base: float, rope_dim: int) -> np.ndarray:
    """Llama 3.1 RoPE scaling as per-pair frequency divisors (llama.cpp's rope_freqs)."""
    factor = float(rp["factor"])
    low, high = float(rp.get("low_freq_factor", 1.0)), float(rp.get("high_freq_factor", 4.0))
    old = float(rp.get("original_max_position_embeddings", 8192))
    freqs = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (old / wavelen - low) / (high - low)
    out = np.where(wavelen < old / high, 1.0,
                   np.where(wavelen > old / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


class HFCheckpoint(ModelSource):
    """A Hugging Face checkpoint folder (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike, quantize: str | None = None):
        self.path = os.fspath(folder)
        if not os.path.isdir(self.path):
            raise ModelFormatError(f"{self.path}: not a folder")
        cfg_path = os.path.join(self.path, "config.json")
        if not os.path.exists(cfg_path):
            raise ModelFormatError(f"{self.path}: no config.json: not a Hugging Face checkpoint folder "
                                   f"(give a .gguf file or a folder with config.json and *.safetensors)")
        raw_cfg = _read_json(cfg_path, "the model's config.json")
        if not isinstance(raw_cfg, dict):
            raise ModelFormatError(f"{cfg_path}: not a JSON object")
        self.hf_config = raw_cfg
        archs = raw_cfg.get("architectures") or []
        hf_arch = archs[0] if archs else raw_cfg.get("model_type")
        arch = HF_ARCHITECTURES.get(hf_arch) if archs else _MODEL_TYPES.get(str(hf_arch))
        if arch is None:
            raise UnsupportedError(f"{self.path}: architecture {hf_arch!r} is not supported; supported: "
                                   f"{', '.join(HF_ARCHITECTURES)}")
        self.arch = arch
        self.hf_arch = hf_arch
        # the text model's settings (multimodal Gemma 3 nests them)
        self.cfg = dict(raw_cfg.get("text_config") or raw_cfg) if "text_config" in raw_cfg else raw_cfg
        self.quantize = None
        if quantize:
            q = quantize.upper()
            if q not in QUANTIZE_TYPES:
                raise UnsupportedError(f"--quantize {quantize}: supported: {', '.join(t.lower() for t in QUANTIZE_TYPES)}")
            self.quantize = q
        self.files = self._open_files()
        self.tensors: dict[str, HFTensor] = {}
        self._map_tensors()
        self._config = self._make_config()
        self._add_rope_tensors()
        self.metadata: dict[str, Any] = {"general.architecture": arch, "general.name": self._config.name}

    # ---- files ------------------------------------------------------------------------------------
    def _open_files(self) -> list[SafetensorsFile]:
        idx = os.path.join(self.path, "model.safetensors.index.json")
        if os.path.exists(idx):
            index = _read_json(idx, "the safetensors index")
            wm = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(wm, dict) or not wm:
                raise ModelFormatError(f"{idx}: no 'weight_map'")
            names = sorted(set(wm.values()))
            for n in names:
                if not os.path.exists(os.path.join(self.path, n)):
                    raise ModelFormatError(f"{self.path}: {n} is listed in model.safetensors.index.json but missing")
        else:
            names = sorted(n for n in os.listdir(self.path) if n.endswith(".safetensors"))
            if not names:
                other = [n for n in os.listdir(self.path) if n.endswith((".bin", ".pt", ".pth"))]
                hint = f" (found {other[0]}: PyTorch pickles are not read; save with safe_serialization)" if other else ""
                raise ModelFormatError(f"{self.path}: no *.safetensors weights{hint}")
        return [SafetensorsFile(os.path.join(self.path, n)) for n in names]

    def _map_tensors(self) -> None:
        gemma = self.arch == "gemma3"
        for f in self.files:
            for hf_name, st in f.tensors.items():
                name = hf_to_gguf_name(hf_name, self.arch)
                if name is None:
                    continue
                if name in self.tensors:
                    raise ModelFormatError(f"{self.path}: tensor {hf_name} appears twice")
                if st.dtype not in FLOAT_DTYPES:
                    raise UnsupportedError(f"{f.path}: tensor '{hf_name}' has dtype {st.dtype}; shaderlm reads "
                                           f"{', '.join(FLOAT_DTYPES)} checkpoints")
                if gemma and name.endswith("norm.weight"):
                    self.tensors[name] = HFTensor(name, "F32", st.shape, (f, st),
                                                  make=lambda st=st: (st.to_numpy().astype(np.float32) + 1.0)
                                                  .reshape(-1).view(np.uint8))
                    continue
                qt = target_type(name, st.shape, self.quantize, st.dtype) if self.quantize else None
                if qt is not None and qt != st.dtype and len(st.shape) == 2:
                    self.tensors[name] = HFTensor(name, qt, st.shape, (f, st),
                                                  make=lambda st=st, qt=qt: self._convert(st, qt))
                else:
                    self.tensors[name] = HFTensor(name, st.dtype, st.shape, (f, st))
        if "token_embd.weight" not in self.tensors:
            raise ModelFormatError(f"{self.path}: tensor model.embed_tokens.weight is missing")

    @staticmethod
    def _convert(st, qt: str) -> np.ndarray:
        rows, cols = st.shape
        out = np.empty(n_bytes(st.shape, qt), np.uint8)
        pos = 0
        for chunk in encode_rows(_rows_f32(st), rows, cols, qt):
            out[pos:pos + chunk.size] = chunk.reshape(-1)
            pos += chunk.size
        return out

    def release(self, t) -> None:
        """Drop the source pages of tensor ``t`` (an HFTensor of this checkpoint) from RAM."""
        src = getattr(t, "source", None)
        if src is not None:
            src[0].release(src[1])

    # ---- config -----------------------------------------------------------------------------------
    def _num(self, key, default: Any = ModelFormatError):
        v = self.cfg.get(key)
        if v is None:
            if default is ModelFormatError:
                raise ModelFormatError(f"{self.path}/config.json: required key '{key}' is missing")
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelFormatError(f"{self.path}/config.json: '{key}' should be a number, got {v!r}")
        return v

    def _rope_params(self, layer_type: str | None = None) -> dict:
        """RoPE settings of config.json in either layout: transformers 5's ``rope_parameters`` (per
        layer type for Gemma 3) or the older ``rope_theta`` + ``rope_scaling`` (+ Gemma's
        ``rope_local_base_freq``)."""
        c = self.cfg
        rp = c.get("rope_parameters")
        if isinstance(rp, dict):
            if layer_type is not None and isinstance(rp.get(layer_type), dict):
                rp = rp[layer_type]
            out = dict(rp)
        else:
            out = dict(c.get("rope_scaling") or {})
            if layer_type == "sliding_attention":
                out = {"rope_theta": c.get("rope_local_base_freq", 10000.0)}
            else:
                out["rope_theta"] = c.get("rope_theta", 10000.0)
        out["rope_type"] = out.get("rope_type") or out.get("type") or "default"
        out.setdefault("rope_theta", 10000.0)
        return out

    def _make_config(self) -> ModelConfig:
        a, c, path = self.arch, self.cfg, self.path
        n_layers = int(self._num("num_hidden_layers"))
        dim = int(self._num("hidden_size"))
        n_heads = int(self._num("num_attention_heads"))
        n_kv = int(self._num("num_key_value_heads", n_heads))
        head_dim = int(self._num("head_dim", 256 if a == "gemma3" else dim // n_heads))
        if n_heads % n_kv:
            raise ModelFormatError(f"{path}/config.json: num_attention_heads ({n_heads}) is not a multiple of "
                                   f"num_key_value_heads ({n_kv})")
        ffn = int(self._num("intermediate_size"))
        emb = self.tensors["token_embd.weight"]
        vocab = emb.shape[0]
        if emb.shape[1] != dim:
            raise ModelFormatError(f"{path}: model.embed_tokens.weight has shape {emb.shape}, expected (vocab, "
                                   f"hidden_size={dim})")
        ctx = int(self._num("max_position_embeddings", 4096))
        eps = float(self._num("rms_norm_eps", 1e-6))
        act = c.get("hidden_act") or c.get("hidden_activation") or ("gelu_pytorch_tanh" if a == "gemma3" else "silu")
        if a != "gemma3" and act != "silu":
            raise UnsupportedError(f"{path}: activation {act!r} is not supported for {self.hf_arch} (silu)")
        if a == "gemma3" and act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise UnsupportedError(f"{path}: activation {act!r} is not supported for Gemma 3 (gelu_pytorch_tanh)")
        if c.get("mlp_bias"):
            raise UnsupportedError(f"{path}: MLP biases (mlp_bias: true) are not supported")

        layer_types = c.get("layer_types")
        rp = self._rope_params("full_attention" if a == "gemma3" else None)
        partial = float(rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)) or 1.0)
        rope_dim = int(head_dim * partial)
        rope_dim -= rope_dim % 2
        extra: dict[str, Any] = {
            "head_dim_v": head_dim,
            "tied_embeddings": "output.weight" not in self.tensors,
            "attn_bias": "blk.0.attn_q.bias" in self.tensors,
            "qk_norm": "blk.0.attn_q_norm.weight" in self.tensors,
            "ffn_act": "gelu_tanh" if a == "gemma3" else "silu",
            "source": "hf",
        }
        rope_scale = 1.0
        rtype = rp["rope_type"]
        self._rope_extra = None
        if rtype == "linear":
            rope_scale = float(rp.get("factor", 1.0)) or 1.0
        elif rtype == "llama3":
            self._rope_extra = {"rope_freqs.weight": _llama3_factors(rp, float(rp["rope_theta"]), rope_dim)}
            extra["rope_freqs"] = True
        elif rtype in ("longrope", "su") and a == "phi3":
            orig = int(rp.get("original_max_position_embeddings") or c.get("original_max_position_embeddings") or ctx)
            factor = rp.get("factor") or ctx / orig
            attn_factor = rp.get("attention_factor")
            if attn_factor is None:
                attn_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
            long_f = np.asarray(rp["long_factor"], np.float32)
            short_f = np.asarray(rp["short_factor"], np.float32)
            if long_f.shape != (rope_dim // 2,) or short_f.shape != (rope_dim // 2,):
                raise ModelFormatError(f"{path}/config.json: long_factor/short_factor need {rope_dim // 2} values")
            self._rope_extra = {"rope_factors_long.weight": long_f, "rope_factors_short.weight": short_f}
            extra["rope_factors"] = True
            extra["rope_scaling"] = {"type": "longrope", "original_context_length": orig,
                                     "attn_factor": float(attn_factor)}
        elif rtype != "default":
            raise UnsupportedError(f"{path}: RoPE scaling {rtype!r} is not supported for {self.hf_arch} "
                                   f"(supported: linear, llama3, and longrope for Phi-3)")

        window = c.get("sliding_window") or 0
        if a == "gemma3":
            if isinstance(layer_types, list) and len(layer_types) >= n_layers:
                swa = [t == "sliding_attention" for t in layer_types[:n_layers]]
            else:
                pattern = int(c.get("sliding_window_pattern") or c.get("_sliding_window_pattern") or 6)
                swa = [(i + 1) % pattern != 0 for i in range(n_layers)]
            local = self._rope_params("sliding_attention")
            if local["rope_type"] != "default":
                raise UnsupportedError(f"{path}: RoPE scaling on Gemma 3's sliding layers is not supported")
            extra.update({
                "sliding_window": int(window), "sliding_window_pattern": 0, "swa_layers": swa,
                "rope_base_local": float(local["rope_theta"]), "embed_scale": math.sqrt(dim),
                "attn_scale": float(c.get("query_pre_attn_scalar", head_dim)) ** -0.5, "post_norms": True,
            })
            for key, name in (("final_logit_softcapping", "final_logit_softcap"),
                              ("attn_logit_softcapping", "attn_logit_softcap")):
                if c.get(key):
                    extra[name] = float(c[key])
        else:
            use_window = window and (a in ("llama", "phi3") or c.get("use_sliding_window"))
            if use_window:
                extra["sliding_window"] = int(window)
                if isinstance(layer_types, list) and len(layer_types) >= n_layers and a in ("qwen2", "qwen3"):
                    extra["swa_layers"] = [t == "sliding_attention" for t in layer_types[:n_layers]]
        if a == "phi3":
            extra["fused_qkv"] = "blk.0.attn_qkv.weight" in self.tensors
            extra["fused_gate_up"] = "blk.0.ffn_gate.weight" not in self.tensors

        name = c.get("_name_or_path") or os.path.basename(os.path.normpath(path))
        return ModelConfig(arch=a, n_layers=n_layers, dim=dim, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
                           ffn_dim=ffn, vocab_size=vocab, context_length=ctx, rms_eps=eps,
                           rope_base=float(rp["rope_theta"]), rope_dim=rope_dim, rope_neox=True,
                           rope_scale=rope_scale, name=str(name), extra=extra)

    def _add_rope_tensors(self) -> None:
        for name, vals in (self._rope_extra or {}).items():
            self.tensors[name] = HFTensor(name, "F32", vals.shape, make=lambda v=vals: v.view(np.uint8))

    def config(self) -> ModelConfig:
        """The model's hyper-parameters (a fresh copy: callers may edit ``extra``)."""
        import copy
        cfg = copy.deepcopy(self._config)
        self._check_tensors(cfg)
        return cfg

    def _check_tensors(self, cfg: ModelConfig) -> None:
        need = ["output_norm.weight"]
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            need += [p + "attn_norm.weight", p + "ffn_norm.weight", p + "attn_output.weight", p + "ffn_down.weight"]
            need += [p + "attn_qkv.weight"] if cfg.extra.get("fused_qkv") else \
                [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
            need += [p + "ffn_up.weight"] if cfg.extra.get("fused_gate_up") else [p + "ffn_gate.weight", p + "ffn_up.weight"]
            if cfg.arch == "gemma3":
                need += [p + "post_attention_norm.weight", p + "post_ffw_norm.weight"]
        for n in need:
            if n not in self.tensors:
                raise ModelFormatError(f"{self.path}: required tensor {_hf_name_of(n, self.arch)} ({n}) is missing")

    # ---- tokenizer --------------------------------------------------------------------------------
    def tokenizer(self):
        from .hf_tokenizer import HFTokenizer
        return HFTokenizer.from_folder(self.path, self.cfg, self.arch, n_vocab=self._config.vocab_size)


def _hf_name_of(gguf_name: str, arch: str) -> str:
    """Best-effort HF name for a GGUF name (for error messages)."""
    table = _GEMMA_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    for k, v in _GLOBAL_NAMES.items():
        if v == gguf_name:
            return k
    m = re.match(r"^blk\.(\d+)\.(.+)$", gguf_name)
    if m:
        for k, v in table.items():
            if v == m.group(2):
                return f"model.layers.{m.group(1)}.{k}"
    return gguf_name
