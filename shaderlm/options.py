"""Every setting that changes how shaderlm runs, in one object, read once when a model is loaded.

User settings (each also a CLI flag and a `shaderlm.load` keyword):
    SHADERLM_DEVICE      adapter index or name substring (--device)
    SHADERLM_TUNE        auto (tune on GPUs, not on CPU adapters) | 1 (always) | 0 (never, no cache)
    SHADERLM_CACHE_DIR   where tuned kernel shapes are kept (default ~/.cache/shaderlm)
    SHADERLM_INT8_ACT    1: decode GEMVs round activations to int8 per 16 values (faster, not exact;
                         --int8-act), 0: 24-bit fixed point (default: int8 on GPUs, 24-bit on CPU adapters)
    SHADERLM_EXACT_PREFILL  1: prompts through the f32 GEMM, 0: the int8 one (default: int8 on GPUs, f32 on
                         CPU adapters; --exact-prefill)
    SHADERLM_WEBGPU      the WebGPU implementation: wgpu (wgpu-native), dawn (the `wgpudawn` package), or the
                         name of another package with the same API (--backend); default wgpu, or dawn where
                         only Dawn finds an adapter
Debug switches, for tests and A/B runs (they change which kernels run, never the results beyond
rounding):
    SHADERLM_NO_SUBGROUPS=1   the workgroup-memory kernels instead of the subgroup ones
    SHADERLM_FUSE=0|1         the fused decode step off/on (default: on for GPUs, off for CPU adapters)
    SHADERLM_NO_X24=1         f32 activations in the decode GEMVs instead of 24-bit fixed point
    SHADERLM_ATTN=WG,UNROLL[,SPLITS[,MIN_KEYS]]   the decode attention kernel's shape
    SHADERLM_BATCH_NT=N       tokens a workgroup of a batched decode GEMV computes at most (default 2 with
                              int8 activations, 1 with 24-bit ones)
    SHADERLM_Q8_TILE=TM,TV[,KB]   the int8 prefill GEMM's tile (16 TM rows x 64 TV tokens, K steps
                              of 32 KB) for every matrix
    SHADERLM_SHADER_CHECKS=bounds|all|none   wgpu-native's runtime checks in the kernels: bounds checks
                              on array accesses (default), plus a counter in every loop that ends it
                              if it never would (all: what the plain WebGPU API compiles), or neither;
                              kernels.UNCHECKED (the int8 GEMMs, which clamp every index) leave out
                              the default bounds checks (`all` keeps them)
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .errors import ShaderLMError

TUNE_MODES = ("auto", "1", "0")


@dataclass(frozen=True)
class Options:
    device: str | None = None           # adapter index or name substring; None: high-performance
    tune: str = "auto"                  # auto | 1 | 0 (see TUNE_MODES)
    cache_dir: str | None = None        # tuned shapes; None: ~/.cache/shaderlm
    int8_act: bool | None = None        # int8 x in the decode GEMVs; None: the adapter decides (not on CPUs)
    exact_prefill: bool | None = None   # the f32 prefill GEMM; None: the adapter decides (f32 on CPUs)
    subgroups: bool = True              # use subgroup operations where the adapter has them
    fuse: bool | None = None            # the fused decode step; None: the adapter decides
    x24: bool = True                    # 24-bit fixed-point activations in the decode GEMVs
    attention_shape: tuple | None = None  # the decode attention kernel's shape override
    batch_tokens: int | None = None     # tokens a workgroup of a batched decode GEMV computes at most;
                                        # None: what suits the activations (2 for int8, 1 for 24-bit)
    q8_tile: tuple | None = None        # the int8 prefill GEMM's tile override
    gemm_rows: int | None = None        # serving steps of this many rows or more take the int8 batch matmuls
                                        # (0: never); None: models/serving.py's default

    def replace(self, **changes) -> "Options":
        """A copy with the given fields changed; None values leave a field as it is."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @classmethod
    def from_env(cls, env=None) -> "Options":
        env = os.environ if env is None else env
        tune = env.get("SHADERLM_TUNE", "auto").lower()
        if tune not in TUNE_MODES:
            raise ShaderLMError(f"SHADERLM_TUNE={tune!r}: use one of {', '.join(TUNE_MODES)}")
        return cls(device=env.get("SHADERLM_DEVICE") or None, tune=tune,
                   cache_dir=env.get("SHADERLM_CACHE_DIR") or None,
                   int8_act=_tristate(env, "SHADERLM_INT8_ACT"), exact_prefill=_tristate(env, "SHADERLM_EXACT_PREFILL"),
                   subgroups=not _flag(env, "SHADERLM_NO_SUBGROUPS"), fuse=_tristate(env, "SHADERLM_FUSE"),
                   x24=not _flag(env, "SHADERLM_NO_X24"),
                   attention_shape=_ints(env, "SHADERLM_ATTN"),
                   batch_tokens=(_ints(env, "SHADERLM_BATCH_NT") or (None,))[0], q8_tile=_ints(env, "SHADERLM_Q8_TILE"),
                   gemm_rows=(_ints(env, "SHADERLM_GEMM_ROWS") or (None,))[0])


BACKENDS = {"wgpu": "wgpu", "dawn": "wgpudawn"}      # --backend name -> the package with wgpu-py's API


def webgpu_module() -> str | None:
    """The WebGPU package gpu/backend.py takes (read when a command first reaches the GPU); None: not chosen."""
    name = os.environ.get("SHADERLM_WEBGPU") or None
    return BACKENDS.get(name, name)


SHADER_CHECKS = ("bounds", "all", "none")


def shader_checks() -> str:
    """Which of wgpu-native's runtime checks kernels are compiled with (gpu/backend.py shader_module)."""
    raw = os.environ.get("SHADERLM_SHADER_CHECKS") or SHADER_CHECKS[0]
    if raw not in SHADER_CHECKS:
        raise ShaderLMError(f"SHADERLM_SHADER_CHECKS={raw!r}: expected one of {', '.join(SHADER_CHECKS)}")
    return raw


def _flag(env, name: str) -> bool:
    return env.get(name, "") not in ("", "0")


def _tristate(env, name: str) -> bool | None:
    """A switch the adapter decides when unset (None); 0 is off, anything else on."""
    return None if env.get(name, "") == "" else env[name] != "0"


def _ints(env, name: str) -> tuple | None:
    raw = env.get(name)
    if not raw:
        return None
    try:
        return tuple(int(v) for v in raw.split(","))
    except ValueError:
        raise ShaderLMError(f"{name}={raw!r}: expected comma-separated integers") from None
