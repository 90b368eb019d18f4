"""The one place that imports the WebGPU binding.

wgpu-py (wgpu-native) is the default; SHADERLM_WEBGPU (--backend) selects Dawn (the `wgpudawn` package, a
build of the same API) or another package exposing it, and Dawn is taken by itself where wgpu-native finds
no adapter and Dawn does. The choice is made on first use (webgpu()), not at import: looking for adapters
costs a process that opens no device half a second on lavapipe. Everything else in shaderlm reaches the
binding through webgpu().
"""
import functools
import importlib

import wgpu as _native

from ..errors import DeviceError
from ..options import BACKENDS, shader_checks, webgpu_module

# WebGPU's flag values, the same in every implementation of the API
BufferUsage = _native.BufferUsage
MapMode = _native.MapMode
_chosen = None


def _has_adapter(module) -> bool:
    try:
        return bool(module.gpu.enumerate_adapters_sync())
    except Exception:  # noqa: BLE001 - an implementation that fails to start has none
        return False


def _import(name: str):
    """The WebGPU package `name`; Dawn's with its unsafe APIs allowed (before it makes its instance):
    that is what offers subgroup matrices, used only where a probe finds them exact (gpu/device.py).
    SHADERLM_SHADER_CHECKS=none turns Dawn's robustness off too (its bounds checks: with them the
    tensor-core GEMM runs at about half speed; docs/performance.md). Timestamps keep their precision
    (Dawn rounds them to 2^16 ns by default, for browsers: `profile` times dispatches shorter than that)."""
    module = importlib.import_module(name)
    if name == BACKENDS["dawn"]:
        try:
            from wgpudawn.backends.dawn.extras import set_instance_extras
        except ImportError:
            return module
        set_instance_extras(enable_toggles=["allow_unsafe_apis"]
                            + (["disable_robustness"] if shader_checks() == "none" else []),
                            disable_toggles=["timestamp_quantization"])
    return module


def webgpu():
    """The WebGPU package this process runs on (chosen on the first call)."""
    global _chosen
    if _chosen is None:
        name = webgpu_module()
        if name:
            try:
                _chosen = _import(name)
            except ImportError as e:
                raise DeviceError(f"the WebGPU package {name!r} (--backend / SHADERLM_WEBGPU) is not installed"
                                  + (" (`pip install wgpudawn`)" if name == BACKENDS["dawn"] else "")
                                  + f": {e}") from None
        elif _has_adapter(_native):
            _chosen = _native
        else:
            try:
                dawn = _import(BACKENDS["dawn"])
            except ImportError:
                dawn = None
            _chosen = dawn if dawn is not None and _has_adapter(dawn) else _native
    return _chosen


def implementation() -> str:
    """Which WebGPU package this process runs on, and its version."""
    w = webgpu()
    return f"{w.__name__} {getattr(w, '__version__', '')}".strip()


def native_api():
    """wgpu-native's cffi handles (ffi, lib, libf) when the binding is wgpu-py, else None: another
    WebGPU package is used through its public API only."""
    if webgpu() is not _native:
        return None
    try:
        from wgpu.backends.wgpu_native._api import ffi, lib, libf
    except Exception:  # noqa: BLE001
        return None
    return ffi, lib, libf


@functools.cache
def raw_compute_calls():
    """(set_pipeline, set_bind_group, dispatch, NULL) straight from wgpu-native's C API, or None.

    wgpu-py's checked wrappers cost several times more a dispatch than the raw cffi calls, which
    matters when a decode step is a few hundred dispatches."""
    api = native_api()
    if api is None:
        return None
    ffi, lib, _ = api
    return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
            lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)


