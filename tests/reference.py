"""An independent NumPy reference forward pass for GGUF models (tests only).

Weights come straight from the file through gguf-py (``GGUFReader`` tensors + ``gguf.quants.dequantize``)
the activations are float64 between matrix products (which run in float32 BLAS: the dequantized weights
are exact in float32), so this is slow but simple: a yardstick for shaderlm's GPU kernels.
shaderlm.formats.gguf is used for the hyper-parameters only.

Covers llama (incl. Mistral/SmolLM2), qwen2 (q/k/v bias), qwen3 (per-head q/k RMSNorm) and gemma3
(embedding scale, q/k norm, post-norms, GELU-tanh, sliding-window layers with their own RoPE base).
RoPE is applied to the GGUF weights the way llama.cpp does it: pairs (2i, 2i+1) for llama ("normal"),
pairs (i, i + d/2) for qwen2/qwen3/gemma3 ("neox"); theta_i = pos / scale * base^(-2i/rope_dim) / rope_freqs[i].
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

import gguf
from gguf.constants import GGMLQuantizationType

from shaderlm.formats.gguf import GGUFFile, _FastReader
from shaderlm.models import for_gguf

__all__ = ["reference_logits", "reference_greedy", "ReferenceModel", "load_reference"]

_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3")


def _dequant(t) -> np.ndarray:
    """A gguf-py ReaderTensor as float32 in numpy order (GGUF dims reversed)."""
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    qtype = GGMLQuantizationType(int(t.tensor_type))
    data = np.asarray(t.data)
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        x = data.astype(np.float32)
    else:
        x = gguf.quants.dequantize(data, qtype).astype(np.float32, copy=False)
    return x.reshape(shape)


def _mm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T for a (out, in) weight: float32 BLAS (the weights are exact float32 values), float64 result."""
    return (x.astype(np.float32) @ w.T).astype(np.float64)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _rope(x: np.ndarray, pos: np.ndarray, rope_dim: int, base: float, scale: float, neox: bool,
          freq_div: np.ndarray | None) -> np.ndarray:
    """x: (n_tok, n_heads, head_dim); rotate the first rope_dim dims of each head."""
    half = rope_dim // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / rope_dim)
    if freq_div is not None:
        inv = inv / freq_div[:half]
    theta = (pos.astype(np.float64) / scale)[:, None] * inv[None, :]      # (n_tok, half)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    return out


@dataclass
class _Cache:
    k: list = field(default_factory=list)    # per layer: (n_pos, n_kv, head_dim)
    v: list = field(default_factory=list)
    n: int = 0


