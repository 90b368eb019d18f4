"""safetensors files, memory-mapped: the header is parsed and checked here, tensor data stays in the map.

Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N bytes of
JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data;
offsets are relative to the first byte after the header.  Every problem (a truncated file, a tensor
past the end, a size that does not match its shape, an unknown dtype) raises ModelFormatError naming
the file and the tensor.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError, UnsupportedError

__all__ = ["DTYPE_SIZES", "SafeTensor", "SafetensorsFile"]

# safetensors dtype -> bytes per element (the ones the format defines)
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
# the dtypes whose weights shaderlm can use (GGUF type names are the same strings)
FLOAT_DTYPES = ("F32", "F16", "BF16")
_MAX_HEADER = 100 << 20          # the format's own limit on the header (100 MB)


@dataclass
class SafeTensor:
    """One tensor: ``data`` is a flat uint8 view of its bytes inside the file's map (no copy)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int                 # absolute file offset of the first byte
    n_bytes: int
    data: np.ndarray

    def to_numpy(self) -> np.ndarray:
        """The tensor as float32 with its shape (reads the whole tensor)."""
        if self.dtype == "F32":
            return self.data.view(np.float32).reshape(self.shape)
        if self.dtype == "F16":
            return self.data.view(np.float16).astype(np.float32).reshape(self.shape)
        if self.dtype == "BF16":
            return (self.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(self.shape)
        raise UnsupportedError(f"tensor '{self.name}' has dtype {self.dtype}; shaderlm reads "
                               f"{', '.join(FLOAT_DTYPES)} weights")


class SafetensorsFile:
    """A memory-mapped .safetensors file: ``tensors`` maps names to :class:`SafeTensor`, ``metadata``
    is the header's ``__metadata__`` (strings)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise ModelFormatError(f"{self.path}: cannot open: {e.strerror}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            self.file_size = size
            if size < 8:
                raise ModelFormatError(f"{self.path}: file is truncated ({size} bytes; a safetensors file starts "
                                       f"with an 8-byte header length)")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > _MAX_HEADER:
                raise ModelFormatError(f"{self.path}: not a safetensors file (header length {n:,} bytes is over "
                                       f"the format's 100 MB limit)")
            if 8 + n > size:
                raise ModelFormatError(f"{self.path}: file is truncated: the header needs {8 + n:,} bytes, the "
                                       f"file has {size:,} (an incomplete download?)")
            head = f.read(n)
            try:
                header = json.loads(head.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ModelFormatError(f"{self.path}: not a safetensors file (the header is not JSON: {e})") from None
            if not isinstance(header, dict):
                raise ModelFormatError(f"{self.path}: not a safetensors file (the header is not a JSON object)")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self.data_start = 8 + n
        meta = header.pop("__metadata__", None) or {}
        self.metadata = {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}
        raw = np.frombuffer(self._map, dtype=np.uint8)
        self.tensors: dict[str, SafeTensor] = {}
        for name, info in header.items():
            self.tensors[name] = self._check(name, info, raw)

    def _check(self, name: str, info, raw: np.ndarray) -> SafeTensor:
        where = f"{self.path}: tensor '{name}'"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise ModelFormatError(f"{where}: header entry lacks dtype/shape/data_offsets: corrupt file")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_SIZES:
            raise UnsupportedError(f"{where} has unknown dtype {dtype!r}")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
                or not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)):
            raise ModelFormatError(f"{where}: bad shape {shape!r} or data_offsets {offs!r}: corrupt file")
        begin, end = offs
        n_bytes = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - begin != n_bytes or begin < 0:
            raise ModelFormatError(f"{where} ({dtype}, shape {tuple(shape)}) should hold {n_bytes:,} bytes but its "
                                   f"data_offsets {offs} span {end - begin:,}: corrupt file")
        a, b = self.data_start + begin, self.data_start + end
        if b > self.file_size:
            raise ModelFormatError(f"{where} ends at byte {b:,} but the file has only {self.file_size:,} bytes: "
                                   f"the file is truncated (an incomplete download?)")
        return SafeTensor(name, dtype, tuple(shape), a, n_bytes, raw[a:b])

    def release(self, t: SafeTensor) -> None:
        """Drop the pages of ``t`` from this process's resident set (the page cache keeps them): called
        once a tensor is on the GPU, so that loading never holds the whole file resident."""
        if self._map is None or not hasattr(self._map, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        a = t.offset // page * page
        b = min(-(-(t.offset + t.n_bytes) // page) * page, self.file_size)
        if b > a:
            try:
                self._map.madvise(mmap.MADV_DONTNEED, a, b - a)
            except (OSError, ValueError):
                pass

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path!r}, {len(self.tensors)} tensors)"
