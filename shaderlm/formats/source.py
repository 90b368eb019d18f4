"""What an architecture reads from a model, whatever it came from: a GGUF file (formats/gguf.py) or a
Hugging Face folder (formats/hf.py). Subclasses set ``path``, ``arch``, ``metadata`` (GGUF keys) and
``tensors`` (GGUF tensor names -> objects with ``.type``, ``.shape``, ``.n_bytes``, ``.data``)."""
from __future__ import annotations

from typing import Any

from ..errors import ModelFormatError


class ModelSource:
    path: str
    arch: str
    metadata: dict
    tensors: dict

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise ModelFormatError(f"{self.path}: required metadata key '{key}' is missing")
        return self.metadata[key]

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
        return f"{type(self).__name__}({self.path!r}, arch={self.arch!r}, {len(self.tensors)} tensors)"
