"""The WGSL kernels (`*.wgsl` in this folder) and the thin Python that builds their dispatches.

`pipeline(dev, name, **defines)` specialises kernels/NAME.wgsl (wgsl.py's preprocessor) and compiles
it on the device, once per set of defines. Every kernel sees SUBGROUPS (the device has them).
"""
from __future__ import annotations

from weakref import WeakKeyDictionary

from .wgsl import KERNEL_DIR, load_wgsl

_pipelines: WeakKeyDictionary = WeakKeyDictionary()     # device -> {(kernel, defines): pipeline}
# kernels that clamp every index they load or store by to the sizes the host allots them, unless one of
# the defines listed is set (their indices come from data on the GPU): compiled as `clamped` (without
# wgpu-native's default bounds checks, which cost the int8 GEMMs part of their loads' time)
UNCHECKED = {"matmul_few": (), "matmul_q8": ("EXPERTS",)}


def unchecked(kernel: str, defines: dict) -> bool:
    return kernel in UNCHECKED and not any(defines.get(d) for d in UNCHECKED[kernel])


def pipeline(dev, kernel: str, **defines):
    defines = {"SUBGROUPS": dev.has_subgroups, **defines}
    cache = _pipelines.setdefault(dev, {})
    key = (kernel, tuple(sorted(defines.items())))
    pipe = cache.get(key)
    if pipe is None:
        pipe = cache[key] = dev.compile(load_wgsl(kernel, defines), f"{kernel} {defines}",
                                        clamped=unchecked(kernel, defines))
    return pipe


def compiled(dev) -> dict:
    """(kernel, sorted define items) -> pipeline, for every kernel compiled on `dev` so far."""
    return dict(_pipelines.get(dev, {}))


__all__ = ["KERNEL_DIR", "compiled", "load_wgsl", "pipeline"]
