"""safetensors files, memory-mapped: the header is parsed and checked here, tensor data stays in the map.

Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N, N bytes of
JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the data;
offsets are relative to the first byte after the header.  A file is read only if the reference library
(safetensors 0.8, Rust) would read it: the tensors tile the data exactly in offset order (no gap, no
overlap, no trailing bytes), shapes and offsets are unsigned 64-bit integers whose sizes do not
overflow, ``__metadata__`` maps strings to strings, and the header is JSON that its parser (serde_json)
accepts.  Every problem raises ModelFormatError (UnsupportedError for an unknown dtype) naming the file
and the tensor or key; never another exception.
"""
from __future__ import annotations

import json
import mmap
import os
import re
import reprlib
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from .source import open_regular

__all__ = ["DTYPE_BITS", "SafeTensor", "SafetensorsFile"]

# safetensors dtype -> bits per element: every dtype safetensors 0.8 reads (F4, F6_*: packed, sub-byte)
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
# the dtypes whose weights shaderlm can use (GGUF type names are the same strings)
FLOAT_DTYPES = ("F32", "F16", "BF16")
_FIELDS = frozenset(("dtype", "shape", "data_offsets"))
_MAX_HEADER = 100_000_000        # the reference's limit on the header (100 MB)
_MAX_DEPTH = 127                 # serde_json's nesting limit
_U64 = 1 << 64                   # shapes, offsets and sizes are u64 (usize) in the reference

_short = reprlib.Repr()          # header values in messages: a hostile header can be 100 MB
_short.maxstring = _short.maxother = 120
_short.maxlist = 8


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


# --- the header's JSON, parsed as serde_json parses it --------------------------------------------------


class _Object(dict):
    """A JSON object that keeps its pairs as written: the reference checks every value of a repeated key,
    and refuses a repeated field."""

    def __init__(self, pairs):
        super().__init__(pairs)
        self.pairs = pairs


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.S)


def _serde_refuses(text: str) -> str | None:
    """What serde_json refuses in JSON that Python's json read: nesting deeper than 127, and a \\u escape
    of half a UTF-16 surrogate pair (Python's json keeps the lone half)."""
    structure = np.frombuffer(_STRING.sub("", text).encode(), np.uint8)
    steps = np.isin(structure, list(b"[{")).astype(np.int8) - np.isin(structure, list(b"]}"))
    if steps.size and steps.cumsum(dtype=np.int32).max() > _MAX_DEPTH:
        return f"nested more than {_MAX_DEPTH} deep"
    if re.search(r"\\u[dD][89a-fA-F]", text):
        low_at = None                               # where the low half of a high surrogate must be
        for m in _ESCAPE.finditer(text):
            u = int(m[1], 16) if m[1] else 0
            low = 0xDC00 <= u < 0xE000
            if (low or low_at is not None) and not (low and m.start() == low_at):
                return "a \\u escape holds half a UTF-16 surrogate pair"
            low_at = m.end() if 0xD800 <= u < 0xDC00 else None
        if low_at is not None:
            return "a \\u escape holds half a UTF-16 surrogate pair"
    return None


def _float(s: str) -> float:
    x = float(s)
    if x in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {_short.repr(s)}")
    return x


def _int(s: str):
    # serde_json keeps an integer that fits u64/i64 and reads any other (and "-0") as a float
    if s != "-0" and len(s) <= 20:
        n = int(s)
        if -(1 << 63) <= n < _U64:
            return n
    return _float(s)


def _no_constant(s: str):
    raise ValueError(f"{s} is not JSON")


def _is_u64(x) -> bool:
    return type(x) is int and 0 <= x < _U64          # type(): a JSON true is a Python int too


# --- the file ------------------------------------------------------------------------------------------