class ReferenceModel:
    def __init__(self, path: str):
        self.path = os.fspath(path)
        f = GGUFFile(self.path)
        self.arch = f.metadata["general.architecture"]       # the file's hyper-parameters, as shaderlm reads them
        if self.arch not in _ARCHS:
            raise NotImplementedError(f"reference forward pass covers {_ARCHS}, not {self.arch}")
        self.cfg = for_gguf(self.arch).Args.from_gguf(f, self.arch)
        st = self.cfg.rope_scaling.get("type")
        if st not in (None, "none", "linear"):
            raise NotImplementedError(f"reference: rope scaling type {st!r}")
        reader = _FastReader(self.path)          # a GGUFReader; tensors are parsed by upstream gguf-py
        self.w = {t.name: _dequant(t) for t in reader.tensors}
        del reader

    def _t(self, name: str) -> np.ndarray | None:
        return self.w.get(name)

    def new_cache(self) -> _Cache:
        c = _Cache()
        for _ in range(self.cfg.n_layers):
            c.k.append(np.zeros((0, self.cfg.n_kv_heads, self.cfg.head_dim)))
            c.v.append(np.zeros((0, self.cfg.n_kv_heads, self.cfg.head_dim)))
        return c

    def forward(self, token_ids, cache: _Cache | None = None, last_only: bool = False) -> np.ndarray:
        """Logits (n_new, vocab) float64 for the new tokens, appending their K/V to ``cache``."""
        cfg, w = self.cfg, self.w
        ids = np.asarray(list(token_ids), dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("token_ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {cfg.vocab_size})")
        cache = cache if cache is not None else self.new_cache()
        n, start = ids.size, cache.n
        pos = np.arange(start, start + n)
        gemma = self.arch == "gemma3"
        hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
        hdv = hd
        group = nh // nkv
        eps = cfg.rms_eps
        freq_div = w.get("rope_freqs.weight")
        scale_q = cfg.attn_scale if gemma else 1.0 / math.sqrt(hd)

        x = w["token_embd.weight"][ids].astype(np.float64)
        if gemma:
            x = x * math.sqrt(cfg.dim)
        for L in range(cfg.n_layers):
            b = f"blk.{L}."
            h = _rms_norm(x, w[b + "attn_norm.weight"], eps)
            q = _mm(h, w[b + "attn_q.weight"])
            k = _mm(h, w[b + "attn_k.weight"])
            v = _mm(h, w[b + "attn_v.weight"])
            if b + "attn_q.bias" in w:
                q = q + w[b + "attn_q.bias"]
                k = k + w[b + "attn_k.bias"]
                v = v + w[b + "attn_v.bias"]
            q = q.reshape(n, nh, hd)
            k = k.reshape(n, nkv, hd)
            v = v.reshape(n, nkv, hdv)
            if b + "attn_q_norm.weight" in w:
                q = _rms_norm(q, w[b + "attn_q_norm.weight"], eps)
                k = _rms_norm(k, w[b + "attn_k_norm.weight"], eps)
            window = 0
            base, scale = cfg.rope_base, cfg.rope_scale
            if gemma and cfg.windowed(L):
                window = cfg.sliding_window
                base, scale = cfg.rope_base_local, 1.0
            q = _rope(q, pos, cfg.rope_dim, base, scale, cfg.rope_neox, freq_div)
            k = _rope(k, pos, cfg.rope_dim, base, scale, cfg.rope_neox, freq_div)
            K = cache.k[L] = np.concatenate([cache.k[L], k], axis=0)
            V = cache.v[L] = np.concatenate([cache.v[L], v], axis=0)
            kpos = np.arange(K.shape[0])
            allowed = kpos[None, :] <= pos[:, None]                       # causal
            if window:
                allowed &= (pos[:, None] - kpos[None, :]) < window        # llama.cpp's standard SWA
            attn = np.empty((n, nh, hdv))
            for hh in range(nh):
                g = hh // group
                s = (q[:, hh, :] @ K[:, g, :].T) * scale_q                # (n, n_pos)
                s = np.where(allowed, s, -np.inf)
                s = s - s.max(axis=1, keepdims=True)
                p = np.exp(s)
                p /= p.sum(axis=1, keepdims=True)
                attn[:, hh, :] = p @ V[:, g, :]
            o = _mm(attn.reshape(n, nh * hdv), w[b + "attn_output.weight"])
            if gemma:
                o = _rms_norm(o, w[b + "post_attention_norm.weight"], eps)
            x = x + o
            h = _rms_norm(x, w[b + "ffn_norm.weight"], eps)
            if cfg.n_experts:
                f = self._experts(h, b)
            else:
                gate = _mm(h, w[b + "ffn_gate.weight"])
                up = _mm(h, w[b + "ffn_up.weight"])
                act = _gelu_tanh(gate) if gemma else _silu(gate)
                f = _mm(act * up, w[b + "ffn_down.weight"])
            if gemma:
                f = _rms_norm(f, w[b + "post_ffw_norm.weight"], eps)
            x = x + f
        cache.n += n
        if last_only:
            x = x[-1:]
        x = _rms_norm(x, w["output_norm.weight"], eps)
        head = w.get("output.weight")
        if head is None:
            head = w["token_embd.weight"]
        logits = _mm(x, head)
        cap = getattr(cfg, "final_logit_softcap", 0.0)
        if cap:
            logits = np.tanh(logits / cap) * cap
        return logits


    def _experts(self, h: np.ndarray, b: str) -> np.ndarray:
        """A mixture of experts: each token's top-k experts by router logit (ties: the lower id), their
        weights the softmax over the k (expert_norm) or over all, and the weighted sum of their FFNs."""
        cfg, w = self.cfg, self.w
        logits = _mm(h, w[b + "ffn_gate_inp.weight"])
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            order = sorted(range(cfg.n_experts), key=lambda e: (-logits[t, e], e))[:cfg.n_experts_used]
            p = np.exp(logits[t] - logits[t].max())
            p = p[order] / (p[order].sum() if cfg.expert_norm else p.sum())
            for e, pe in zip(order, p):
                gate = h[t] @ w[b + "ffn_gate_exps.weight"][e].T.astype(np.float64)
                up = h[t] @ w[b + "ffn_up_exps.weight"][e].T.astype(np.float64)
                out[t] += pe * ((_silu(gate) * up) @ w[b + "ffn_down_exps.weight"][e].T.astype(np.float64))
        return out


_MODELS: OrderedDict[tuple, ReferenceModel] = OrderedDict()


def load_reference(path) -> ReferenceModel:
    """A (cached) ReferenceModel for path; the two most recently used models stay in memory."""
    p = os.path.abspath(os.fspath(path))
    st = os.stat(p)
    key = (p, st.st_mtime_ns, st.st_size)
    m = _MODELS.pop(key, None)
    if m is None:
        m = ReferenceModel(p)
    _MODELS[key] = m
    while len(_MODELS) > 2:
        _MODELS.popitem(last=False)
    return m


def reference_logits(path, token_ids) -> np.ndarray:
    """Logits for every position of token_ids: (n_tokens, vocab) float32."""
    return load_reference(path).forward(token_ids).astype(np.float32)


def reference_greedy(path, prompt_ids, n: int) -> list[int]:
    """The n tokens that greedy (argmax) decoding generates after prompt_ids."""
    m = load_reference(path)
    cache = m.new_cache()
    logits = m.forward(prompt_ids, cache, last_only=True)
    out: list[int] = []
    for i in range(n):
        tok = int(np.argmax(logits[-1]))
        out.append(tok)
        if i + 1 < n:
            logits = m.forward([tok], cache, last_only=True)
    return out
