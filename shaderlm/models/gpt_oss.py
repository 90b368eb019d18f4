"""gpt-oss (llama.cpp arch "gpt-oss"; GptOssForCausalLM, model_type "gpt_oss"): OpenAI's open-weight
mixture of experts. How its layer differs from Llama's:

  attention: Q/K/V/O biases; a learned sink logit per head joins each softmax's denominator and weighs
      no value; layers alternate a sliding window (even layers) and full attention; NEOX RoPE pairs
      with YaRN scaling (below).
  FFN: every layer a mixture of experts. The router has a bias; a token takes the top-k experts by
      logit, weighted by the softmax over those k; each expert has biases and a clamped SwiGLU:
          g = min(Wg . x + bg, limit);  u = clamp(Wu . x + bu, -limit, limit)
          x += sum_j w_j * (Wd_j . (g * sigmoid(alpha * g) * (u + 1)) + bd_j)
  llama.cpp names the pre-FFN norm post_attention_norm (Transformer's ffn_norm).

YaRN ("NTK by parts"): pairs that turn more than beta_fast times over the original context keep their
frequency, pairs that turn fewer than beta_slow times are divided by the factor, a linear ramp between;
cos and sin are multiplied by an attention factor (0.1 ln(factor) + 1), which scales q and k alike, so
it is folded into the attention scale (its square). The ramp's ends are used as computed: gpt-oss's
config says "truncate": false (transformers and OpenAI's reference agree); llama.cpp floors / ceils
them whatever the file, so its logits differ a little from these.

Hugging Face stores the experts fused and transposed against a Linear: gate_up_proj (E, D, 2F) with
gate and up interleaved on the last axis, gate_up_proj_bias (E, 2F) likewise, down_proj (E, F, D).
They are read as llama.cpp's converter writes them: ffn_gate_exps / ffn_up_exps (E, F, D) and their
biases (E, F), ffn_down_exps (E, D, F) (hf_derived_tensors). A checkpoint whose experts are MXFP4
blocks (the official downloads) is read without dequantizing: the blocks become GGUF MXFP4 rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..formats.safetensors import FLOAT_DTYPES
from .args import ModelArgs, hf_layer_types, hf_rope_params
from .loading import HFDerived
from .transformer import Transformer

SWA_PERIOD = 2              # llama.cpp's default: every other layer windowed, the first included
SWIGLU_LIMIT, SWIGLU_ALPHA = 7.0, 1.702      # llama.cpp's constants (no GGUF keys)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor for a context `factor` (the multiplier of cos and sin)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(base: float, rope_dim: int, factor: float, orig_ctx: int, beta_fast: float, beta_slow: float,
                  truncate: bool) -> np.ndarray:
    """Radians per position per pair under YaRN: base's frequencies, divided by `factor` past a ramp
    between the pairs that turn beta_fast and beta_slow times over the original context."""
    i = np.arange(rope_dim // 2, dtype=np.float64)
    freq = base ** (-2.0 * i / rope_dim)

    def pair_turning(turns):           # the (fractional) pair that turns `turns` times over orig_ctx
        return rope_dim * math.log(orig_ctx / (turns * 2 * math.pi)) / (2 * math.log(base))
    lo, hi = pair_turning(beta_fast), pair_turning(beta_slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, rope_dim - 1)
    if lo == hi:
        hi += 0.001                    # as transformers: no division by zero
    ramp = np.clip((i - lo) / (hi - lo), 0.0, 1.0)         # 0: frequency kept, 1: divided by factor
    return freq / factor * ramp + freq * (1.0 - ramp)


@dataclass
class GptOssArgs(ModelArgs):
    rope_neox: bool = True
    attn_bias: bool = True
    rope_base: float = 150000.0
    yarn_factor: float = 1.0          # YaRN's context factor (1: plain RoPE)
    yarn_orig_ctx: int = 4096         # the original (pre-YaRN) context
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_truncate: bool = False       # the ramp's ends floored / ceiled (transformers' default when unset)
    yarn_attn_factor: float = 0.0     # cos/sin multiplier; 0: yarn_mscale(yarn_factor)
    swiglu_limit: float = SWIGLU_LIMIT
    swiglu_alpha: float = SWIGLU_ALPHA

    def __post_init__(self):
        super().__post_init__()
        if not self.yarn_attn_factor and self.yarn_factor > 0:        # else check() says why
            self.yarn_attn_factor = yarn_mscale(self.yarn_factor)
        if self.sliding_window and self.swa_layers is None:
            self.swa_layers = swa_pattern(SWA_PERIOD, self.n_layers)

    def check(self, where: str):
        super().check(where)
        finite = dict(yarn_factor=self.yarn_factor, yarn_attn_factor=self.yarn_attn_factor,
                      yarn_beta_fast=self.yarn_beta_fast, yarn_beta_slow=self.yarn_beta_slow,
                      swiglu_limit=self.swiglu_limit, swiglu_alpha=self.swiglu_alpha)
        bad = {k: v for k, v in finite.items() if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v))}
        if bad:
            raise ModelFormatError(f"{where}: {bad} should be finite and positive")
        if self.yarn_factor != 1.0 and not (isinstance(self.yarn_orig_ctx, int) and self.yarn_orig_ctx > 0):
            raise ModelFormatError(f"{where}: YaRN needs a positive original context, got {self.yarn_orig_ctx}")
        if self.yarn_attn_factor != 1.0 and self.rope_dim != self.head_dim:
            raise UnsupportedError(f"{where}: a YaRN attention factor with partial rotary dimensions "
                                   f"({self.rope_dim} of {self.head_dim}) is not supported")
        if not self.n_experts:
            raise ModelFormatError(f"{where}: gpt-oss needs its experts (expert_count / num_local_experts)")

    @classmethod
    def gguf_rope_type_ok(cls, rope_type):
        return rope_type == "yarn"

    @classmethod
    def hf_rope_type_ok(cls, rope_type):
        return rope_type == "yarn"

    @classmethod
    def gguf_fields(cls, f, a):
        out = super().gguf_fields(f, a)
        n = out["n_layers"]
        pattern = f.metadata.get(f"{a}.attention.sliding_window_pattern", SWA_PERIOD)
        if isinstance(pattern, (list, np.ndarray)):         # per-layer flags
            swa = [bool(x) for x in list(pattern)][:n]
        else:
            swa = swa_pattern(f.get_int(f"{a}.attention.sliding_window_pattern", SWA_PERIOD), n)
        out.update(sliding_window=f.get_int(f"{a}.attention.sliding_window", 0), swa_layers=swa)
        if f.get_str(f"{a}.rope.scaling.type", None) == "yarn":
            factor = f.get_float(f"{a}.rope.scaling.factor")
            out.update(yarn_factor=factor, yarn_orig_ctx=f.get_int(f"{a}.rope.scaling.original_context_length"),
                       yarn_beta_fast=f.get_float(f"{a}.rope.scaling.yarn_beta_fast", 32.0),
                       yarn_beta_slow=f.get_float(f"{a}.rope.scaling.yarn_beta_slow", 1.0),
                       # llama.cpp multiplies its own factor by the file's (default 1)
                       yarn_attn_factor=f.get_float(f"{a}.rope.scaling.yarn_attn_factor", 1.0) * yarn_mscale(factor))
        return out

    def write_gguf(self, w, arch):
        super().write_gguf(w, arch)
        import gguf
        if self.swiglu_limit != SWIGLU_LIMIT or self.swiglu_alpha != SWIGLU_ALPHA:
            raise UnsupportedError(f"swiglu limit {self.swiglu_limit} / alpha {self.swiglu_alpha}: a GGUF has no "
                                   f"keys for them (llama.cpp uses {SWIGLU_LIMIT} / {SWIGLU_ALPHA})")
        if self.sliding_window:
            w.add_sliding_window(int(self.sliding_window))
            if list(self.swa_layers) != swa_pattern(SWA_PERIOD, self.n_layers):
                w.add_array(f"{arch}.attention.sliding_window_pattern", [bool(x) for x in self.swa_layers])
        if self.yarn_factor != 1.0:
            if self.yarn_truncate:
                raise UnsupportedError("YaRN with truncated ramp ends (rope 'truncate': true, transformers' default "
                                       "when unset) has no GGUF key; gpt-oss's own config says false")
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(float(self.yarn_factor))
            w.add_rope_scaling_orig_ctx_len(int(self.yarn_orig_ctx))
            if (self.yarn_beta_fast, self.yarn_beta_slow) != (32.0, 1.0):
                w.add_rope_scaling_yarn_beta_fast(float(self.yarn_beta_fast))
                w.add_rope_scaling_yarn_beta_slow(float(self.yarn_beta_slow))
            own = self.yarn_attn_factor / yarn_mscale(self.yarn_factor)
            if abs(own - 1.0) > 1e-7:
                w.add_rope_scaling_yarn_attn_factor(float(own))

    @classmethod
    def hf_fields(cls, h):
        out, extra = super().hf_fields(h)
        rp = hf_rope_params(h)
        if rp["rope_type"] == "yarn":
            orig = h.get_int("original_max_position_embeddings", within=rp)
            factor = h.get_float("factor", None, within=rp) or out["context_length"] / orig
            mscale, mscale_all = (h.get_float(k, 0.0, within=rp) for k in ("mscale", "mscale_all_dim"))
            attn = h.get_float("attention_factor", None, within=rp)
            if attn is None:
                attn = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all) if mscale and mscale_all \
                    else yarn_mscale(factor)
            truncate = rp.get("truncate", True)
            if not isinstance(truncate, bool):
                raise ModelFormatError(f"{h.where}: rope 'truncate' should be true or false, got {truncate!r}")
            out.update(yarn_factor=factor, yarn_orig_ctx=orig, yarn_truncate=truncate, yarn_attn_factor=attn,
                       yarn_beta_fast=h.get_float("beta_fast", None, within=rp) or 32.0,
                       yarn_beta_slow=h.get_float("beta_slow", None, within=rp) or 1.0)
        out.update(swiglu_limit=h.get_float("swiglu_limit", SWIGLU_LIMIT),
                   swiglu_alpha=h.get_float("swiglu_alpha", SWIGLU_ALPHA))
        return out, extra

    @classmethod
    def hf_window(cls, h, n_layers):
        return h.get_int("sliding_window", 0), hf_layer_types(h, n_layers) or swa_pattern(SWA_PERIOD, n_layers)

    def hf_config(self):
        out = super().hf_config()
        for k in ("num_experts", "moe_intermediate_size", "norm_topk_prob"):
            out.pop(k, None)
        out.update({"intermediate_size": self.expert_ffn_dim, "attention_bias": True,
                    "sliding_window": self.sliding_window or None,
                    "layer_types": ["sliding_attention" if self.windowed(i) else "full_attention"
                                    for i in range(self.n_layers)],
                    "swiglu_limit": self.swiglu_limit, "swiglu_alpha": self.swiglu_alpha})
        if self.yarn_factor != 1.0:
            out["rope_scaling"] = {"rope_type": "yarn", "factor": self.yarn_factor,
                                   "original_max_position_embeddings": self.yarn_orig_ctx,
                                   "beta_fast": self.yarn_beta_fast, "beta_slow": self.yarn_beta_slow,
                                   "truncate": self.yarn_truncate, "attention_factor": self.yarn_attn_factor}
        return out


def swa_pattern(period: int, n_layers: int) -> list[bool]:
    """llama.cpp's sliding-window layers for a period: all but the last of each period (0: all)."""
    return [period == 0 or i % period < period - 1 for i in range(n_layers)]


