"""What a model file gives the layers above, whatever it came from: a GGUF file (formats/gguf.py) or
a Hugging Face folder (formats/hf.py). Subclasses set ``path``, ``metadata`` (key -> value) and
``tensors`` (name -> objects with ``.type``, ``.shape``, ``.n_bytes``, ``.data``)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ModelFormatError, UnsupportedError

_MISSING = object()


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

    def get_int(self, key: str, default: Any = _MISSING) -> Any:
        """An integer value; a per-layer array is accepted when all its values are the same."""
        v = self._number(key, default)
        if isinstance(v, float) and not (math.isfinite(v) and v == int(v)):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be a whole number, got {v!r}")
        if isinstance(v, np.ndarray):
            vals = set(int(x) for x in v.tolist())
            if len(vals) == 1:
                return vals.pop()
            raise UnsupportedError(f"{self.where or self.path}: '{key}' varies per layer ({sorted(vals)}); "
                                   f"shaderlm supports only uniform layers")
        return v if v is default else int(v)

    def get_float(self, key: str, default: Any = _MISSING) -> Any:
        v = self._number(key, default)
        if v is not default and not math.isfinite(float(v)):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be a finite number, got {v!r}")
        return v if v is default else float(v)

    def _number(self, key: str, default: Any):
        v = self.metadata.get(key, _MISSING)
        if v is _MISSING or v is None:
            if default is _MISSING:
                self.require(key)
            return default
        if isinstance(v, np.ndarray) and v.dtype.kind in "iuf":
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelFormatError(f"{self.where or self.path}: '{key}' should be a number, got {v!r}")
        return v

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