def shader_module(device, code: str, label: str, checks: str):
    """A WGSL shader module. On wgpu-native, with the runtime `checks` (options.SHADER_CHECKS): by default
    bounds checks but no loop bounding, a counter in every loop that ends it if it never would (a guard
    against shaders from the web that costs every decode step and prompt here: every loop of these
    kernels ends by a count; docs/performance.md). Other WebGPU packages compile it as the API does."""
    api = native_api()
    if api is None:
        return device.create_shader_module(code=code, label=label)
    ffi, lib, libf = api
    from wgpu.backends.wgpu_native._api import GPUShaderModule
    bounds, loops = lib.WGPUShaderRuntimeChecks_BoundsChecks, lib.WGPUShaderRuntimeChecks_ForceLoopBounding
    flags = {"bounds": bounds, "all": bounds | loops, "none": lib.WGPUShaderRuntimeChecks_None}[checks]
    text, name = ffi.new("char[]", code.encode()), ffi.new("char[]", label.encode())
    src = ffi.new("WGPUShaderSourceWGSL *")
    src.chain.next = ffi.NULL
    src.chain.sType = lib.WGPUSType_ShaderSourceWGSL
    src.code.data, src.code.length = text, len(text) - 1
    desc = ffi.new("WGPUShaderModuleDescriptor *")
    desc.nextInChain = ffi.cast("WGPUChainedStruct *", src)
    desc.label.data, desc.label.length = name, len(name) - 1
    return GPUShaderModule(label, libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, flags), device)


def parallel_compile_ok() -> bool:
    """Pipelines may be created from several threads at once: wgpu-native's device is thread-safe.
    Not assumed of another package (one thread there)."""
    return native_api() is not None


class IndexedSubmission:
    """Submit and read back by submission index, through wgpu-native's C API.

    wgpu-py's map_sync resolves through its poll thread, which waits (wgpuDevicePoll with no index)
    until *every* queued submission is done: the decode loop, mapping the oldest of two queued
    batches, waited for both and left the GPU idle until its next submit. Here this thread maps the
    buffer and fires the callback by polling for the one submission that wrote it, so the batch
    behind that one keeps running."""

    def __init__(self, device, ffi, lib, libf):
        self._ffi, self._lib, self._libf = ffi, lib, libf
        self._queue, self._dev = device.queue._internal, device._internal
        # made once: an ffi.callback allocates executable memory, too much to make per decode batch
        self._status = []

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def mapped(st, _message, _u1, _u2):
            self._status.append(st)
        self._on_mapped = mapped
        self._map_info = ffi.new("WGPUBufferMapCallbackInfo *")
        self._map_info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self._map_info.callback = mapped
        self._index = ffi.new("WGPUSubmissionIndex *")
        self._one = ffi.new("WGPUCommandBuffer[1]")     # the decode loop submits one buffer at a time

    def submit(self, command_buffers) -> int:
        if len(command_buffers) == 1:
            handles = self._one
            handles[0] = command_buffers[0]._internal
        else:
            handles = self._ffi.new("WGPUCommandBuffer[]", [cb._internal for cb in command_buffers])
        return self._libf.wgpuQueueSubmitForIndex(self._queue, len(command_buffers), handles)

    def read(self, buffer, index: int, size: int) -> bytes:
        """`size` bytes of a MAP_READ buffer that submission `index` wrote (mapped, copied, unmapped)."""
        ffi, lib, libf, status = self._ffi, self._lib, self._libf, self._status
        status.clear()
        libf.wgpuBufferMapAsync(buffer._internal, lib.WGPUMapMode_Read, 0, size, self._map_info[0])
        self._index[0] = index
        for _ in range(1000):       # the first poll for a done submission fires it; more are a guard
            if status:
                break
            libf.wgpuDevicePoll(self._dev, True, self._index)
        if status != [lib.WGPUMapAsyncStatus_Success]:
            raise DeviceError(f"the GPU did not finish submission {index} (map status {status}): the device "
                              f"may be lost or out of memory")
        data = bytes(ffi.buffer(libf.wgpuBufferGetConstMappedRange(buffer._internal, 0, size), size))
        libf.wgpuBufferUnmap(buffer._internal)
        return data


def indexed_submission(device):
    """An IndexedSubmission for wgpu-native devices; None for other WebGPU packages (which use the
    plain submit and map_sync)."""
    api = native_api()
    return None if api is None else IndexedSubmission(device, *api)