# The harmony format, for files that carry no chat template: what the real template (which GGUF files
# and HF folders carry) renders for a plain conversation; it also renders tools, the reasoning effort
# and the analysis channel, which this one leaves out.
HARMONY = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: {{ strftime_now('%Y-%m-%d') }}\n\nReasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
    "{% for m in messages %}"
    "{% if m['role'] in ('system', 'developer') %}"
    "{{ '<|start|>developer<|message|># Instructions\n\n' + m['content'] + '\n\n<|end|>' }}"
    "{% elif m['role'] == 'assistant' %}"
    "{{ '<|start|>assistant<|channel|>final<|message|>' + m['content'] }}"
    "{{ '<|return|>' if loop.last and not add_generation_prompt else '<|end|>' }}"
    "{% else %}"
    "{{ '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}")


class GptOss(Transformer):
    gguf_arch = "gpt-oss"
    hf_architectures = ("GptOssForCausalLM",)
    hf_model_types = ("gpt_oss",)
    Args = GptOssArgs
    chat_template = HARMONY
    hf_names = {**{g: h for g, h in Transformer.hf_names.items() if g != "blk.{i}.ffn_norm.weight"},
                "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
                "blk.{i}.attn_output.bias": "model.layers.{i}.self_attn.o_proj.bias",
                "blk.{i}.attn_sinks.weight": "model.layers.{i}.self_attn.sinks",
                "blk.{i}.ffn_gate_inp.weight": "model.layers.{i}.mlp.router.weight",
                "blk.{i}.ffn_gate_inp.bias": "model.layers.{i}.mlp.router.bias",
                "blk.{i}.ffn_down_exps.bias": "model.layers.{i}.mlp.experts.down_proj_bias"}
    presets = {
        # a window of 8 that prompts go past, YaRN as the real one's
        "tiny": dict(n_experts=4, n_experts_used=2, expert_ffn_dim=64, ffn_dim=64, sliding_window=8,
                     yarn_factor=32.0, yarn_orig_ctx=4096),
        "gpt-oss-20b": dict(dim=2880, n_layers=24, n_heads=64, n_kv_heads=8, head_dim=64, ffn_dim=2880,
                            n_experts=32, n_experts_used=4, expert_ffn_dim=2880, vocab_size=201088,
                            context_length=131072, rope_base=150000.0, sliding_window=128, yarn_factor=32.0,
                            yarn_orig_ctx=4096, tokenizer="smollm2"),
    }

    @property
    def ffn_act(self):
        return ("oai", self.args.swiglu_limit, self.args.swiglu_alpha)

    # ---- tensors -------------------------------------------------------------------------------
    @classmethod
    def layer_specs(cls, a, p):
        out = []
        for name, shape in super().layer_specs(a, p):
            if name == p + "ffn_norm.weight":
                out += [(p + "attn_output.bias", (a.dim,)), (p + "attn_sinks.weight", (a.n_heads,)),
                        (p + "post_attention_norm.weight", (a.dim,))]
            else:
                out.append((name, shape))
        return out

    @classmethod
    def ffn_specs(cls, a, p):
        E, F = a.n_experts, a.expert_ffn_dim
        return super().ffn_specs(a, p) + [
            (p + "ffn_gate_inp.bias", (E,)), (p + "ffn_gate_exps.bias", (E, F)), (p + "ffn_up_exps.bias", (E, F)),
            (p + "ffn_down_exps.bias", (E, a.dim))]

    @classmethod
    def hf_derived_tensors(cls, folder, args) -> dict:
        """The experts' tensors under GGUF names, from the fused Hugging Face ones (the module's doc)."""
        out = {}
        E, F, D = args.n_experts, args.expert_ffn_dim, args.dim
        for i in range(args.n_layers):
            p, h = f"blk.{i}.", f"model.layers.{i}.mlp.experts."
            if h + "gate_up_proj_blocks" in folder.tensors:
                out.update(_mxfp4_experts(folder, p, h, E, F, D))
            else:
                gu = _float(folder, h + "gate_up_proj", (E, D, 2 * F))
                dn = _float(folder, h + "down_proj", (E, F, D))
                for j, part in enumerate(("gate", "up")):      # gate at even columns, up at odd
                    out[p + f"ffn_{part}_exps.weight"] = ((E, F, D), HFDerived.of(
                        gu, (E * F, D), lambda a, j=j: a.reshape(E, D, 2 * F)[..., j::2].transpose(0, 2, 1)))
                out[p + "ffn_down_exps.weight"] = ((E, D, F), HFDerived.of(
                    dn, (E * D, F), lambda a: a.reshape(E, F, D).transpose(0, 2, 1)))
            b = _float(folder, h + "gate_up_proj_bias", (E, 2 * F))
            for j, part in enumerate(("gate", "up")):
                out[p + f"ffn_{part}_exps.bias"] = ((E, F), HFDerived.of(
                    b, (E, F), lambda a, j=j: a.reshape(E, 2 * F)[:, j::2]))
        return out

    # ---- weights -------------------------------------------------------------------------------
    def vector(self, name, required=True):
        """The base layer asks for the pre-FFN norm as ffn_norm; llama.cpp names it post_attention_norm."""
        return super().vector(name.replace(".ffn_norm.", ".post_attention_norm."), required)

    def load_layer(self, i, p):
        L = super().load_layer(i, p)
        L.wo_bias = self.vector(p + "attn_output.bias")
        L.sinks = self.vector(p + "attn_sinks.weight")
        return L

    def load_ffn(self, L, p):
        super().load_ffn(L, p)
        L.router_bias = self.vector(p + "ffn_gate_inp.bias")
        L.experts_down_bias = self.vector(p + "ffn_down_exps.bias")          # (E, D): expert e's at e * D
        # each expert's [gate; up] biases together, as its rows are in experts_gate_up
        g, u = self.tensor(p + "ffn_gate_exps.bias"), self.tensor(p + "ffn_up_exps.bias")
        for t in (g, u):
            self._tick(t)
        E = self.args.n_experts
        vals = np.concatenate([np.asarray(t.dequantize(), np.float32).reshape(E, -1) for t in (g, u)], axis=1)
        buf = self.dev.upload(np.ascontiguousarray(vals).reshape(-1), label=p + "ffn_gate_up_exps.bias")
        self.weight_bytes += buf.size
        L.experts_gate_up_bias = buf
        self._release([g, u])

    # ---- the layer -----------------------------------------------------------------------------
    def rope_inv_freq(self, base=None, scale=None):
        a = self.args
        if a.yarn_factor == 1.0:
            return super().rope_inv_freq(base, scale)
        return yarn_inv_freq(a.rope_base if base is None else base, a.rope_dim, a.yarn_factor, a.yarn_orig_ctx,
                             a.yarn_beta_fast, a.yarn_beta_slow, a.yarn_truncate) / (2 * np.pi)

    def attention_params(self, i):
        """YaRN's factor multiplies q's and k's cos and sin: the scores by its square; the sinks."""
        p = super().attention_params(i)
        p["scale"] *= self.args.yarn_attn_factor ** 2
        p["sinks"] = self.layers[i].sinks
        return p

    def residual(self, i, block, w, inp, tt, next_norm=None, **mm):
        """x += Wo . attn + bo (the FFN, all experts, adds its own into x: Transformer.moe_ops)."""
        return self.matmul(w, inp, self.x, y_stride=self.args.dim, accumulate=True, bias=self.layers[i].wo_bias,
                           **mm)