class SafetensorsFile:
    """A memory-mapped .safetensors file: ``tensors`` maps names to :class:`SafeTensor`, ``metadata``
    is the header's ``__metadata__`` (strings)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        f = self._open()
        with f:
            size = self.file_size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ModelFormatError(f"{self.path}: file is truncated ({size} bytes; a safetensors file starts "
                                       f"with an 8-byte header length)")
            (n,) = struct.unpack("<Q", f.read(8))
            if n == 0:
                raise ModelFormatError(f"{self.path}: not a safetensors file (header length 0)")
            if n > _MAX_HEADER:
                raise ModelFormatError(f"{self.path}: not a safetensors file (header length {n:,} bytes is over "
                                       f"the format's 100 MB limit)")
            if 8 + n > size:
                raise ModelFormatError(f"{self.path}: file is truncated: the header needs {8 + n:,} bytes, the "
                                       f"file has {size:,} (an incomplete download?)")
            header = self._parse(f.read(n))
            try:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                raise ModelFormatError(f"{self.path}: cannot map the file: {e}") from None
        self.data_start = 8 + n
        self.metadata: dict[str, str] = {}
        entries = {}
        for key, value in header.pairs:              # every value of a repeated name is checked; the last wins
            if key == "__metadata__":
                self.metadata = self._check_metadata(value)
            else:
                entries[key] = self._check_entry(key, value)
        placed = self._place(entries, np.frombuffer(self._map, dtype=np.uint8))
        self.tensors: dict[str, SafeTensor] = {name: placed[name] for name in entries}      # header order

    def _open(self):
        return open_regular(self.path)

    def _parse(self, head: bytes) -> _Object:
        try:
            text = head.decode("utf-8")
            header = json.loads(text, object_pairs_hook=_Object, parse_int=_int, parse_float=_float,
                                parse_constant=_no_constant)
            why = _serde_refuses(text)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            why = "nested too deep" if isinstance(e, RecursionError) else e
        if why:
            raise ModelFormatError(f"{self.path}: not a safetensors file (the header is not JSON: {why})")
        if not isinstance(header, _Object):
            raise ModelFormatError(f"{self.path}: not a safetensors file (the header is not a JSON object)")
        if sum(k == "__metadata__" for k, _ in header.pairs) > 1:
            raise ModelFormatError(f"{self.path}: the header has '__metadata__' twice: corrupt file")
        return header

    def _check_metadata(self, meta) -> dict[str, str]:
        if meta is None:
            return {}
        if not isinstance(meta, _Object):
            raise ModelFormatError(f"{self.path}: '__metadata__' is {_short.repr(meta)}, not a JSON object: "
                                   f"corrupt file")
        for k, v in meta.pairs:
            if not isinstance(v, str):
                raise ModelFormatError(f"{self.path}: '__metadata__' key {_short.repr(k)} is {_short.repr(v)}, "
                                       f"not a string: corrupt file")
        return dict(meta)

    def _check_entry(self, name: str, info) -> tuple[str, tuple[int, ...], tuple[int, int]]:
        """(dtype, shape, data_offsets) of a header entry, their types checked."""
        if not isinstance(info, _Object) or not info.keys() >= _FIELDS:
            raise ModelFormatError(f"{self._at(name)}: header entry lacks dtype/shape/data_offsets: corrupt file")
        fields = [k for k, _ in info.pairs if k in _FIELDS]
        if len(fields) > len(_FIELDS):
            raise ModelFormatError(f"{self._at(name)}: header entry repeats a field ({', '.join(fields)}): "
                                   f"corrupt file")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str):
            raise ModelFormatError(f"{self._at(name)}: dtype {_short.repr(dtype)} is not a string: corrupt file")
        if dtype not in DTYPE_BITS:
            err = UnsupportedError if re.fullmatch(r"[A-Z][A-Z0-9_]*", dtype) else ModelFormatError
            raise err(f"{self._at(name)} has unknown dtype {_short.repr(dtype)}")
        if not isinstance(shape, list) or not all(map(_is_u64, shape)):
            raise ModelFormatError(f"{self._at(name)}: shape {_short.repr(shape)} is not a list of non-negative "
                                   f"integers: corrupt file")
        if not isinstance(offs, list) or len(offs) != 2 or not all(map(_is_u64, offs)):
            raise ModelFormatError(f"{self._at(name)}: data_offsets {_short.repr(offs)} is not [begin, end] in "
                                   f"non-negative integers: corrupt file")
        return dtype, tuple(shape), tuple(offs)

    def _place(self, entries: dict, raw: np.ndarray) -> dict[str, SafeTensor]:
        """The tensors, which must tile the data exactly in offset order: from byte 0 to the end of the
        file, no gap, no overlap."""
        placed, pos, prev = {}, 0, None
        for name, (dtype, shape, (begin, end)) in sorted(entries.items(), key=lambda e: e[1][2]):
            if end < begin or begin != pos:
                why = ("end before they begin" if end < begin else
                       f"leave a gap of {begin - pos:,} bytes before it" if begin > pos else
                       f"overlap tensor {_short.repr(prev)}")
                raise ModelFormatError(f"{self._at(name)}: data_offsets [{begin}, {end}] {why}: corrupt file")
            n_bytes = self._n_bytes(name, dtype, shape)
            if end - begin != n_bytes:
                raise ModelFormatError(f"{self._at(name)} ({dtype}, shape {_short.repr(shape)}) should hold "
                                       f"{n_bytes:,} bytes but its data_offsets [{begin}, {end}] span "
                                       f"{end - begin:,}: corrupt file")
            a = self.data_start + begin
            if a + n_bytes > self.file_size:
                raise ModelFormatError(f"{self._at(name)} ends at byte {a + n_bytes:,} but the file has only "
                                       f"{self.file_size:,} bytes: the file is truncated (an incomplete download?)")
            placed[name] = SafeTensor(name, dtype, shape, a, n_bytes, raw[a:a + n_bytes])
            pos, prev = end, name
        if self.data_start + pos != self.file_size:
            raise ModelFormatError(f"{self.path}: {self.file_size - self.data_start - pos:,} bytes after the last "
                                   f"tensor's data: corrupt file")
        return placed

    def _n_bytes(self, name: str, dtype: str, shape: tuple[int, ...]) -> int:
        # the reference's arithmetic: a u64 element count (multiplied in order), then u64 bits
        n = 1
        for d in shape:
            n *= d
            if n >= _U64:
                break
        bits = n * DTYPE_BITS[dtype]
        if bits >= _U64 or bits % 8:
            why = "its size overflows 64 bits" if bits >= _U64 else "does not fill whole bytes"
            raise ModelFormatError(f"{self._at(name)} ({dtype}, shape {_short.repr(shape)}): {why}: corrupt file")
        return bits // 8

    def _at(self, name: str) -> str:
        return f"{self.path}: tensor {_short.repr(name)}"

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
