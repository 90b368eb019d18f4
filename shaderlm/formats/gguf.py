"""GGUF model files: memory-mapped loading and validation with actionable errors, and writing.

The tensor data is never read into RAM here: every ``TensorInfo.data`` is a uint8 view into the file's
memory map.  Parsing is done by ``gguf.GGUFReader`` (gguf-py from llama.cpp), sped up for the large
tokenizer arrays; whenever the reader trips over a broken file, a small bounds-checked walker of our own
re-reads the structure to say exactly what is wrong (which key or tensor, which offset, which size).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..errors import ModelFormatError, UnsupportedError
from .source import ModelSource, open_regular

__all__ = ["TensorInfo", "GGUFFile", "write_tensor_data"]

SUPPORTED_VERSIONS = (2, 3)
_MAX_DIMS = 4                    # GGML_MAX_DIMS
_DEFAULT_ALIGNMENT = 32


# ----------------------------------------------------------------------------------------------------------
# public data types


@dataclass
class TensorInfo:
    """One tensor of a GGUF file.

    ``shape`` is in row-major numpy order (GGUF dims reversed), so a weight matrix is
    ``(out_features, in_features)``.  ``data`` is a flat uint8 view of the tensor's ``n_bytes`` bytes
    inside the file's memory map (no copy).  ``offset`` is the absolute file offset of the data.
    """

    name: str
    type: str
    shape: tuple[int, ...]
    n_bytes: int
    data: np.ndarray
    offset: int = 0

    @property
    def n_elements(self) -> int:
        return int(math.prod(self.shape))

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[GGMLQuantizationType[self.type]][0]

    @property
    def type_size(self) -> int:
        """Bytes per block (per element for F32/F16/BF16)."""
        return GGML_QUANT_SIZES[GGMLQuantizationType[self.type]][1]

    def dequantize(self) -> np.ndarray:
        """The tensor as float32 with ``shape`` (reads and converts the whole tensor: for tests and tools)."""
        qtype = GGMLQuantizationType[self.type]
        if qtype == GGMLQuantizationType.F32:
            return self.data.view(np.float32).reshape(self.shape).copy()
        if qtype == GGMLQuantizationType.F16:
            return self.data.view(np.float16).astype(np.float32).reshape(self.shape)
        rows = self.data.reshape(-1, self.shape[-1] // self.block_size * self.type_size)
        out = gguf.quants.dequantize(rows, qtype)
        return np.asarray(out, dtype=np.float32).reshape(self.shape)


# ----------------------------------------------------------------------------------------------------------
# a faster GGUFReader
#
# GGUFReader slices its np.memmap once per scalar and per string; np.memmap's Python-level __getitem__ and
# __array_finalize__ make that ~8 s for SmolLM2's 49k-token vocabulary (~35 s for Gemma 3's 262k).  The
# subclass below slices a plain ndarray view of the same map instead and reads string and numeric arrays in
# one tight loop, producing the same ReaderField parts.


_NP_SCALAR = {
    GGUFValueType.UINT8: np.uint8,
    GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32,
    GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32,
    GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT64: np.float64,
    GGUFValueType.BOOL: np.bool_,
}


class _FastReader(gguf.GGUFReader):
    """GGUFReader with fast array parsing.  Private to this module: for string arrays the ReaderField holds
    one uint8 part covering the whole array and the decoded strings are kept in ``self.str_arrays`` (keyed by
    the field's value offset); numeric arrays are a single part.  Use :func:`_field_value` to read fields."""

    def _plain(self) -> np.ndarray:
        raw = self.__dict__.get("_plain_data")
        if raw is None:
            raw = self.data.view(np.ndarray)   # same buffer (the mmap), no memmap subclass overhead
            self.__dict__["_plain_data"] = raw
            self.__dict__["str_arrays"] = {}
        return raw

    def _get(self, offset, dtype, count=1, override_order=None):
        count = int(count)
        dt = np.dtype(dtype)
        arr = self._plain()[offset:offset + dt.itemsize * count].view(dt)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I":
            return super()._get_field_parts(orig_offs, raw_type)
        raw = self._plain()
        size = raw.shape[0]
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        if raw_itype.shape[0] != 1 or alen.shape[0] != 1:
            raise IndexError("array header past end of file")
        itype, n = int(raw_itype[0]), int(alen[0])
        start = offs = orig_offs + 12
        types = [GGUFValueType.ARRAY]
        if itype == GGUFValueType.STRING:
            unpack = struct.Struct("<Q").unpack_from
            buf = memoryview(raw)
            strings = []
            append = strings.append
            for _ in range(n):
                if offs + 8 > size:
                    raise IndexError("string array past end of file")
                end = offs + 8 + unpack(buf, offs)[0]
                if end > size:
                    raise IndexError("string past end of file")
                append(str(buf[offs + 8:end], "utf-8", "replace"))
                offs = end
            self.str_arrays[orig_offs] = strings
            if n:
                types.append(GGUFValueType.STRING)
            return offs - orig_offs, [raw_itype, alen, raw[start:offs]], [], types
        nptype = _NP_SCALAR.get(itype)
        if nptype is None:
            return super()._get_field_parts(orig_offs, raw_type)    # nested arrays: rare, keep upstream code
        dt = np.dtype(nptype)
        end = offs + dt.itemsize * n
        if end > size:
            raise IndexError("array past end of file")
        if n:
            types.append(GGUFValueType(itype))
        return end - orig_offs, [raw_itype, alen, raw[offs:end].view(dt)], [2], types


# ----------------------------------------------------------------------------------------------------------
# validation helpers


class _Truncated(Exception):
    def __init__(self, what: str, need: int):
        super().__init__(what)
        self.what = what
        self.need = need


def _type_name(type_id: int) -> str | None:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return None


def _fmt_size(n: int) -> str:
    return f"{n:,} bytes"


def _check_tensor(path: str, name: str, type_id: int, np_shape: tuple[int, ...], abs_offset: int,
                  rel_offset: int, alignment: int, file_size: int, types) -> int:
    """Validate one tensor's type (one of `types` unless None), shape and extent; return its byte size."""
    tname = _type_name(type_id)
    if tname is None:
        raise UnsupportedError(
            f"{path}: tensor '{name}' has unknown ggml type id {type_id} (a corrupt file, or a type newer than "
            f"this gguf library)" + (f"; supported types: {', '.join(types)}" if types else ""))
    if types is not None and tname not in types:
        raise UnsupportedError(
            f"{path}: tensor '{name}' has type {tname}, which shaderlm does not support; "
            f"supported types: {', '.join(types)} (re-quantize the model, e.g. to Q4_K_M or Q8_0)")
    if len(np_shape) > _MAX_DIMS or len(np_shape) == 0:
        raise ModelFormatError(f"{path}: tensor '{name}' has {len(np_shape)} dimensions (GGUF allows 1 to {_MAX_DIMS})")
    block, tsize = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    row = np_shape[-1]
    if row % block:
        raise ModelFormatError(
            f"{path}: tensor '{name}' ({tname}, shape {np_shape}) has rows of {row} elements, "
            f"not a multiple of the {tname} block size {block}")
    n_bytes = int(math.prod(np_shape)) // block * tsize
    if rel_offset % alignment:
        raise ModelFormatError(
            f"{path}: tensor '{name}' data offset {rel_offset} is not a multiple of the file's alignment {alignment}")
    if abs_offset + n_bytes > file_size:
        raise ModelFormatError(
            f"{path}: file is truncated: tensor '{name}' ({tname}, shape {np_shape}) needs bytes "
            f"{abs_offset:,}..{abs_offset + n_bytes:,} ({_fmt_size(n_bytes)}) but the file has only "
            f"{_fmt_size(file_size)} (an incomplete download?)")
    return n_bytes


def _read_prefix(path: str) -> tuple[int, bytes]:
    with open_regular(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            head = f.read(24)
        except OSError as e:
            raise ModelFormatError(f"{path}: cannot read: {e.strerror or e}") from None
    return size, head


def _check_prefix(path: str, size: int, head: bytes) -> None:
    if len(head) < 4 or head[:4] != b"GGUF":
        hint = ""
        if head[:2] == b"PK":
            hint = " (this looks like a zip / PyTorch checkpoint)"
        elif len(head) >= 9 and head[8:9] == b"{":
            hint = " (this looks like a safetensors file)"
        elif head[:4] in (b"ggjt", b"ggml", b"ggmf", b"tjgg", b"lmgg", b"fmgg"):
            hint = " (this is a pre-GGUF GGML file: convert it with llama.cpp)"
        elif len(head) < 4:
            hint = f" (the file has only {len(head)} bytes)"
        raise ModelFormatError(
            f"{path}: not a GGUF file: bad magic {head[:4]!r}, expected b'GGUF'{hint}")
    if size < 8:
        raise ModelFormatError(f"{path}: file is truncated: it ends inside the header ({_fmt_size(size)}, "
                               f"the GGUF header needs 24)")
    version = struct.unpack_from("<I", head, 4)[0]
    if version & 0xFFFF == 0 and version:
        raise UnsupportedError(f"{path}: big-endian GGUF files are not supported")
    if version not in SUPPORTED_VERSIONS:
        raise ModelFormatError(
            f"{path}: unsupported GGUF version {version} (supported: {', '.join(map(str, SUPPORTED_VERSIONS))})")
    if size < 24:
        raise ModelFormatError(f"{path}: file is truncated: it ends inside the header ({_fmt_size(size)}, "
                               f"the GGUF header needs 24)")
    # a tensor info takes at least 24 bytes (name length, dimension count, type, offset), a key 12
    n_tensors, n_kv = struct.unpack_from("<QQ", head, 8)
    if n_tensors * 24 + n_kv * 12 > size - 24:
        raise ModelFormatError(f"{path}: the header claims {n_tensors:,} tensors and {n_kv:,} metadata keys, more "
                               f"than a file of {_fmt_size(size)} can describe: corrupt or truncated file")


def _diagnose(path: str, size: int, types) -> None:
    """Walk the file's structure with bounds checks and raise a precise error for the first problem found.

    Only called after GGUFReader failed; returns normally if it finds nothing wrong.
    """
    with open(path, "rb") as f:
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            _walk(path, mm, size, types)


def _walk(path: str, buf, size: int, types) -> None:
    pos = 0

    def take(n: int, what: str) -> int:
        nonlocal pos
        if n < 0 or pos + n > size:
            raise _Truncated(what, pos + n)
        p = pos
        pos += n
        return p

    def u32(what):
        return struct.unpack_from("<I", buf, take(4, what))[0]

    def u64(what):
        return struct.unpack_from("<Q", buf, take(8, what))[0]

    def string(what) -> str:
        n = u64(what)
        p = take(n, what)
        raw = bytes(buf[p:p + n])
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFormatError(f"{path}: {what} is not valid UTF-8 (at byte {p:,}): corrupt file") from None

    scalar_sizes = {t: np.dtype(d).itemsize for t, d in _NP_SCALAR.items()}

    def value(vtype: int, what: str, depth: int = 0):
        """Skip one value; return it when it is a scalar (for general.alignment)."""
        if vtype in scalar_sizes:
            p = take(scalar_sizes[vtype], what)
            return np.frombuffer(buf, dtype=_NP_SCALAR[vtype], count=1, offset=p)[0]
        if vtype == GGUFValueType.STRING:
            n = u64(what)
            take(n, what)
            return None
        if vtype == GGUFValueType.ARRAY:
            if depth > 8:
                raise ModelFormatError(f"{path}: {what} nests arrays too deeply: corrupt file")
            itype = u32(what)
            n = u64(what)
            if itype in scalar_sizes:
                take(n * scalar_sizes[itype], what)
                return None
            if itype not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
                raise ModelFormatError(f"{path}: {what} is an array of invalid value type id {itype}: corrupt file")
            for i in range(n):
                value(itype, f"{what} (element {i} of {n})", depth + 1)
            return None
        raise ModelFormatError(f"{path}: {what} has invalid value type id {vtype}: corrupt file")

    try:
        take(8, "the header")
        n_tensors = u64("the header")
        n_kv = u64("the header")
        alignment = _DEFAULT_ALIGNMENT
        keys: set[str] = set()
        for i in range(n_kv):
            key = string(f"the name of metadata key #{i}")
            if key in keys:
                raise ModelFormatError(f"{path}: metadata key '{key}' appears twice: corrupt file")
            keys.add(key)
            vtype = u32(f"the type of metadata key '{key}'")
            v = value(vtype, f"the value of metadata key '{key}'")
            if key == "general.alignment":
                if vtype != GGUFValueType.UINT32:
                    raise ModelFormatError(f"{path}: metadata key 'general.alignment' must be a uint32")
                alignment = int(v)
                if alignment == 0 or alignment & (alignment - 1):
                    raise ModelFormatError(
                        f"{path}: metadata key 'general.alignment' is {alignment}, not a power of two")
        infos = []
        names: set[str] = set()
        for i in range(n_tensors):
            name = string(f"the name of tensor info #{i}")
            label = f"the tensor info of '{name}'"
            if name in names:
                raise ModelFormatError(f"{path}: tensor '{name}' appears twice: corrupt file")
            names.add(name)
            n_dims = u32(label)
            if n_dims > _MAX_DIMS or n_dims == 0:
                raise ModelFormatError(f"{path}: tensor '{name}' has {n_dims} dimensions (GGUF allows 1 to "
                                       f"{_MAX_DIMS}): corrupt file")
            dims = [u64(label) for _ in range(n_dims)]
            type_id = u32(label)
            rel = u64(label)
            infos.append((name, type_id, tuple(reversed(dims)), rel))
    except _Truncated as t:
        if t.need > 2 * size + (1 << 20):      # a length that no plausible file has: a corrupt field
            raise ModelFormatError(
                f"{path}: corrupt file: {t.what} claims {_fmt_size(t.need)} but the file has only "
                f"{_fmt_size(size)} (a damaged length field, or a truncated file)") from None
        raise ModelFormatError(
            f"{path}: file is truncated: it ends inside {t.what} (the file has {_fmt_size(size)}, "
            f"at least {_fmt_size(t.need)} needed; an incomplete download?)") from None
    data_start = pos + (-pos % alignment)
    for name, type_id, shape, rel in infos:
        _check_tensor(path, name, type_id, shape, data_start + rel, rel, alignment, size, types)


# ----------------------------------------------------------------------------------------------------------
# metadata conversion


def _field_value(field, reader) -> Any:
    types = field.types
    if not types:
        return None
    main = types[0]
    if main == GGUFValueType.ARRAY:
        if len(types) == 1:
            return []
        sub = types[1]
        if sub == GGUFValueType.STRING:
            value_offset = field.offset + sum(int(part.nbytes) for part in field.parts[:3])
            cached = getattr(reader, "str_arrays", {}).get(value_offset)
            if cached is not None:
                return cached
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        if sub == GGUFValueType.ARRAY:
            return field.contents()
        arrs = [field.parts[i] for i in field.data]
        arr = np.concatenate(arrs) if arrs else np.zeros(0, dtype=_NP_SCALAR[sub])
        return arr.astype(arr.dtype.newbyteorder("="), copy=True)
    if main == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", errors="replace")
    v = field.parts[-1][0]
    if main == GGUFValueType.BOOL:
        return bool(v)
    return v.item()


# ----------------------------------------------------------------------------------------------------------
# the file


class GGUFFile(ModelSource):
    """A GGUF model file, memory-mapped.

    ``metadata`` maps keys to python values (strings, ints, floats, bools; string arrays as ``list[str]``,
    numeric arrays as numpy arrays).  ``tensors`` maps tensor names to :class:`TensorInfo` in file order.
    With ``types`` (tensor type names) a tensor of any other type raises UnsupportedError naming it.
    """

    def __init__(self, path: str | os.PathLike, types=None):
        self.path = os.fspath(path)
        size, head = _read_prefix(self.path)
        self.file_size = size
        _check_prefix(self.path, size, head)
        self.version = struct.unpack_from("<I", head, 4)[0]
        reader = self._open_reader(types)
        self._reader = reader
        self.alignment = int(reader.alignment)
        self.data_offset = int(reader.data_offset)

        self.metadata: dict[str, Any] = {}
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            try:
                self.metadata[key] = _field_value(field, reader)
            except Exception as e:   # noqa: BLE001 - anything odd in a value is a format problem
                raise ModelFormatError(f"{self.path}: cannot decode metadata key '{key}': {e}") from None

        self.tensors: dict[str, TensorInfo] = {}
        raw = reader.data.view(np.ndarray).reshape(-1)
        for t in reader.tensors:
            np_shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            rel = int(t.field.parts[5][0]) if len(t.field.parts) > 5 else int(t.data_offset) - self.data_offset
            n_bytes = _check_tensor(self.path, t.name, int(t.tensor_type), np_shape, int(t.data_offset), rel,
                                    self.alignment, size, types)
            off = int(t.data_offset)
            self.tensors[t.name] = TensorInfo(
                name=t.name, type=GGMLQuantizationType(int(t.tensor_type)).name, shape=np_shape,
                n_bytes=n_bytes, data=raw[off:off + n_bytes], offset=off)

        self.arch: str = self.get_str("general.architecture")
        if not self.arch:
            raise ModelFormatError(f"{self.path}: metadata key 'general.architecture' is empty")

    def _open_reader(self, types):
        try:
            return _FastReader(self.path)
        except Exception as first:  # noqa: BLE001 - GGUFReader raises ValueError, IndexError, KeyError, ...
            _diagnose(self.path, self.file_size, types)
            try:   # the walker found nothing: maybe our reader speed-up disagrees with this gguf version
                return gguf.GGUFReader(self.path)
            except Exception:  # noqa: BLE001
                pass
            raise ModelFormatError(
                f"{self.path}: malformed GGUF file ({type(first).__name__}: {first})") from None


    def close(self) -> None:
        """Drop this object's references to the map (it closes once no TensorInfo.data view is alive)."""
        self._reader = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_tensor_data(writer, tensors, total: int, progress=None) -> None:
    """Write a gguf.GGUFWriter's header, metadata and tensor infos, then stream the tensors' bytes:
    `tensors` yields (name, n_bytes, chunks) in the order the infos were added, each chunk an array
    written as its bytes, so a writer never holds a whole model (synth.py, convert.py).
    `progress(done, total)` is called after every chunk."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    align = writer.data_alignment
    fout.write(b"\0" * (-fout.tell() % align))
    done = 0
    for name, nb, chunks in tensors:
        written = 0
        for c in chunks:
            fout.write(memoryview(np.ascontiguousarray(c)).cast("B"))
            written += c.nbytes
            if progress is not None:
                progress(done + written, total)
        if written != nb:
            raise ModelFormatError(f"internal: tensor {name} wrote {written} bytes, planned {nb}")
        fout.write(b"\0" * (-nb % align))
        done += nb
    writer.flush()
