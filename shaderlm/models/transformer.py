"""What every decoder-only architecture shares: its weights on the GPU, activation buffers, the KV
cache, the layer builder with the decode fusions, and the plans (dispatch lists) for prefill, decode
and the LM head. An architecture file subclasses Transformer and overrides only where its layer
differs (hooks: load_layer, qkv_weights, gate_up_weights, norm_input, residual, attention_params,
rope_inv_freq, head_ops).

It is also what the engine drives (engine/runner.py's Runner): prefill, record and submit decode
batches, read back token ids, set the sampler, logits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..errors import ContextFullError, DeviceError, ModelFormatError, UnsupportedError
from ..gpu.device import READBACK, STORAGE, UNIFORM, pack_params
from ..gpu.plan import Plan
from ..gpu.tuner import tune_plan
from ..kernels import gemm, ops
from ..kernels.gemv import can_pair, expert_gemv, gemv_pair
from ..kernels.quants import QUANT_TYPES
from ..kernels.tuning import open_cache
from ..kernels.weights import GPUWeight, concat_rows, dequantize, upload_weight
from .args import ModelArgs

PREFILL_TT = 8          # tokens per pass of the GEMV kernel in short prefills
PREFILL_CHUNK = 512     # prompt tokens a prefill pass at most: larger GEMMs fill a big GPU better
SHORT_PREFILL = 16      # up to this many tokens, prefill uses the GEMV kernel instead of a tiled GEMM
SUPPORTED_TYPES = tuple(QUANT_TYPES)


@dataclass
class Build:
    """What a plan is built for: the layer builder reads it while it makes the plan's dispatches."""
    tt: int                         # tokens a pass: PREFILL_TT in prefill, 1 in a decode step
    state: object                   # the State buffer its kernels read
    tokens: object                  # the token buffer
    k: list                         # the KV cache per layer
    v: list
    logits: object                  # where the LM head writes, `logit_stride` floats a row
    logit_stride: int
    tiled: bool = True              # prefill: the tiled GEMM (else matmul.wgsl's few-token passes)
    batch: int = 0                  # a serving step: its rows, each a token of its own sequence
    gemm: bool = False              # a serving step whose matmuls are int8 GEMMs over its rows (gemm.py)
    paging: ops.Paging | None = None   # a paged KV cache (serving)