def _float(folder, name: str, shape: tuple):
    """A float safetensors tensor of the folder, checked."""
    st = folder.tensors.get(name)
    if st is None:
        raise ModelFormatError(f"{folder.path}: required tensor {name} is missing")
    if st.dtype not in FLOAT_DTYPES:
        raise UnsupportedError(f"{folder.path}: tensor '{name}' has dtype {st.dtype}; shaderlm reads "
                               f"{', '.join(FLOAT_DTYPES)} (or MXFP4 blocks for the experts)")
    if tuple(st.shape) != shape:
        raise ModelFormatError(f"{folder.path}: tensor {name} has shape {tuple(st.shape)}, expected {shape} "
                               f"for this model's config")
    return st


def _mxfp4_experts(folder, p: str, h: str, E: int, F: int, D: int) -> dict:
    """The experts of a checkpoint quantized as OpenAI ships it: `_blocks` (E, rows, cols/32, 16) bytes
    of E2M1 pairs (element 2i in the low nibble of byte i) and `_scales` (E, rows, cols/32) E8M0 exponents,
    as GGUF MXFP4 blocks (exponent byte, then element i in the low nibble of byte i and i + 16 in the
    high one): the same codes and scale, reordered, no rounding."""
    out = {}
    for proj, rows, cols in (("gate_up_proj", 2 * F, D), ("down_proj", D, F)):
        nb = cols // 32
        blocks, scales = (folder.tensors.get(h + proj + s) for s in ("_blocks", "_scales"))
        for st, s, shape in ((blocks, "_blocks", (E, rows, nb, 16)), (scales, "_scales", (E, rows, nb))):
            if st is None:
                raise ModelFormatError(f"{folder.path}: required tensor {h + proj + s} is missing")
            if st.dtype != "U8" or tuple(st.shape) != shape:
                raise ModelFormatError(f"{folder.path}: tensor {h + proj + s} is {st.dtype} {tuple(st.shape)}, "
                                       f"expected U8 {shape}")

        def gguf_blocks(sel, blocks=blocks, scales=scales, rows=rows, nb=nb):
            b = np.asarray(blocks.data).reshape(E, rows, nb, 16)[:, sel]
            e = np.asarray(scales.data).reshape(E, rows, nb)[:, sel]
            lo, hi = b & 0x0F, b >> 4                       # elements 2i, 2i + 1
            vals = np.stack([lo, hi], axis=-1).reshape(*b.shape[:-1], 32)
            qs = vals[..., :16] | (vals[..., 16:] << 4)      # GGUF: i low, i + 16 high
            return np.concatenate([e[..., None], qs], axis=-1).astype(np.uint8).reshape(-1)
        if proj == "gate_up_proj":
            for j, part in enumerate(("gate", "up")):        # rows interleaved: gate even, up odd
                out[p + f"ffn_{part}_exps.weight"] = ((E, F, D), HFDerived(
                    "MXFP4", (E * F, D), lambda j=j, g=gguf_blocks: g(slice(j, None, 2))))
        else:
            out[p + "ffn_down_exps.weight"] = ((E, D, F), HFDerived(
                "MXFP4", (E * D, F), lambda g=gguf_blocks: g(slice(None))))
    return out
