"""A GPU device: adapter choice, features and limits, buffers, and compute pipelines from WGSL text.

This layer knows no kernel, format or model: kernels/ turns its WGSL files into text and asks for
pipelines here.
"""
from __future__ import annotations

import os
import struct
import tempfile
from contextlib import contextmanager

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())  # Mesa's WSI complains when unset

from ..errors import DeviceError  # noqa: E402
from ..options import shader_checks  # noqa: E402
from .backend import BufferUsage, MapMode, indexed_submission, shader_module, webgpu  # noqa: E402

SUBGROUP_MATRIX = "chromium-experimental-subgroup-matrix"     # Dawn's (needs its unsafe APIs allowed)
STORAGE = BufferUsage.STORAGE | BufferUsage.COPY_DST | BufferUsage.COPY_SRC
UNIFORM = BufferUsage.UNIFORM | BufferUsage.COPY_DST
READBACK = BufferUsage.MAP_READ | BufferUsage.COPY_DST

OPTIONAL_FEATURES = ("shader-f16", "subgroup", "timestamp-query", "timestamp-query-inside-passes",
                     "timestamp-query-inside-encoders", "subgroups", SUBGROUP_MATRIX)
# Limits we raise to what the adapter offers (WebGPU's defaults are far below real hardware).
WANTED_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
                 "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                 "max-compute-workgroup-size-x", "max-compute-workgroups-per-dimension",
                 "max-uniform-buffer-binding-size", "max-bind-groups")

NO_ADAPTER_HELP = ("no WebGPU adapter found. Install a Vulkan driver: on Debian/Ubuntu "
                   "`apt-get install mesa-vulkan-drivers` (software lavapipe, or Mesa's AMD/Intel drivers), "
                   "the NVIDIA driver with its Vulkan ICD, or run on macOS (Metal) / Windows (D3D12).")

