"""What every decoder-only architecture shares: weights on the GPU, activation buffers, KV cache, and
the plans (dispatch lists) for prefill, decode and the LM head. An architecture file subclasses
Transformer and describes one layer in `layer_ops`."""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError
from ..gpu.device import STORAGE, UNIFORM, pack_params
from ..gpu.plan import Plan
from ..gpu.weights import GPUWeight, concat_rows, upload_weight
from ..kernels import ops
from .config import ModelConfig

PREFILL_TT = 8          # tokens per pass of the GEMV kernel in short prefills
SHORT_PREFILL = 16      # up to this many tokens, prefill uses the GEMV kernel instead of the 64x64 GEMM


class Transformer:
    def __init__(self, dev, gguf, config: ModelConfig, *, ctx: int | None = None, batch: int = 256,
                 progress=None, fuse: bool | None = None, int8_act: bool = False):
        self.dev = dev
        self.gguf = gguf
        self.cfg = config
        self.ctx = int(min(ctx or config.context_length, config.context_length) or 2048)
        self.batch = max(1, min(batch, self.ctx))
        self.progress = progress
        self.fuse = dev.prefer_fused if fuse is None else fuse     # decode fusions (see Device)
        self.int8_act = int8_act      # decode GEMVs with int8 x where the type allows (not exact)
        self.weights: dict[str, GPUWeight] = {}
        self.weight_bytes = 0
        self._alloc()
        self._load_weights()
        self._build_plans()

    # ---- weights -------------------------------------------------------------------------------
    def tensor(self, name: str, required: bool = True):
        t = self.gguf.tensors.get(name)
        if t is None and required:
            raise ModelFormatError(f"{self.gguf.path}: tensor {name} is missing")
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
        self.weight_bytes += w.nbytes
        w.int8_x = self.int8_act and w.qtype.int8_dot
        self._release(ts)
        return w

    def _release(self, ts):
        """Tell the source the tensors are on the GPU (an HF folder drops their mapped pages)."""
        for t in ts:
            self.gguf.release(t)

    def vector(self, name: str, required=True):
        """A 1-D tensor (norm weight, bias) as f32 on the GPU."""
        t = self.tensor(name, required)
        if t is None:
            return None
        self._tick(t)
        w = upload_weight(self.dev, name, t.type, (1, int(np.prod(t.shape))), t.data)
        vals = ops.dequantize(self.dev, w).reshape(-1) if t.type != "F32" else \
            np.frombuffer(t.data, np.float32)
        buf = self.dev.upload(np.ascontiguousarray(vals, np.float32), label=name)
        self.weight_bytes += buf.size
        self._release([t])
        return buf

    def fusable(self, *names) -> bool:
        ts = [self.tensor(n, False) for n in names]
        return all(t is not None for t in ts) and len({t.type for t in ts}) == 1

    # ---- buffers -------------------------------------------------------------------------------
    def _alloc(self):
        c, B, dev = self.cfg, self.batch, self.dev
        f4 = 4
        self.state = dev.buffer(16, STORAGE, "state")
        self.tokens = dev.buffer(4 * (self.ctx + 1), STORAGE, "tokens")
        self.x = dev.buffer(B * c.dim * f4, label="x")
        self.xn = dev.buffer(B * c.dim * f4, label="xn")
        self.qkv = dev.buffer(B * (c.q_dim + 2 * c.kv_dim) * f4, label="qkv")
        self.attn = dev.buffer(B * c.q_dim * f4, label="attn")
        self.gu = dev.buffer(B * 2 * c.ffn_dim * f4, label="gate_up")
        self.h = dev.buffer(B * c.ffn_dim * f4, label="ffn_h")
        # logits for up to logit_rows tokens at once (one binding must hold them)
        self.logit_rows = max(1, min(B, dev.max_binding // (c.vocab_size * f4)))
        self.logits = dev.buffer(self.logit_rows * c.vocab_size * f4, label="logits")
        kv_bytes = self.ctx * c.kv_dim * 2
        if kv_bytes > dev.max_binding:
            raise ModelFormatError(f"context {self.ctx} needs {kv_bytes} bytes of KV cache per layer, over "
                                   f"this adapter's {dev.max_binding}-byte binding limit: use a smaller --ctx")
        self.k_cache = [dev.buffer(kv_bytes, label=f"k{i}") for i in range(c.n_layers)]
        self.v_cache = [dev.buffer(kv_bytes, label=f"v{i}") for i in range(c.n_layers)]
        # greedy until a Generator sets its own: plans run before that (the tuner, bench/kernel_chain.py)
        # then time the real sampler, not one over a vocabulary of 0 (which skipped its pass)
        self.sample_params = dev.upload(pack_params(*ops.sample_params(c.vocab_size)), UNIFORM, "sample_params")
        self.inv_freq = dev.upload(self.rope_inv_freq().astype(np.float32), label="inv_freq")

    def rope_inv_freq(self, base: float | None = None, scale: float | None = None) -> np.ndarray:
        """Rotations per position per pair, in turns (divided by 2 pi): what rope_store reads.
        base/scale default to the config's (Gemma 3's local layers pass their own)."""
        c = self.cfg
        base = c.rope_base if base is None else base
        scale = c.rope_scale if scale is None else scale
        i = np.arange(c.rope_dim // 2, dtype=np.float64)
        freq = base ** (-2.0 * i / c.rope_dim) / scale
        factors = self.tensor("rope_freqs.weight", required=False)
        if factors is not None:
            freq = freq / np.frombuffer(factors.data, np.float32)[: len(freq)].astype(np.float64)
        return freq / (2 * np.pi)

    # ---- plans ---------------------------------------------------------------------------------
    def _load_weights(self):
        raise NotImplementedError

    def layer_ops(self, i: int, tt: int) -> list:
        raise NotImplementedError

    def head_ops(self, tt: int, decode: bool = False) -> list:
        """Final norm + LM head over batch rows [st.out_row0, st.n). In decode (one token, row 0)
        the norm is folded into the LM-head matmul."""
        c = self.cfg
        if decode:
            return ops.matmul(self.dev, self.lm_head, self.x, self.logits, self.state, tt=1,
                              y_stride=c.vocab_size, norm=self.out_norm, eps=c.rms_eps)
        return [ops.rmsnorm(self.dev, self.x, self.out_norm, self.xn, self.state, dim=c.dim, eps=c.rms_eps,
                            from_state_row=True),
                *ops.matmul(self.dev, self.lm_head, self.xn, self.logits, self.state, tt=tt,
                            y_stride=c.vocab_size, from_state_row=True)]

    def embed_ops(self) -> list:
        return ops.embed(self.dev, self.tok_embd, self.tokens, self.x, self.state,
                         scale=self.cfg.extra.get("embed_scale", 1.0))

    def _build_plans(self):
        dev = self.dev

        def body(tt, tiled=True):
            self.tiled = tiled
            out = self.embed_ops()
            for i in range(self.cfg.n_layers):
                out += self.layer_ops(i, tt)
            return out

        long_body, short_body, decode_body = body(PREFILL_TT), body(PREFILL_TT, tiled=False), body(1)
        self.tiled = True
        sampler = ops.sample(dev, self.logits, self.tokens, self.state, self.sample_params)
        head = self.head_ops(1)
        self.plan_prefill = {False: Plan(dev, long_body, "prefill"),                 # layers only
                             True: Plan(dev, short_body, "prefill-short")}
        self.plan_prefill_sample = {False: Plan(dev, long_body + head + [sampler], "prefill+sample"),
                                    True: Plan(dev, short_body + head + [sampler], "prefill-short+sample")}
        self.plan_decode = Plan(dev, decode_body + self.head_ops(1, decode=self.fuse) + [sampler], "decode")
        self.plan_logits = Plan(dev, long_body + self.head_ops(PREFILL_TT), "logits")

    def prefill_plan(self, n: int, sample: bool) -> Plan:
        plans = self.plan_prefill_sample if sample else self.plan_prefill
        return plans[n <= SHORT_PREFILL]

    def set_state(self, pos: int, n: int, out_row0: int):
        self.dev.write(self.state, np.array([pos, n, pos, out_row0], np.uint32))