class Transformer:
    """A model on the GPU. Class attributes an architecture sets (models/__init__.py registers it):
    gguf_arch (general.architecture), hf_architectures / hf_model_types (config.json), Args (its
    ModelArgs), presets (synthetic shapes by name), hf_names (GGUF name -> Hugging Face name)."""
    gguf_arch: str = ""
    hf_architectures: tuple = ()
    hf_model_types: tuple = ()
    Args = ModelArgs
    presets: dict = {}
    chat_template: str | None = None   # for files that carry none (else ChatML)
    gelu = False                  # the gated FFN's activation: GELU-tanh, else SiLU
    ffn_act = None                # the experts' gated activation where another (gemv.act_defines: gpt-oss's)
    embed_scale = 1.0             # token embeddings are multiplied by this (a function of args where it varies)

    def __init__(self, dev, source, args: ModelArgs, *, ctx: int | None = None, batch: int | None = None,
                 progress=None, fuse: bool | None = None, int8_act: bool | None = None, x24: bool = True,
                 attention_shape=None, batch_tokens: int | None = None, exact_prefill: bool | None = None, q8_tile=None,
                 gemm_rows: int | None = None):
        self.dev = dev
        self.source = source
        self.args = args
        self.ctx = int(min(ctx or args.context_length, args.context_length) or 2048)
        self.batch = max(1, min(batch or PREFILL_CHUNK, self.ctx))
        self.progress = progress
        self.fuse = (not dev.is_cpu) if fuse is None else fuse   # decode fusions: see `fused_decode`
        # decode GEMVs with int8 x where the type allows (not exact; as llama.cpp's), else 24-bit x
        self.int8_act = (not dev.is_cpu) if int8_act is None else int8_act
        self.x24 = x24
        # prompts through the int8 GEMM (not exact; faster where integer dots are) or the f32 one
        self.int8_prefill = (not dev.is_cpu) if exact_prefill is None else not exact_prefill
        self.q8_tile = q8_tile
        self.attention_shape = attention_shape
        # a batched decode GEMV's tokens a workgroup, at most: sharing a weight load pays with int8 x, whose
        # digits are few registers, and loses with 24-bit x (docs/performance.md)
        self.batch_tokens = batch_tokens or (2 if self.int8_act else 1)
        self.gemm_rows = gemm_rows          # serving steps taking the int8 GEMMs (models/serving.py)
        self.tuning = None                  # tune()'s arguments where loading tuned (Serving tunes its batches with them)
        self.weight_bytes = 0
        self._sampling = None
        self._staging: list = []
        self._slot = 0
        self._alloc()
        self.load_weights()
        self._build_plans()

    # ---- the tensors a model of these args has -------------------------------------------------
    @classmethod
    def tensor_specs(cls, a: ModelArgs) -> list[tuple[str, tuple]]:
        """(GGUF name, numpy shape) of every tensor, in llama.cpp's file order."""
        out = [("token_embd.weight", (a.vocab_size, a.dim))]
        for i in range(a.n_layers):
            out += cls.layer_specs(a, f"blk.{i}.")
        out.append(("output_norm.weight", (a.dim,)))
        if not a.tied:
            out.append(("output.weight", (a.vocab_size, a.dim)))
        return out

    @classmethod
    def layer_specs(cls, a: ModelArgs, p: str) -> list[tuple[str, tuple]]:
        out = [(p + "attn_norm.weight", (a.dim,)), (p + "attn_q.weight", (a.q_dim, a.dim)),
               (p + "attn_k.weight", (a.kv_dim, a.dim)), (p + "attn_v.weight", (a.kv_dim, a.dim))]
        if a.attn_bias:
            out += [(p + "attn_q.bias", (a.q_dim,)), (p + "attn_k.bias", (a.kv_dim,)), (p + "attn_v.bias", (a.kv_dim,))]
        if a.qk_norm:
            out += [(p + "attn_q_norm.weight", (a.head_dim,)), (p + "attn_k_norm.weight", (a.head_dim,))]
        out += [(p + "attn_output.weight", (a.dim, a.q_dim)), (p + "ffn_norm.weight", (a.dim,))]
        return out + cls.ffn_specs(a, p)

    @classmethod
    def ffn_specs(cls, a: ModelArgs, p: str) -> list[tuple[str, tuple]]:
        """The FFN's tensors: gate, up, down; or a mixture of experts' router and stacked experts."""
        if a.n_experts:
            E, F = a.n_experts, a.expert_ffn_dim
            return [(p + "ffn_gate_inp.weight", (E, a.dim)), (p + "ffn_gate_exps.weight", (E, F, a.dim)),
                    (p + "ffn_up_exps.weight", (E, F, a.dim)), (p + "ffn_down_exps.weight", (E, a.dim, F))]
        return [(p + "ffn_gate.weight", (a.ffn_dim, a.dim)), (p + "ffn_up.weight", (a.ffn_dim, a.dim)),
                (p + "ffn_down.weight", (a.dim, a.ffn_dim))]

    hf_names = {
        "token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
        "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
        "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
        "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
        "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
        "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
        "blk.{i}.attn_q.bias": "model.layers.{i}.self_attn.q_proj.bias",
        "blk.{i}.attn_k.bias": "model.layers.{i}.self_attn.k_proj.bias",
        "blk.{i}.attn_v.bias": "model.layers.{i}.self_attn.v_proj.bias",
        "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
        "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
        "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
        "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
        "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
        "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    }

    # a mixture of experts' stacked tensors: GGUF name -> the Hugging Face name of expert {j}'s part
    hf_expert_names: dict = {}

    @classmethod
    def hf_derived_tensors(cls, folder, args: ModelArgs) -> dict:
        """Hook: tensors a Hugging Face folder holds in another layout (gpt-oss's fused experts): GGUF
        name -> (shape, loading.HFDerived rows made from the folder's tensors)."""
        return {}

    hf_norm_offset = 0.0          # Hugging Face stores RMSNorm weights minus this (where a norm scales by 1 + w)

    @staticmethod
    def gguf_permuted_heads(name: str, args: ModelArgs) -> int | None:
        """Hook: the heads whose rows llama.cpp's converter reorders in tensor `name` (None: none)."""
        return None

    # ---- weights -------------------------------------------------------------------------------
    def tensor(self, name: str, required: bool = True):
        t = self.source.tensors.get(name)
        if t is None:
            if required:
                raise ModelFormatError(f"{self.source.path}: tensor {name} is missing")
            return None
        return t

    def _tick(self, t):
        if self.progress is not None:
            self.progress(t.n_bytes)

    def matrix(self, name: str, *fused: str, required=True) -> GPUWeight | None:
        """A weight matrix; with `fused` names, rows of several tensors stacked into one (same type)."""
        names = (name,) + fused
        ts = [self.tensor(n, required) for n in names]
        if any(t is None for t in ts):
            return None
        for t in ts:
            self._tick(t)
        if len(ts) == 1:
            w = upload_weight(self.dev, name, ts[0].type, ts[0].shape, ts[0].data)
        else:
            w = concat_rows(self.dev, "+".join(names), [(t.name, t.type, t.shape, t.data) for t in ts])
        return self._uploaded(w, ts)

    def _uploaded(self, w, ts):
        self.weight_bytes += w.nbytes
        w.int8_x = self.int8_act and w.qtype.int8_dot
        w.x24 = self.x24
        self._release(ts)
        return w

    def expert_gate_up(self, p: str):
        """Layer p's experts' gate and up matrices as one, each expert's [gate; up] rows together (what
        the experts' GLU GEMV reads)."""
        g, u = self.tensor(p + "ffn_gate_exps.weight"), self.tensor(p + "ffn_up_exps.weight")
        if g.type != u.type:
            raise UnsupportedError(f"{self.source.path}: {g.name} is {g.type} and {u.name} {u.type}: experts' gate "
                                   f"and up of different types are not supported")
        for t in (g, u):
            self._tick(t)
        E, F, D = g.shape
        gd, ud = (np.asarray(t.data).reshape(E, -1) for t in (g, u))
        parts = [(g.name, g.type, (F, D), x) for e in range(E) for x in (gd[e], ud[e])]
        return self._uploaded(concat_rows(self.dev, p + "ffn_gate_up_exps", parts), [g, u])

    def _release(self, ts):
        """Tell the source the tensors are on the GPU (an HF folder drops their mapped pages)."""
        for t in ts:
            self.source.release(t)

    def vector(self, name: str, required=True):
        """A 1-D tensor (norm weight, bias) as f32 on the GPU."""
        t = self.tensor(name, required)
        if t is None:
            return None
        self._tick(t)
        if t.type in ("F32", "F16", "BF16"):        # exact on the host, any length
            vals = t.dequantize().reshape(-1)
        else:                                       # quantized blocks: the GPU's decoder
            vals = dequantize(self.dev, upload_weight(self.dev, name, t.type, (1, int(np.prod(t.shape))),
                                                      t.data)).reshape(-1)
        buf = self.dev.upload(np.ascontiguousarray(vals, np.float32), label=name)
        self.weight_bytes += buf.size
        self._release([t])
        return buf

    def fusable(self, *names) -> bool:
        ts = [self.tensor(n, False) for n in names]
        return all(t is not None for t in ts) and len({t.type for t in ts}) == 1

    def load_weights(self):
        self.tok_embd = self.matrix("token_embd.weight")
        self.out_norm = self.vector("output_norm.weight")
        self.lm_head = self.matrix("output.weight", required=False) or self.tok_embd
        self.layers = [self.load_layer(i, f"blk.{i}.") for i in range(self.args.n_layers)]

    def quantized_matmuls(self) -> bool:
        """Whether every matmul weight (the layers' matrices and the LM head) has an int8 kernel."""
        ws = [self.lm_head]
        for L in self.layers:
            for v in vars(L).values():
                ws += [w for w in (v if isinstance(v, list) else [v]) if isinstance(w, GPUWeight)]
        return all(w.qtype.blocked for w in ws)

    def load_layer(self, i: int, p: str) -> SimpleNamespace:
        """Hook: layer i's weights (names prefixed by p). Q, K, V (and gate, up) read the same input:
        they are stacked into one matrix where they share a type."""
        L = SimpleNamespace(attn_norm=self.vector(p + "attn_norm.weight"), ffn_norm=self.vector(p + "ffn_norm.weight"))
        L.qkv = self.qkv_weights(p)
        bias = [self.vector(p + n, required=False) for n in ("attn_q.bias", "attn_k.bias", "attn_v.bias")]
        L.qkv_bias = self._bias_cat(bias) if any(b is not None for b in bias) else None
        L.wo = self.matrix(p + "attn_output.weight")
        self.load_ffn(L, p)
        L.q_norm = self.vector(p + "attn_q_norm.weight", required=False)
        L.k_norm = self.vector(p + "attn_k_norm.weight", required=False)
        if (L.q_norm is None) != (L.k_norm is None):
            raise ModelFormatError(f"{self.source.path}: layer {i} has only one of attn_q_norm / attn_k_norm")
        return L

    def load_ffn(self, L, p: str):
        """Hook: the FFN's weights: gate/up and down, or a mixture of experts' router and experts."""
        L.experts_gate_up = L.router_bias = L.experts_gate_up_bias = L.experts_down_bias = None
        if self.args.n_experts:
            L.router = self.matrix(p + "ffn_gate_inp.weight")
            L.experts_gate_up = self.expert_gate_up(p)
            L.experts_down = self.matrix(p + "ffn_down_exps.weight")
            for w in (L.experts_gate_up, L.experts_down):
                if len(w.chunks) != 1:
                    raise DeviceError(f"{w.name}: {w.nbytes:,} bytes, over {self.dev.name}'s binding limit of "
                                      f"{self.dev.max_binding:,}: experts split over bindings are not supported")
        else:
            L.gate_up = self.gate_up_weights(p)
            L.down = self.matrix(p + "ffn_down.weight")

    def qkv_weights(self, p: str) -> list:
        """Hook: layer p's Q, K, V projections (rows stacked in that order)."""
        q, k, v = p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"
        if self.fusable(q, k, v):
            return [self.matrix(q, k, v)]
        if self.fusable(q, k):              # Q4_K_M: q, k in Q4_K, v in Q6_K
            return [self.matrix(q, k), self.matrix(v)]
        return [self.matrix(q), self.matrix(k), self.matrix(v)]

    def gate_up_weights(self, p: str) -> list:
        """Hook: layer p's gate and up projections ([gate; up] rows), stacked when they share a type."""
        gate, up = p + "ffn_gate.weight", p + "ffn_up.weight"
        return [self.matrix(gate, up)] if self.fusable(gate, up) else [self.matrix(gate), self.matrix(up)]

    def _bias_cat(self, parts):
        """Q, K, V biases as one vector over the qkv rows (zeros where a bias is absent)."""
        a = self.args
        vals = [np.zeros(s, np.float32) if b is None else self.dev.read(b, np.float32)[:s]
                for b, s in zip(parts, (a.q_dim, a.kv_dim, a.kv_dim))]
        return self.dev.upload(np.concatenate(vals), label="qkv_bias")

    # ---- buffers -------------------------------------------------------------------------------
    def _alloc(self):
        a, B, dev = self.args, self.batch, self.dev
        f4 = 4
        kv_bytes = self.ctx * a.kv_dim * 2
        if kv_bytes > dev.max_binding:          # checked before anything is allocated
            raise DeviceError(f"a context of {self.ctx} tokens needs {kv_bytes:,} bytes of KV cache per layer, over "
                              f"{dev.name}'s {dev.max_binding:,}-byte binding limit: use a smaller --ctx-size")
        self.state = dev.buffer(32, STORAGE, "state")        # kernels/state.wgsl's State
        self.tokens = dev.buffer(4 * (self.ctx + 1), STORAGE, "tokens")
        self.x = dev.buffer(B * a.dim * f4, label="x")
        self.xn = dev.buffer(B * a.dim * f4, label="xn")
        self.qkv = dev.buffer(B * (a.q_dim + 2 * a.kv_dim) * f4, label="qkv")
        self.v_new = dev.buffer(B * a.kv_dim * f4, label="v_new")     # a decode batch's V rows (v_apart)
        self.attn = dev.buffer(B * a.q_dim * f4, label="attn")
        if not a.n_experts:                 # a mixture of experts has its own (below)
            self.gu = dev.buffer(B * 2 * a.ffn_dim * f4, label="gate_up")
            self.h = dev.buffer(B * a.ffn_dim * f4, label="ffn_h")
        else:
            K = a.n_experts_used
            self.router_logits = dev.buffer(B * a.n_experts * f4, label="router_logits")
            self.expert_ids = dev.buffer(B * K * 4, label="expert_ids")
            self.expert_wts = dev.buffer(B * K * f4, label="expert_weights")
            self.expert_h = dev.buffer(B * K * a.expert_ffn_dim * f4, label="expert_h")
            if self.int8_prefill:           # the grouped GEMMs' per-pair outputs (grouped_expert_ops)
                self.expert_gu = dev.buffer(B * K * 2 * a.expert_ffn_dim * f4, label="expert_gate_up")
                self.expert_y = dev.buffer(B * K * a.dim * f4, label="expert_y")
        # logits for up to logit_rows tokens at once (one binding must hold them)
        self.logit_rows = max(1, min(B, dev.max_binding // (a.vocab_size * f4)))
        self.logit_buf = dev.buffer(self.logit_rows * a.vocab_size * f4, label="logits")
        try:
            self.k_cache = [dev.buffer(kv_bytes, label=f"k{i}") for i in range(a.n_layers)]
            self.v_cache = [dev.buffer(kv_bytes, label=f"v{i}") for i in range(a.n_layers)]
        except DeviceError as e:
            raise DeviceError(f"a context of {self.ctx} tokens needs {2 * a.n_layers * kv_bytes / 2**30:.2f} GiB of KV "
                              f"cache ({a.n_layers} layers), which {dev.name} could not allocate: use a smaller "
                              f"--ctx-size") from e
        # greedy until set_sampling: plans run before that (the tuner) then time the real sampler
        self.sample_params = dev.upload(pack_params(*ops.sample_params(a.vocab_size)), UNIFORM, "sample_params")
        self.inv_freq = dev.upload(self.rope_inv_freq().astype(np.float32), label="inv_freq")

    def rope_inv_freq(self, base: float | None = None, scale: float | None = None) -> np.ndarray:
        """Hook: rotations per position per pair, in turns (divided by 2 pi): what rope_store reads.
        base/scale default to the args' (windowed layers may have their own)."""
        a = self.args
        base = a.rope_base if base is None else base
        scale = a.rope_scale if scale is None else scale
        i = np.arange(a.rope_dim // 2, dtype=np.float64)
        freq = base ** (-2.0 * i / a.rope_dim) / scale
        factors = self.source.tensors.get("rope_freqs.weight")
        if factors is not None:
            freq = freq / np.frombuffer(factors.data, np.float32)[: len(freq)].astype(np.float64)
        return freq / (2 * np.pi)

    # ---- one layer -----------------------------------------------------------------------------
    def layer_ops(self, i: int, tt: int) -> list:
        """One layer's dispatches for tt tokens a pass. The fused decode step (one token, `fuse`)
        folds the norms into the matmuls, RoPE and the KV store into attention and the activation
        into the gate/up matmul: 5 dispatches a layer when Q/K/V and gate/up each share a type."""
        a, L = self.args, self.layers[i]
        step = tt == 1 and self.fuse                # the decode step's attention (RoPE and the KV store in it)
        decode = step and not self.b.gemm           # the decode GEMVs, with the norms and activation in them
        moe = L.experts_gate_up is not None
        ffn_fused = decode and (moe or len(L.gate_up) == 1 and len(L.gate_up[0].chunks) == 1)
        out = []
        src, norm = self.norm_input(i, "attn", decode, out)
        v_apart = self.v_apart(i, step)
        out += self.qkv_projection(i, tt, src, norm, decode, v_apart)
        if L.q_norm is not None and not ops.fused_head_norm(self.dev, step):
            out.append(ops.head_norm(self.dev, self.qkv, L.q_norm, L.k_norm, self.b.state, n_heads=a.n_heads,
                                     n_kv=a.n_kv_heads, head_dim=a.head_dim, eps=a.rms_eps))
        o_x = self.o_input_blocks(i, step)
        out += self.attention_ops(i, step, o_x, v_apart)
        out += self.residual(i, "attn", L.wo, self.attn, tt, next_norm=None if ffn_fused else L.ffn_norm,
                             **({"x_ready": True} if o_x else {}))
        src, norm = self.norm_input(i, "ffn", ffn_fused, out)
        if moe:
            return out + self.moe_ops(i, src, norm)
        # where down is an int8 GEMM, its x pass rounds the gated activation of gu's rows itself
        glu_in = not ffn_fused and self.int8_gemms([L.down])
        out += self.ffn_ops(i, tt, src, norm, ffn_fused, activation=not glu_in)
        inp, mm = (self.gu, dict(glu_input=True, gelu=self.gelu)) if glu_in else (self.h, {})
        last = decode or i + 1 == a.n_layers
        out += self.residual(i, "ffn", L.down, inp, tt, next_norm=None if last else self.layers[i + 1].attn_norm, **mm)
        return out

    def int8_gemms(self, ws) -> bool:
        """Whether the plan being built runs the matmuls over `ws` as int8 GEMMs: their x pass
        (gemm.quantize_q8) can then fold in the RMSNorm before them or the activation after gate/up."""
        b = self.b
        tt, tiled = (b.batch, True) if b.gemm else (b.tt, b.tiled)      # as self.matmul passes them
        return all(ops.int8_gemm(w, tt=tt, tiled=tiled, int8=self.int8_prefill) for w in ws)

    def norm_input(self, i: int, block: str, fused: bool, out: list):
        """Hook: the input of layer i's `block` ("attn" or "ffn") and the norm kwargs its matmuls take:
        x with the RMSNorm folded into them where fused (or where they are int8 GEMMs), else xn written by
        an rmsnorm dispatch."""
        a, L = self.args, self.layers[i]
        w = getattr(L, f"{block}_norm")
        users = L.qkv if block == "attn" else None if L.experts_gate_up is not None else L.gate_up
        if fused or (users and self.int8_gemms(users)):          # the GEMV, or the GEMMs' x pass, norms x
            return self.x, dict(norm=w, eps=a.rms_eps)
        out.append(ops.rmsnorm(self.dev, self.x, w, self.xn, self.b.state, dim=a.dim, eps=a.rms_eps))
        return self.xn, {}

    def qkv_projection(self, i: int, tt: int, src, norm: dict, decode: bool, v_apart: bool = False) -> list:
        """Layer i's Q/K/V matmuls into the qkv rows (a shared bias is indexed by output row). In decode,
        Q+K of one type and V of another (Q4_K_M) run as one dispatch (gemv_pair). With `v_apart`, V's
        GEMM writes v_new instead."""
        a, L = self.args, self.layers[i]
        parts, qkv_w = L.qkv, a.q_dim + 2 * a.kv_dim
        if decode and len(parts) == 2 and L.qkv_bias is None and can_pair(*parts):
            return gemv_pair(self.dev, parts[0], parts[1], src, self.qkv, y_stride=qkv_w, batch=self.b.batch,
                             nt_max=self.batch_tokens, **norm)
        return self.matmuls_over(parts, src, self.qkv, y_stride=qkv_w, bias=L.qkv_bias,
                                 last_apart=(self.v_new, a.kv_dim) if v_apart else None, **norm)

    def v_apart(self, i: int, step: bool) -> bool:
        """Whether a decode batch's V GEMM writes v_new rather than qkv's V rows, where V is a GEMM of its
        own: wgpu puts a barrier between two dispatches that bind one buffer writable, so apart from
        Q+K's it can run beside them (the decode attention then reads V there: ops.takes_v_apart)."""
        a, L, b = self.args, self.layers[i], self.b
        return bool(b.gemm and len(L.qkv) > 1 and L.qkv[-1].rows == a.kv_dim and L.qkv_bias is None
                    and ops.takes_v_apart(self.dev, step))

    def matmuls_over(self, ws, x, y, last_apart=None, **kw) -> list:
        """The matmuls of `ws` over one x into consecutive rows of y from row 0 (Q/K/V, gate/up split by
        type): where they are int8 GEMMs, x is rounded once for all of them (x_after, gemm.shared_run).
        `last_apart`: (buffer, row stride) that the last one writes instead, from row 0."""
        out, row0, prev, run = [], 0, None, gemm.shared_run(ws)
        for n, w in enumerate(ws):
            if last_apart and n == len(ws) - 1:
                y, row0, kw = last_apart[0], 0, {**kw, "y_stride": last_apart[1]}
            out += self.matmul(w, x, y, row0=row0, x_after=prev, x_run=run, **kw)
            row0, prev = row0 + w.rows, w
        return out

    def matmul(self, w, x, y, **kw) -> list:
        """ops.matmul for the plan being built (its tokens a pass, state and batch)."""
        b = self.b
        if b.gemm:                                  # the batch's rows as a prompt's tokens
            return ops.matmul(self.dev, w, x, y, b.state, **{**kw, "tt": b.batch}, int8=self.int8_prefill,
                              q8_tile=self.q8_tile, max_tokens=b.batch, decode_batch=True)
        kw.setdefault("tt", b.tt)
        return ops.matmul(self.dev, w, x, y, b.state, tiled=b.tiled, int8=self.int8_prefill, q8_tile=self.q8_tile,
                          max_tokens=self.batch, batch=b.batch, nt_max=self.batch_tokens, **kw)

    def o_input_blocks(self, i: int, step: bool):
        """A decode batch's o projection input as its int8 GEMM's x blocks, which the decode attention
        then writes beside its output (ops.attention's q8_out; a dispatch fewer a layer): the buffers and
        run length (gemm.decode_batch_x), or None."""
        a, L, b = self.args, self.layers[i], self.b
        if not (b.gemm and self.int8_gemms([L.wo]) and ops.rounds_attention_output(
                self.dev, step, a.n_heads, a.head_dim, self.attention_shape)):
            return None
        return gemm.decode_batch_x(self.dev, L.wo, b.batch, self.q8_tile)

    def attention_params(self, i: int) -> dict:
        """Hook: layer i's attention scale, sliding window (0: none), logit softcap and RoPE table."""
        a = self.args
        return dict(scale=1.0 / math.sqrt(a.head_dim), window=a.sliding_window if a.windowed(i) else 0,
                    softcap=0.0, inv_freq=self.inv_freq)

    def attention_ops(self, i: int, decode: bool, o_x=None, v_apart: bool = False) -> list:
        """RoPE on q and k, the new K/V into the cache, and causal GQA attention over it: one dispatch
        in the fused decode step, two otherwise. `o_x`: o_input_blocks', the output also rounded there;
        `v_apart`: the new V rows from v_new (qkv_projection's)."""
        a, dev, b = self.args, self.dev, self.b
        p = self.attention_params(i)
        inv_freq = p.pop("inv_freq")
        attn = dict(n_heads=a.n_heads, n_kv=a.n_kv_heads, head_dim=a.head_dim, paging=b.paging, **p)
        if decode:
            L = self.layers[i]
            hn = (L.q_norm, L.k_norm, a.rms_eps) if L.q_norm is not None and ops.fused_head_norm(dev, decode) else None
            return [ops.attention(dev, self.qkv, b.k[i], b.v[i], self.attn, b.state, **attn, inv_freq=inv_freq,
                                  rope_dim=a.rope_dim, neox=a.rope_neox, shape=self.attention_shape, batch=b.batch,
                                  head_norm=hn, q8_out=o_x, v_apart=self.v_new if v_apart else None)]
        return [ops.rope_store(dev, self.qkv, inv_freq, b.k[i], b.v[i], b.state, n_heads=a.n_heads,
                               n_kv=a.n_kv_heads, head_dim=a.head_dim, rope_dim=a.rope_dim, neox=a.rope_neox,
                               paging=b.paging),
                ops.attention(dev, self.qkv, b.k[i], b.v[i], self.attn, b.state, tiled=b.tt > 1, **attn)]

    def residual(self, i: int, block: str, w, inp, tt: int, next_norm=None, **mm) -> list:
        """Hook: x += w . inp, the output of layer i's `block`. `next_norm` is the norm the next block
        applies to x where it runs as its own dispatch (an architecture may fold it in here). `mm`: the
        matmul's input options (glu_input: inp is gate/up rows, their activation computed on the way)."""
        return self.matmul(w, inp, self.x, y_stride=self.args.dim, accumulate=True, **mm)

    def ffn_ops(self, i: int, tt: int, src, norm: dict, fused: bool, activation: bool = True) -> list:
        """The gated FFN's gate/up matmuls and activation into h: one GEMV in the fused decode step.
        Without `activation`, gate/up's rows stay in gu (the down GEMM computes it)."""
        a, gu = self.args, self.layers[i].gate_up
        if fused:
            return self.matmul(gu[0], src, self.h, tt=1, y_stride=a.ffn_dim, glu=True, gelu=self.gelu, **norm)
        out = self.matmuls_over(gu, src, self.gu, y_stride=2 * a.ffn_dim, **norm)
        if not activation:
            return out
        return out + [ops.glu(self.dev, self.gu, self.h, self.b.state, ffn=a.ffn_dim, gelu=self.gelu)]

    def moe_ops(self, i: int, src, norm: dict) -> list:
        """A mixture of experts' FFN, added into x: the router's logits, each token's top-k experts
        and their weights (all on the GPU), the picked experts' gate/up GEMV with the activation, and
        their down GEMV summed by weight into x. Only the picked experts' rows are read."""
        a, L, b, dev = self.args, self.layers[i], self.b, self.dev
        E, K = a.n_experts, a.n_experts_used
        # the router (E rows): a prompt batch's on the f32 tiled GEMM (its input is xn there), else the
        # decode GEMV (a prompt's, a token a grid z, read the weights again for every token)
        grouped = self.grouped_experts(L)
        out = self.matmul(L.router, src, self.router_logits, tt=b.tt if grouped else 1, y_stride=E,
                          bias=L.router_bias, **norm)
        out.append(ops.moe_route(dev, self.router_logits, self.expert_ids, self.expert_wts, experts=E, k=K,
                                 renorm=a.expert_norm, batch=b.batch))
        if grouped:
            return out + self.grouped_expert_ops(i)
        out += expert_gemv(dev, L.experts_gate_up, E, src, self.expert_h, self.expert_ids, slots=K,
                           y_stride=a.expert_ffn_dim, glu=True, gelu=self.gelu, act=self.ffn_act,
                           bias=L.experts_gate_up_bias,
                           batch=b.batch, **norm)
        return out + expert_gemv(dev, L.experts_down, E, self.expert_h, self.x, self.expert_ids, slots=K,
                                 y_stride=a.dim, weights=self.expert_wts, bias=L.experts_down_bias, batch=b.batch)

    def grouped_experts(self, L) -> bool:
        """A prompt batch's experts run as grouped int8 GEMMs (each picked expert read once per tile of
        the tokens that picked it) where prompts take the int8 GEMM; else every (token, expert) pair
        runs the decode GEMV (exact f32 activations, as the f32 prefill)."""
        b = self.b
        return (b.tt > 1 and b.tiled and self.int8_prefill and not b.batch
                and all(w.qtype.blocked and w.cols % 32 == 0 for w in (L.experts_gate_up, L.experts_down)))

    def grouped_expert_ops(self, i: int) -> list:
        """The experts of a prompt batch on the grouped int8 GEMM (kernels/gemm.py expert_matmul_q8):
        gate/up rows of every (token, expert) pair, the activation, down rows of every pair, and the
        pairs summed by weight into x (x is normed into xn: a prompt's FFN input)."""
        a, L, dev, st = self.args, self.layers[i], self.dev, self.b.state
        E, K, F = a.n_experts, a.n_experts_used, a.expert_ffn_dim
        kw = dict(slots=K, max_tokens=self.batch)
        group, groups = gemm.expert_groups(dev, self.expert_ids, st, experts=E, **kw)    # once for both GEMMs
        out = [group] + gemm.expert_matmul_q8(dev, L.experts_gate_up, E, self.xn, self.expert_gu, st, groups,
                                              per_pair_x=False, y_stride=2 * F, bias=L.experts_gate_up_bias, **kw)
        out.append(ops.glu(dev, self.expert_gu, self.expert_h, st, ffn=F, gelu=self.gelu, act=self.ffn_act,
                           rows_per_token=K))
        out += gemm.expert_matmul_q8(dev, L.experts_down, E, self.expert_h, self.expert_y, st, groups,
                                     per_pair_x=True, y_stride=a.dim, **kw)
        return out + [ops.moe_combine(dev, self.expert_y, self.expert_wts, self.x, st, dim=a.dim, slots=K,
                                      ids=self.expert_ids, bias=L.experts_down_bias)]

    # ---- plans ---------------------------------------------------------------------------------
    def head_ops(self, tt: int, decode: bool = False, gather=None) -> list:
        """Hook: final norm + LM head over batch rows [st.out_row0, st.n). In decode (one token a
        sequence, from row 0) the norm is folded into the LM-head matmul. One row outside a serving
        batch (a prompt's last token): the normed row goes to xn's first and the decode GEMV takes it;
        a serving step's rows (from row 0) each take the decode GEMV as that token would alone.
        `gather` (with tt 1): (a buffer of x rows, rows): those rows normed into xn's first, each then
        a row of the decode GEMV (a prompt pass's sequences' last tokens)."""
        a, b = self.args, self.b
        if decode:
            return self.matmul(self.lm_head, self.x, b.logits, tt=1, y_stride=b.logit_stride, norm=self.out_norm,
                               eps=a.rms_eps)
        norm = ops.rmsnorm(self.dev, self.x, self.out_norm, self.xn, b.state, dim=a.dim, eps=a.rms_eps,
                           from_state_row=gather is None, gather=gather)
        if tt == 1:
            rows = gather[1] if gather else b.batch or 1
            return [norm, *ops.matmul(self.dev, self.lm_head, self.xn, b.logits, b.state, tt=1,
                                      y_stride=b.logit_stride, batch=rows, nt_max=self.batch_tokens)]
        return [norm, *self.matmul(self.lm_head, self.xn, b.logits, tt=tt, y_stride=b.logit_stride, from_state_row=True)]

    def body(self, build: Build) -> list:
        """The embedding and every layer's dispatches for `build`."""
        self.b = build
        out = ops.embed(self.dev, self.tok_embd, build.tokens, self.x, build.state, scale=self.embed_scale,
                        paging=build.paging)
        for i in range(self.args.n_layers):
            out += self.layer_ops(i, build.tt)
        return out

    def _build_plans(self):
        dev, V = self.dev, self.args.vocab_size
        common = dict(state=self.state, tokens=self.tokens, k=self.k_cache, v=self.v_cache, logits=self.logit_buf,
                      logit_stride=V)
        long_body = self.body(Build(PREFILL_TT, **common))
        # with the int8 GEMM, short prompts take it too: a token's prefill then does not depend on its
        # prompt's length, and matches the serving engine's (always tiled)
        short_body = long_body if self.int8_prefill else self.body(Build(PREFILL_TT, tiled=False, **common))
        decode_body = self.body(Build(1, **common))
        sampler = ops.sample(dev, self.logit_buf, self.tokens, self.state, self.sample_params)
        head = self.head_ops(1)
        self.plan_prefill = {False: Plan(dev, long_body, "prefill"),                 # layers only
                             True: Plan(dev, short_body, "prefill-short")}
        self.plan_prefill_sample = {False: Plan(dev, long_body + head + sampler, "prefill+sample"),
                                    True: Plan(dev, short_body + head + sampler, "prefill-short+sample")}
        self.plan_decode = Plan(dev, decode_body + self.head_ops(1, decode=self.fuse) + sampler, "decode")
        self.plan_logits = Plan(dev, long_body + self.head_ops(PREFILL_TT), "logits")

    def prefill_plan(self, n: int, sample: bool) -> Plan:
        plans = self.plan_prefill_sample if sample else self.plan_prefill
        return plans[n <= SHORT_PREFILL]

    def set_state(self, pos: int, n: int, out_row0: int):
        self.dev.write(self.state, np.array([pos, n, pos, out_row0, 0, 0, 0, 0], np.uint32))

    def decode_bytes(self) -> int:
        """Weight bytes one decode step reads (every matrix once, plus norms)."""
        return int(sum(d.bytes for d in self.plan_decode.dispatches))

    def tune(self, cache_dir=None, force=False, reps=5, log=None) -> list:
        """Tune the decode step's kernel shapes, then the prompt GEMMs' tiles, for this adapter (those
        not cached yet; all with `force`) and keep them in the adapter's cache. Steps are timed from
        position 64 (or mid-context) on, never past the context's end; prompts as a pass of `batch`
        tokens from position 0. Every plan is rebuilt if a prompt's tile was tuned."""
        cache, pos0 = open_cache(self.dev, cache_dir), min(self.ctx // 2, 64)
        report = tune_plan(self.dev, self.plan_decode, cache, force=force, reps=reps, log=log,
                           reset=lambda: self.set_state(pos0, 1, 0), max_repeat=max(1, min(64, self.ctx - 1 - pos0)))
        prompt = tune_plan(self.dev, self.plan_prefill[False], cache, force=force, reps=reps, log=log,
                           reset=lambda: self.set_state(0, self.batch, 0), max_repeat=1, n=self.batch)
        if prompt:
            self._build_plans()
        return report + prompt

    # ---- what the engine drives (engine/runner.py) ---------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    @property
    def context_length(self) -> int:
        return self.args.context_length

    def set_sampling(self, temperature=0.0, top_k=0, top_p=1.0, seed=0):
        key = (temperature, top_k, top_p, seed)
        if key != self._sampling:
            vals = ops.sample_params(self.args.vocab_size, temperature, top_k, top_p, seed)
            self.dev.write(self.sample_params, pack_params(*vals))
            self._sampling = key

    def write_tokens(self, pos: int, ids):
        self.dev.write(self.tokens, np.asarray(ids, np.uint32), offset=4 * pos)

    def read_tokens(self, pos: int, n: int) -> list[int]:
        return self.dev.read(self.tokens, np.uint32, offset=4 * pos, size=4 * n).tolist()

    def prefill(self, ids, pos0: int, sample: bool) -> int:
        """Feed `ids` at positions pos0.. in chunks of `batch` tokens, the last one sampling the next
        token (at pos0 + len(ids)) where `sample`. Returns the submits it took."""
        B = self.batch
        self.write_tokens(pos0, ids)
        submits = 0
        for s in range(0, len(ids), B):
            n = min(B, len(ids) - s)
            with_sample = s + n == len(ids) and sample
            self.set_state(pos0 + s, n, n - 1 if with_sample else 0)
            self.prefill_plan(n, with_sample).run(n)
            submits += 1
        return submits

    def prepare_decode(self, max_tokens: int, slots: int):
        """Readback buffers for `slots` decode batches of up to `max_tokens` tokens, used in turn."""
        self._staging = [self.dev.buffer(4 * max_tokens, READBACK, "token readback") for _ in range(slots)]

    def record_decode(self, pos: int, k: int):
        """A recorded batch feeding the token at `pos` and sampling k more, their ids copied to the
        next readback buffer. The state write is queued now and lands after whatever is already
        submitted, right before this batch."""
        self._slot = (self._slot + 1) % len(self._staging)
        staging = self._staging[self._slot]
        self.set_state(pos, 1, 0)
        copy = lambda enc: enc.copy_buffer_to_buffer(self.tokens, 4 * (pos + 1), staging, 0, 4 * k)  # noqa: E731
        return SimpleNamespace(cb=self.plan_decode.record(1, repeat=k, then=copy), staging=staging, k=k, index=None)

    def submit_decode(self, batch):
        batch.index = self.dev.submit([batch.cb])

    def decoded_tokens(self, batch) -> list[int]:
        """The token ids of a submitted batch, once the GPU has written them."""
        return np.frombuffer(self.dev.read_after(batch.staging, batch.index, 4 * batch.k), np.uint32).tolist()

    def logits(self, ids) -> np.ndarray:
        """Logits for every position of `ids` (a fresh sequence from position 0), shape (len, vocab)."""
        V = self.args.vocab_size
        if len(ids) > self.ctx:
            raise ContextFullError(f"{len(ids)} tokens do not fit the context of {self.ctx}")
        self.write_tokens(0, ids)
        out = np.empty((len(ids), V), np.float32)
        R = self.logit_rows
        for s in range(0, len(ids), R):
            n = min(R, len(ids) - s)
            self.set_state(s, n, 0)
            self.plan_logits.run(n)
            out[s:s + n] = self.dev.read(self.logit_buf, np.float32, 0, n * V * 4).reshape(n, V)
        return out