# Which subgroup size the driver picks for a 64-wide workgroup (it may differ from the adapter's range).
_SUBGROUP_PROBE = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(subgroup_size) sgs: u32) {
    if (li == 0u) { out[0] = sgs; }
}
"""

# One int8 16x16x32 product on subgroup matrices (tensor cores): A's 16 rows and B's 16 columns are 32
# bytes each, C = A B in i32, stored column-major.
INT8_MATRIX_PROBE = """
enable subgroups;
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
@group(0) @binding(0) var<storage, read_write> a: array<i32>;
@group(0) @binding(1) var<storage, read_write> b: array<i32>;
@group(0) @binding(2) var<storage, read_write> c: array<i32>;
@compute @workgroup_size(32)
fn main() {
    let l = subgroupMatrixLoad<subgroup_matrix_left<i8, 32, 16>>(&a, 0u, false, 32u);
    let r = subgroupMatrixLoad<subgroup_matrix_right<i8, 16, 32>>(&b, 0u, true, 32u);
    subgroupMatrixStore(&c, 0u, subgroupMatrixMultiply<i32>(l, r), true, 16u);
}
"""


def list_adapters():
    try:
        return list(webgpu().gpu.enumerate_adapters_sync())
    except Exception:  # noqa: BLE001 - any backend failure means "none"
        return []


def _default_adapter():
    try:
        adapter = webgpu().gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as e:  # noqa: BLE001
        raise DeviceError(f"{NO_ADAPTER_HELP} ({e})") from None
    if adapter is None:
        raise DeviceError(NO_ADAPTER_HELP)
    return adapter


def _peer(k: int):
    """The k-th (round-robin) of the adapters like the default one: same backend and type, so not the same
    GPU again through GL, nor a software adapter beside a GPU. How replicas on one host spread out."""
    default = _default_adapter()
    kind = (default.info["backend_type"], default.info["adapter_type"])
    peers = [a for a in list_adapters() if (a.info["backend_type"], a.info["adapter_type"]) == kind] or [default]
    return peers[k % len(peers)]


def _pick_adapter(spec: str | None):
    if spec in (None, ""):
        return _default_adapter()
    if spec.startswith("peer:") and spec[5:].isdigit():
        return _peer(int(spec[5:]))
    adapters = list_adapters()
    if not adapters:
        raise DeviceError(NO_ADAPTER_HELP)
    names = [f"{i}: {a.info['device']} ({a.info['backend_type']})" for i, a in enumerate(adapters)]
    if spec.isdigit():
        i = int(spec)
        if i >= len(adapters):
            raise DeviceError(f"--device {spec}: no adapter with that index; adapters: " + "; ".join(names))
        return adapters[i]
    for a in adapters:
        if spec.lower() in f"{a.info['device']} {a.info['vendor']} {a.info['backend_type']}".lower():
            return a
    raise DeviceError(f"--device {spec!r} matches no adapter; adapters: " + "; ".join(names))


class Device:
    """A wgpu device with the adapter's real limits, plus the helpers every kernel wrapper uses."""

    def __init__(self, spec: str | None = None, subgroups: bool = True):
        """`spec`: adapter index or name substring, or "peer:K", the K-th (round-robin) adapter like the
        default one (default: the high-performance adapter).
        `subgroups=False` leaves the subgroup feature off (the kernels use workgroup memory instead)."""
        self.shader_checks = shader_checks()     # read once; a bad value is named before any work
        self.adapter = _pick_adapter(spec)
        feats = set(self.adapter.features)
        want = [f for f in OPTIONAL_FEATURES if f in feats and (subgroups or f != "subgroup")]
        limits = {k: self.adapter.limits[k] for k in WANTED_LIMITS if k in self.adapter.limits}
        try:
            self.device = self.adapter.request_device_sync(required_features=want, required_limits=limits)
        except Exception as e:  # noqa: BLE001
            raise DeviceError(f"could not open {self.name}: {e}") from None
        self.queue = self.device.queue
        self.indexed = indexed_submission(self.device)
        self.features = set(self.device.features)
        self.limits = dict(self.device.limits)
        self.max_binding = int(self.limits["max-storage-buffer-binding-size"])
        self.max_buffers = int(self.limits["max-storage-buffers-per-shader-stage"])
        # wgpu-native's feature, or Dawn's (asked for even without `subgroups`: its subgroup matrices need it)
        self.has_subgroups = subgroups and ("subgroup" in self.features or "subgroups" in self.features)
        self.has_timestamps = "timestamp-query" in self.features
        self.subgroup_size = self._probe_subgroup_size() if self.has_subgroups else 0
        if self.subgroup_size < 4:          # the kernels' partial-sum buffers assume 4 lanes or more
            self.has_subgroups, self.subgroup_size = False, 0
        # int8 products on subgroup matrices, exact here (the prefill GEMMs' tensor-core path)
        self.has_int8_matrix = SUBGROUP_MATRIX in self.features and self._probe_int8_matrix()
        self._scratch: dict = {}

    @property
    def name(self) -> str:
        info = self.adapter.info
        return f"{info['device']} ({info['backend_type']})"

    @property
    def is_cpu(self) -> bool:
        """A software adapter (lavapipe, llvmpipe): arithmetic is the cost there, not dispatches."""
        return self.adapter.info.get("adapter_type") == "CPU"

    def limit(self, name: str, default: int) -> int:
        return int(self.limits.get(name, default))

    def describe(self) -> dict:
        info = self.adapter.info
        return {"device": info["device"], "vendor": info["vendor"], "backend": info["backend_type"],
                "adapter_type": info["adapter_type"], "description": info["description"],
                "features": sorted(self.features), "subgroup_size": self.subgroup_size,
                "int8_matrix": self.has_int8_matrix,
                "limits": {k: self.limits[k] for k in WANTED_LIMITS if k in self.limits}}

    def identity(self) -> list[str]:
        """What names this adapter and driver (for caches of per-adapter measurements)."""
        info = self.adapter.info
        return [str(info.get(k)) for k in ("vendor", "device", "backend_type", "description")] + \
            [str(self.subgroup_size)]

    # ---- buffers -------------------------------------------------------------------------------
    def buffer(self, size: int, usage=STORAGE, label: str = ""):
        return self._create_buffer(size, usage, label)

    def upload(self, data, usage=STORAGE, label: str = ""):
        """A new buffer holding `data` (any buffer-protocol object), padded to a multiple of 16 bytes."""
        mv = memoryview(data).cast("B")
        buf = self._create_buffer(mv.nbytes, usage, label, mapped=True)
        if mv.nbytes:
            buf.write_mapped(mv, 0)
        buf.unmap()
        return buf

    def _create_buffer(self, size: int, usage, label: str, mapped: bool = False):
        size = max(16, -(-int(size) // 16) * 16)
        largest = self.limit("max-buffer-size", 1 << 28)
        if size > largest:
            raise DeviceError(f"{label or 'a buffer'} needs {size:,} bytes, over the largest buffer {self.name} "
                              f"allows ({largest:,} bytes)")
        with self.faults(f"allocating {label or 'a buffer'} ({size:,} bytes)"):
            return self.device.create_buffer(size=size, usage=usage, label=label, mapped_at_creation=mapped)

    @contextmanager
    def faults(self, doing: str):
        """GPU errors (out of memory, a lost device, a rejected call) as one DeviceError naming what
        was being done and the adapter."""
        try:
            yield
        except webgpu().GPUError as e:
            detail = " ".join(str(e).split())[:400]
            raise DeviceError(f"{doing} failed on {self.name}: {type(e).__name__}: {detail}") from e

    def scratch(self, name: str, size: int):
        """A buffer shared by every dispatch asking for `name`: scratch space for kernels that run one at a
        time (attention's split partials); the name says its shape, so every asker wants the same size.
        Zeroed when made; the kernels leave it as they need it."""
        buf = self._scratch.get(name)
        if buf is None:
            buf = self._scratch[name] = self.buffer(size, label=name)
        elif buf.size < size:
            raise ValueError(f"scratch buffer {name!r} ({buf.size} bytes) asked for with {size}")
        return buf

    def write(self, buf, data, offset: int = 0):
        self.queue.write_buffer(buf, offset, memoryview(data).cast("B"))

    def read(self, buf, dtype=np.float32, offset: int = 0, size: int | None = None) -> np.ndarray:
        with self.faults("reading a buffer back"):
            raw = self.queue.read_buffer(buf, offset, size)
        return np.frombuffer(raw, dtype=dtype).copy()

    def uniform(self, *values, label: str = ""):
        """A uniform buffer from ints (u32) and floats (f32), in order, each 4 bytes."""
        return self.upload(pack_params(*values), usage=UNIFORM, label=label)

    # ---- pipelines -----------------------------------------------------------------------------
    def compile(self, code: str, label: str = "", clamped: bool = False):
        """A compute pipeline (entry point `main`, layout from the shader) from WGSL source, with the
        device's runtime checks (options.shader_checks); `clamped`: the kernel keeps every index within
        its buffers itself, so the default bounds checks are left out (`all` still checks it)."""
        if "subgroups" in self.features and "enable subgroups;" not in code:
            code = "enable subgroups;\n" + code        # Dawn's WGSL asks for it; wgpu-native's takes none
        try:
            checks = "none" if clamped and self.shader_checks == "bounds" else self.shader_checks
            module = shader_module(self.device, code, label, checks)
            return self.device.create_compute_pipeline(layout="auto",
                                                       compute={"module": module, "entry_point": "main"},
                                                       label=label)
        except Exception as e:
            raise DeviceError(f"kernel {label} failed to compile on {self.name}: {e}") from e

    def bind_group(self, pipeline, resources):
        """Bind resources to bindings 0..n-1 of group 0: a buffer, (buffer, offset, size), or None
        for a binding the kernel variant does not declare."""
        entries = []
        for i, r in enumerate(resources):
            if r is None:
                continue
            buf, off, size = (r, 0, r.size) if not isinstance(r, tuple) else r
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": off, "size": size}})
        return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)

    @contextmanager
    def recording_bindings(self):
        """While inside, bind_group also notes each group's buffers: yields {id(group): {binding: buffer}}
        (tools and tests that ask which dispatch binds what: the bindings are not readable from wgpu)."""
        bound, make = {}, self.bind_group

        def recording(pipeline, resources):
            group = make(pipeline, resources)
            bound[id(group)] = {i: r[0] if isinstance(r, tuple) else r for i, r in enumerate(resources)
                                if r is not None}
            return group
        self.bind_group = recording
        try:
            yield bound
        finally:
            del self.bind_group

    # ---- submission ----------------------------------------------------------------------------
    def submit(self, command_buffers):
        """Submit; returns the submission's index for read_after() where the backend has one."""
        with self.faults("submitting GPU work"):
            if self.indexed:
                return self.indexed.submit(command_buffers)
            self.queue.submit(command_buffers)
            return None

    @property
    def reads_by_submission(self) -> bool:
        """Whether read_after waits only for the submission it names (wgpu-native's indexed polls), not
        for everything submitted after it too."""
        return self.indexed is not None

    def read_after(self, staging, index, size: int) -> bytes:
        """`size` bytes of the MAP_READ buffer `staging` once submission `index` has written it,
        without waiting for later submissions where the backend allows (see backend.py)."""
        with self.faults("reading results back"):
            if self.indexed and index is not None:
                return self.indexed.read(staging, index, size)
            staging.map_sync(MapMode.READ, 0, size)
            data = bytes(staging.read_mapped(0, size))
            staging.unmap()
            return data

    def encoder(self):
        return self.device.create_command_encoder()

    def run_once(self, pipeline, resources, grid):
        """One dispatch of `pipeline` over `resources` (as bind_group takes them), submitted now: for
        one-off work outside the plans (probes, upload-time layout passes, test tools)."""
        enc = self.encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipeline)
        cp.set_bind_group(0, self.bind_group(pipeline, resources))
        cp.dispatch_workgroups(*grid)
        cp.end()
        self.submit([enc.finish()])

    def _probe_int8_matrix(self) -> bool:
        rng = np.random.default_rng(0)
        a, b = (rng.integers(-128, 128, (16, 32), dtype=np.int8) for _ in range(2))
        out = self.buffer(16 * 16 * 4)
        try:
            pipe = self.compile(INT8_MATRIX_PROBE, "int8 subgroup matrix probe")
            self.run_once(pipe, [self.upload(a), self.upload(b), out], (1, 1, 1))
            got = self.read(out, np.int32).reshape(16, 16)      # column n: B's row n times A's rows
        except DeviceError:
            return False
        return bool(np.array_equal(got, (b.astype(np.int32) @ a.astype(np.int32).T)))

    def _probe_subgroup_size(self) -> int:
        out = self.buffer(16)
        self.run_once(self.compile(_SUBGROUP_PROBE, "subgroup probe"), [out], (1, 1, 1))
        return int(self.read(out, np.uint32)[0])


def pack_params(*values) -> bytes:
    """ints as u32 and floats as f32, in order, padded to 16 bytes: a kernel's uniform block."""
    out = bytearray()
    for v in values:
        if isinstance(v, (bool, int, np.integer)):
            out += struct.pack("<I", int(v) & 0xFFFFFFFF)
        else:
            out += struct.pack("<f", float(v))
    out += b"\0" * (-len(out) % 16)
    return bytes(out) or b"\0" * 16


_devices: dict = {}


def get_device(spec: str | None = None, subgroups: bool = True) -> Device:
    """One Device per (adapter spec, subgroups) for the process (pipelines are cached on it)."""
    key = (spec or "", subgroups)
    if key not in _devices:
        _devices[key] = Device(spec or None, subgroups)
    return _devices[key]
