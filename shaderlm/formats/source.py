"""What a model file gives the layers above, whatever it came from: a GGUF file (formats/gguf.py) or
a Hugging Face folder (formats/hf.py). Subclasses set ``path``, ``metadata`` (key -> value) and
``tensors`` (name -> objects with ``.type``, ``.shape``, ``.n_bytes``, ``.data``)."""
from __future__ import annotations

import math
import os
import re
import stat
from typing import Any

import numpy as np

from ..errors import ModelFormatError, UnsupportedError

_MISSING = object()


def open_regular(path: str, mode: str = "rb", **kw):
    """`path` opened for reading, or ModelFormatError when it is missing or not a regular file. Checked
    by stat before the open (opening a FIFO for reading blocks for ever; a device may act on being
    opened) and again after it (the path may have been replaced in between)."""
    def nonblocking(p, flags):
        return os.open(p, flags | getattr(os, "O_NONBLOCK", 0))
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise ModelFormatError(f"{path}: is a directory, not a file")
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ModelFormatError(f"{path}: not a regular file")
        f = open(path, mode, opener=nonblocking, **kw)
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise ModelFormatError(f"{path}: cannot open: {getattr(e, 'strerror', None) or e}") from None
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        raise ModelFormatError(f"{path}: not a regular file")
    return f



class ModelSource:
    path: str
    metadata: dict
    tensors: dict
    where: str = ""           # how error messages name the metadata: the file, or its config.json

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFormatError(f"{self.where or self.path}: required key '{key}' is missing")
        return self.metadata[key]

    def get_int(self, key: str, default: Any = _MISSING, within: dict | None = None) -> Any:
        """An integer value; a per-layer array is accepted when all its values are the same.
        `within`: a nested object of the metadata to read `key` from (a config's rope_scaling, say)."""
        v = self._number(key, default, within)
        if isinstance(v, float) and not (math.isfinite(v) and v == int(v)):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be a whole number, got {v!r}")
        if isinstance(v, np.ndarray):
            if v.dtype.kind == "f" and not (np.isfinite(v).all() and (v == np.round(v)).all()):
                raise ModelFormatError(f"{self.where or self.path}: '{key}' should hold whole numbers")
            vals = set(int(x) for x in v.tolist())
            if len(vals) == 1:
                return vals.pop()
            raise UnsupportedError(f"{self.where or self.path}: '{key}' varies per layer ({sorted(vals)[:8]}); "
                                   f"shaderlm supports only uniform layers")
        return v if v is default else int(v)

    def get_float(self, key: str, default: Any = _MISSING, within: dict | None = None) -> Any:
        v = self._number(key, default, within)
        if isinstance(v, np.ndarray):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be one number, got an array")
        if v is not default and not math.isfinite(float(v)):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be a finite number, got {v!r}")
        return v if v is default else float(v)

    def get_str(self, key: str, default: Any = _MISSING, within: dict | None = None, max_len: int = 1 << 16) -> Any:
        """A string value of at most `max_len` characters."""
        v = (self.metadata if within is None else within).get(key, _MISSING)
        if v is _MISSING or v is None:
            if default is _MISSING:
                self.require(key)
            return default
        if not isinstance(v, str):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be a string, got "
                                   f"{_shown(v)}")
        if len(v) > max_len:
            raise ModelFormatError(f"{self.where or self.path}: '{key}' is {len(v):,} characters long, over "
                                   f"{max_len:,}")
        return v

    def get_bool(self, key: str, default: Any = _MISSING) -> Any:
        v = self.metadata.get(key, _MISSING)
        if v is _MISSING or v is None:
            if default is _MISSING:
                self.require(key)
            return default
        if not isinstance(v, (bool, np.bool_)):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be true or false, got {_shown(v)}")
        return bool(v)

    def _number(self, key: str, default: Any, within: dict | None = None):
        v = (self.metadata if within is None else within).get(key, _MISSING)
        if v is _MISSING or v is None:
            if default is _MISSING:
                self.require(key)
            return default
        if isinstance(v, np.ndarray) and v.dtype.kind in "iuf" and v.size:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be a number, got {_shown(v)}")
        return v

    def layer_count(self, key: str, prefix: str) -> int:
        """The layer count under `key`: positive, and no more than the layers with tensors named
        `prefix`N. (a huge count fails here, before anything loops over layers)."""
        if isinstance(self.metadata.get(key), np.ndarray):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be one number, got an array")
        n = self.get_int(key)
        pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
        present = 1 + max((int(m.group(1)) for m in map(pattern.match, self.tensors) if m), default=-1)
        if not 0 < n <= present:
            raise ModelFormatError(f"{self.where or self.path}: '{key}' is {n}, but the tensors are there for "
                                   f"{present} layers ({prefix}0. to {prefix}{max(present - 1, 0)}.)")
        return n

    def tensor(self, name: str):
        """The named tensor, or ModelFormatError naming it and the file."""
        t = self.tensors.get(name)
        if t is None:
            raise ModelFormatError(f"{self.path}: required tensor '{name}' is missing")
        return t

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def release(self, t) -> None:
        """Tensor t is on the GPU: a source may drop its pages from RAM (the HF folder does)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, {len(self.tensors)} tensors)"


def _shown(v: Any) -> str:
    """A value for an error message, cut short."""
    if isinstance(v, np.ndarray):
        v = v[:40].tolist() + (["..."] if v.size > 40 else [])
    elif isinstance(v, (list, str)) and len(v) > 40:
        return f"{v[:40]!r}... ({type(v).__name__} of {len(v):,})"
    return repr(v)[:200]
