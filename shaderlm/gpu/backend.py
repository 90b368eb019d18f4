"""The one place that imports the WebGPU binding.

wgpu-py (wgpu-native) is the default; SHADERLM_WEBGPU=<module> selects another package exposing the same
API (for example a Dawn build). Everything else in shaderlm imports `wgpu` from here.
"""
import importlib

from ..errors import DeviceError
from ..options import webgpu_module

wgpu = importlib.import_module(webgpu_module())

BufferUsage = wgpu.BufferUsage
MapMode = wgpu.MapMode


def native_api():
    """wgpu-native's cffi handles (ffi, lib, libf) when the binding is wgpu-py, else None: another
    WebGPU package is used through its public API only."""
    if wgpu.__name__ != "wgpu":
        return None
    try:
        from wgpu.backends.wgpu_native._api import ffi, lib, libf
    except Exception:  # noqa: BLE001
        return None
    return ffi, lib, libf


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
