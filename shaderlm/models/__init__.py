"""The architectures: one module each in this folder, found here by their class attributes.

A module registers its architecture by defining a Transformer subclass with a `gguf_arch`; nothing
else names it (docs/adding-a-model.md). `open_model` reads a GGUF file or a Hugging Face folder into
(architecture, args, tensors under GGUF names, tokenizer); `load` puts it on the GPU.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import UnsupportedError
from .transformer import PREFILL_CHUNK, Transformer  # noqa: F401

_INFRA = {"args", "loading", "transformer"}


def architectures() -> dict[str, type[Transformer]]:
    """gguf_arch -> Transformer subclass, for every architecture module in this folder."""
    global _ARCHS
    if _ARCHS is None:
        found = {}
        for m in pkgutil.iter_modules(__path__):
            if m.name in _INFRA:
                continue
            mod = importlib.import_module(f"{__name__}.{m.name}")
            for v in vars(mod).values():
                if isinstance(v, type) and issubclass(v, Transformer) and v.gguf_arch and v.__module__ == mod.__name__:
                    found[v.gguf_arch] = v
        _ARCHS = dict(sorted(found.items()))
    return _ARCHS


_ARCHS = None


def register(cls: type[Transformer]) -> type[Transformer]:
    """Add an architecture defined outside this folder (a plugin); usable as a class decorator."""
    architectures()[cls.gguf_arch] = cls
    return cls


def for_gguf(arch: str, path: str = "") -> type[Transformer]:
    cls = architectures().get(arch)
    if cls is None:
        raise UnsupportedError(f"{path}: architecture '{arch}' is not supported; supported: "
                               f"{', '.join(architectures())}")
    return cls


def for_hf(architecture: str | None, model_type: str | None, path: str = "") -> type[Transformer]:
    """By config.json's architectures[0], else its model_type."""
    for cls in architectures().values():
        if architecture in cls.hf_architectures if architecture else model_type in cls.hf_model_types:
            return cls
    names = [n for c in architectures().values() for n in c.hf_architectures]
    raise UnsupportedError(f"{path}: architecture {architecture or model_type!r} is not supported; supported: "
                           f"{', '.join(names)}")


def preset(name: str) -> tuple[type[Transformer], dict]:
    """The architecture that defines synthetic preset `name`, and the preset."""
    for cls in architectures().values():
        if name in cls.presets and not name.startswith("tiny"):
            return cls, cls.presets[name]
    raise KeyError(name)


from .loading import load, open_model  # noqa: E402

__all__ = ["Transformer", "architectures", "register", "for_gguf", "for_hf", "preset", "open_model", "load"]
