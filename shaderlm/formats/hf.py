"""Hugging Face checkpoint folders as they are: config.json, *.safetensors (+ index), tokenizer files.

Tensor names stay Hugging Face's (the wrappers of multimodal checkpoints, ``model.language_model.``
and ``language_model.``, are taken off); an architecture in models/ maps them to its own.
``metadata`` is the text model's settings (config.json, or its ``text_config`` where a multimodal
checkpoint nests them), read with ModelSource's checked accessors.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ..errors import ModelFormatError
from .safetensors import SafetensorsFile
from .source import ModelSource

__all__ = ["HFFolder", "read_json"]

# multimodal wrappers keep the text model under another prefix
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."))


def read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ModelFormatError(f"{path}: missing ({what})") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFormatError(f"{path}: cannot read {what}: {e}") from None


def _text_name(name: str) -> str:
    for a, b in _PREFIXES:
        if name.startswith(a):
            return b + name[len(a):]
    return name


class HFFolder(ModelSource):
    """A Hugging Face checkpoint folder (see the module docstring). ``tensors`` maps names to
    safetensors tensors (``.dtype``, ``.shape``, ``.data``: a view into the file's map)."""

    def __init__(self, folder: str | os.PathLike):
        self.path = os.fspath(folder)
        if not os.path.isdir(self.path):
            raise ModelFormatError(f"{self.path}: not a folder")
        cfg_path = os.path.join(self.path, "config.json")
        if not os.path.exists(cfg_path):
            raise ModelFormatError(f"{self.path}: no config.json: not a Hugging Face checkpoint folder "
                                   f"(give a .gguf file or a folder with config.json and *.safetensors)")
        self.where = cfg_path
        raw = read_json(cfg_path, "the model's config.json")
        if not isinstance(raw, dict):
            raise ModelFormatError(f"{cfg_path}: not a JSON object")
        self.config = raw
        text = raw.get("text_config")
        if text is not None and not isinstance(text, dict):
            raise ModelFormatError(f"{cfg_path}: 'text_config' is not a JSON object")
        self.metadata = dict(text) if text is not None else raw
        self.files = self._open_files()
        self.tensors: dict = {}
        self._file_of: dict = {}
        for f in self.files:
            for name, st in f.tensors.items():
                key = _text_name(name)
                if key in self.tensors:
                    raise ModelFormatError(f"{self.path}: tensor {name} appears twice")
                self.tensors[key] = st
                self._file_of[id(st)] = f

    @property
    def architecture(self) -> str | None:
        """config.json's ``architectures[0]`` (a transformers class name), or None."""
        archs = self.config.get("architectures")
        if archs is None:
            return None
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise ModelFormatError(f"{self.where}: 'architectures' should be a list of class names, got {archs!r}")
        return archs[0]

    @property
    def model_type(self) -> str | None:
        v = self.config.get("model_type")
        return v if isinstance(v, str) else None

    def _open_files(self) -> list[SafetensorsFile]:
        idx = os.path.join(self.path, "model.safetensors.index.json")
        if os.path.exists(idx):
            index = read_json(idx, "the safetensors index")
            wm = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(wm, dict) or not wm:
                raise ModelFormatError(f"{idx}: no 'weight_map'")
            if not all(isinstance(v, str) and v and os.path.basename(v) == v for v in wm.values()):
                raise ModelFormatError(f"{idx}: 'weight_map' values should be file names in the folder")
            names = sorted(set(wm.values()))
            for n in names:
                if not os.path.exists(os.path.join(self.path, n)):
                    raise ModelFormatError(f"{self.path}: {n} is listed in model.safetensors.index.json but missing")
        else:
            names = sorted(n for n in os.listdir(self.path) if n.endswith(".safetensors"))
            if not names:
                other = [n for n in os.listdir(self.path) if n.endswith((".bin", ".pt", ".pth"))]
                hint = f" (found {other[0]}: PyTorch pickles are not read; save with safe_serialization)" if other else ""
                raise ModelFormatError(f"{self.path}: no *.safetensors weights{hint}")
        return [SafetensorsFile(os.path.join(self.path, n)) for n in names]

    def release(self, st) -> None:
        """Drop the pages of safetensors tensor ``st`` from RAM (it is on the GPU now)."""
        f = self._file_of.get(id(st))
        if f is not None:
            f.release(st)

    def tokenizer(self, n_vocab: int | None = None):
        from .hf_tokenizer import HFTokenizer
        return HFTokenizer.from_folder(self.path, self.metadata, n_vocab=n_vocab)
