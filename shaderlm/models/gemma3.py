"""Gemma 3 (text; Gemma3ForCausalLM, and the text model of Gemma3ForConditionalGeneration).

How it differs from the Llama layer: embeddings scaled by sqrt(dim); per-head Q/K RMSNorm; the
attention scale from the config (query_pre_attn_scalar); RMSNorms after the attention and FFN blocks,
before the residual add; a GELU-tanh gated FFN; sliding-window layers with their own RoPE base (no
scaling) beside global ones; optional logit softcaps.

Per layer: x += postnorm_a(Wo . attn(rope(headnorm(Wqkv . norm(x)))));
           x += postnorm_f(Wdown . (gelu(Wgate . norm(x)) * Wup . norm(x))).
Norm weights are used as llama.cpp's converter stores them, with Gemma's +1 already added; a
Hugging Face folder's get the +1 as they load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..kernels import ops
from .args import ModelArgs, hf_layer_types, hf_rope_params
from .transformer import Transformer

SWA_PATTERN = 6            # llama.cpp: every 6th layer is global, the other five use the sliding window
LOCAL_ROPE_BASE = 10000.0  # llama.cpp's RoPE base for the windowed layers (no GGUF key)


@dataclass
class Gemma3Args(ModelArgs):
    rms_eps: float = 1e-6
    rope_neox: bool = True
    qk_norm: bool = True
    tied: bool = True
    rope_base_local: float = LOCAL_ROPE_BASE
    attn_scale: float = 0.0               # 0: 1 / sqrt(head_dim)
    attn_logit_softcap: float = 0.0
    final_logit_softcap: float = 0.0
    hf_rope_layer_type: ClassVar[str | None] = "full_attention"

    def __post_init__(self):
        super().__post_init__()
        if not self.attn_scale and self.head_dim > 0 and self.n_heads > 0 and self.dim > 0:   # else check() says why
            self.attn_scale = self.llama_cpp_attn_scale()
        if self.sliding_window and self.swa_layers is None:
            self.swa_layers = [i % SWA_PATTERN < SWA_PATTERN - 1 for i in range(self.n_layers)]

    def check(self, where: str):
        super().check(where)
        finite = dict(attn_scale=self.attn_scale, rope_base_local=self.rope_base_local)
        bad = {k: v for k, v in finite.items() if not (v > 0 and math.isfinite(v))}
        caps = dict(attn_logit_softcap=self.attn_logit_softcap, final_logit_softcap=self.final_logit_softcap)
        bad.update({k: v for k, v in caps.items() if not (v >= 0 and math.isfinite(v))})
        if bad:
            raise ModelFormatError(f"{where}: {bad} should be finite and positive (a softcap may be 0: none)")

    def llama_cpp_attn_scale(self) -> float:
        """What llama.cpp derives (GGUF has no key): 1/sqrt(dim/n_heads) for Gemma 3 27B, else 1/sqrt(head_dim)."""
        return 1.0 / math.sqrt(self.dim / self.n_heads if self.n_layers == 62 else self.head_dim)

    @classmethod
    def gguf_fields(cls, f, a):
        out = super().gguf_fields(f, a)
        n = out["n_layers"]
        window = f.get_int(f"{a}.attention.sliding_window", 0)
        pattern = f.metadata.get(f"{a}.attention.sliding_window_pattern", SWA_PATTERN)
        if isinstance(pattern, (list, np.ndarray)):           # per-layer flags
            swa = [bool(x) for x in list(pattern)][:n]
        else:
            p = f.get_int(f"{a}.attention.sliding_window_pattern", SWA_PATTERN)
            swa = [bool(window) and p > 0 and (i % p) < p - 1 for i in range(n)]
        out.update(sliding_window=window, swa_layers=swa,
                   final_logit_softcap=f.get_float(f"{a}.final_logit_softcapping", 0.0),
                   attn_logit_softcap=f.get_float(f"{a}.attn_logit_softcapping", 0.0))
        return out

    def write_gguf(self, w, arch):
        super().write_gguf(w, arch)
        if self.rope_base_local != LOCAL_ROPE_BASE:
            raise UnsupportedError(f"Gemma 3 local RoPE base {self.rope_base_local} has no GGUF key (llama.cpp uses "
                                   f"{LOCAL_ROPE_BASE:g})")
        want = self.llama_cpp_attn_scale()
        if abs(self.attn_scale - want) > 1e-9 * want:
            raise UnsupportedError(f"query_pre_attn_scalar {self.attn_scale ** -2:g} is not what llama.cpp derives "
                                   f"for this shape")
        if self.sliding_window:
            w.add_sliding_window(int(self.sliding_window))
            if list(self.swa_layers) != [(i % SWA_PATTERN) < SWA_PATTERN - 1 for i in range(self.n_layers)]:
                w.add_array(f"{arch}.attention.sliding_window_pattern", [bool(x) for x in self.swa_layers])
        if self.final_logit_softcap:
            w.add_final_logit_softcapping(self.final_logit_softcap)
        if self.attn_logit_softcap:
            w.add_attn_logit_softcapping(self.attn_logit_softcap)

    @classmethod
    def hf_head_dim(cls, dim, n_heads):
        return 256

    @classmethod
    def hf_fields(cls, h):
        out, extra = super().hf_fields(h)
        local = hf_rope_params(h, "sliding_attention")
        if local["rope_type"] != "default":
            raise UnsupportedError(f"{h.path}: RoPE scaling on Gemma 3's sliding layers is not supported")
        caps = {k: h.get_float(k, 0.0) for k in ("final_logit_softcapping", "attn_logit_softcapping")}
        scalar = h.get_float("query_pre_attn_scalar", out["head_dim"])
        if not scalar > 0:
            raise ModelFormatError(f"{h.where}: 'query_pre_attn_scalar' should be positive, got {scalar}")
        out.update(rope_base_local=float(local["rope_theta"]), attn_scale=scalar ** -0.5,
                   final_logit_softcap=caps["final_logit_softcapping"],
                   attn_logit_softcap=caps["attn_logit_softcapping"])
        return out, extra

    @classmethod
    def hf_window(cls, h, n_layers):
        swa = hf_layer_types(h, n_layers)
        if swa is None:
            pattern = h.get_int("sliding_window_pattern", None) or h.get_int("_sliding_window_pattern", SWA_PATTERN)
            if pattern <= 0:
                raise ModelFormatError(f"{h.where}: 'sliding_window_pattern' should be positive, got {pattern}")
            swa = [(i + 1) % pattern != 0 for i in range(n_layers)]
        return h.get_int("sliding_window", 0), swa

    @classmethod
    def hf_activations(cls):
        return ("gelu_pytorch_tanh", "gelu_tanh")

    def hf_config(self):
        out = super().hf_config()
        del out["hidden_act"]
        out.update({"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": self.attn_scale ** -2,
                    "sliding_window": self.sliding_window, "rope_local_base_freq": self.rope_base_local,
                    "layer_types": ["sliding_attention" if s else "full_attention"
                                    for s in (self.swa_layers or [False] * self.n_layers)],
                    "final_logit_softcapping": self.final_logit_softcap or None,
                    "attn_logit_softcapping": self.attn_logit_softcap or None, "rope_scaling": None})
        return out


class Gemma3(Transformer):
    gguf_arch = "gemma3"
    hf_architectures = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")
    hf_model_types = ("gemma3_text", "gemma3")
    Args = Gemma3Args
    gelu = True
    hf_names = {**Transformer.hf_names,
                "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
                "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
                "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight"}
    hf_norm_offset = 1.0          # its RMSNorms scale by (1 + w)
    # for a file that carries no chat template: the format Google documents for Gemma 3 (the system
    # prompt folded into the first user turn, the assistant role called "model")
    chat_template = (
        "{{ bos_token }}"
        "{% set ns = namespace(prefix='') %}"
        "{% set msgs = messages %}"
        "{% if messages and messages[0]['role'] == 'system' %}"
        "{% set ns.prefix = messages[0]['content'] + '\n\n' %}{% set msgs = messages[1:] %}"
        "{% endif %}"
        "{% for m in msgs %}"
        "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' }}"
        "{% if loop.first %}{{ ns.prefix }}{% endif %}"
        "{{ m['content'] | trim }}{{ '<end_of_turn>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
    presets = {
        # 6 layers so that one of them is global
        "tiny": dict(n_layers=6, sliding_window=8, rope_base=1000000.0),
        "gemma3-270m": dict(dim=640, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256, ffn_dim=2048,
                            vocab_size=262144, context_length=32768, rope_base=1000000.0, sliding_window=512,
                            tokenizer="smollm2"),
    }

    @property
    def embed_scale(self):
        return math.sqrt(self.args.dim)

    @classmethod
    def layer_specs(cls, a, p):
        out = super().layer_specs(a, p)
        out.insert([n for n, _ in out].index(p + "ffn_norm.weight"), (p + "post_attention_norm.weight", (a.dim,)))
        return out + [(p + "post_ffw_norm.weight", (a.dim,))]

    def _alloc(self):
        super()._alloc()
        self.y = self.dev.buffer(self.batch * self.args.dim * 4, label="block_out")   # Wo / Wdown output, pre post-norm
        if any(self.args.swa_layers or ()):
            self.inv_freq_local = self.dev.upload(
                self.rope_inv_freq(base=self.args.rope_base_local, scale=1.0).astype(np.float32), label="inv_freq_local")
        else:
            self.inv_freq_local = self.inv_freq

    def load_layer(self, i, p):
        L = super().load_layer(i, p)
        L.post_attn_norm = self.vector(p + "post_attention_norm.weight")
        L.post_ffn_norm = self.vector(p + "post_ffw_norm.weight")
        return L

    def attention_params(self, i):
        a = self.args
        local = a.windowed(i)
        return dict(scale=a.attn_scale, window=a.sliding_window if local else 0, softcap=a.attn_logit_softcap,
                    inv_freq=self.inv_freq_local if local else self.inv_freq)

    def norm_input(self, i, block, fused, out):
        """Outside the fused decode step the previous block's add_rmsnorm already wrote this block's
        normed input into xn (see residual): only layer 0's attention runs its own rmsnorm."""
        if fused or (block == "attn" and i == 0):
            return super().norm_input(i, block, fused, out)
        return self.xn, {}

    def residual(self, i, block, w, inp, tt, next_norm=None, **mm):
        """The post-norm needs the whole block output: w writes to a scratch buffer (y) and add_rmsnorm
        adds its norm into x, and also writes the next block's normed input into xn (next_norm)."""
        a, L = self.args, self.layers[i]
        post = L.post_attn_norm if block == "attn" else L.post_ffn_norm
        nxt = {} if next_norm is None else dict(next_w=next_norm, xn=self.xn)
        return self.matmul(w, inp, self.y, y_stride=a.dim, **mm) + \
            [ops.add_rmsnorm(self.dev, self.y, post, self.x, self.b.state, dim=a.dim, eps=a.rms_eps, **nxt)]

    def head_ops(self, tt, decode=False, gather=None):
        out = super().head_ops(tt, decode, gather)
        if self.args.final_logit_softcap:
            out.append(ops.softcap(self.dev, self.b.logits, self.b.state, vocab=self.args.vocab_size,
                                   cap=self.args.final_logit_softcap, stride=self.b.logit_stride,
                                   rows=gather[1] if gather else 0))
        return out
