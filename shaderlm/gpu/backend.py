"""The one place that imports the WebGPU binding.

wgpu-py (wgpu-native) is the default; SHADERLM_WEBGPU=<module> selects another package exposing the same
API (for example a Dawn build). Everything else in shaderlm imports `wgpu` from here.
"""
import importlib
import os

wgpu = importlib.import_module(os.environ.get("SHADERLM_WEBGPU", "wgpu"))

BufferUsage = wgpu.BufferUsage
MapMode = wgpu.MapMode


def raw_compute_calls():
    """(set_pipeline, set_bind_group, dispatch, NULL) straight from wgpu-native's C API, or None.

    Encoding through wgpu-py's checked wrappers costs ~5 us a dispatch; the raw cffi calls ~0.6 us,
    which matters when a decode step is a few hundred dispatches."""
    try:
        from wgpu.backends.wgpu_native._api import ffi, lib
    except Exception:  # noqa: BLE001 - another WebGPU package: use its public API
        return None
    if wgpu.__name__ != "wgpu":
        return None
    return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
            lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
