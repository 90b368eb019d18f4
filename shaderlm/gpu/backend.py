"""The one place that imports the WebGPU binding.

wgpu-py (wgpu-native) is the default; SHADERLM_WEBGPU=<module> selects another package exposing the same
API (for example a Dawn build). Everything else in shaderlm imports `wgpu` from here.
"""
import importlib
import os

wgpu = importlib.import_module(os.environ.get("SHADERLM_WEBGPU", "wgpu"))

BufferUsage = wgpu.BufferUsage
MapMode = wgpu.MapMode
