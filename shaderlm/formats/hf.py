"""Hugging Face checkpoint folders as they are: config.json, *.safetensors (+ index), tokenizer files.

Tensor names stay Hugging Face's (the wrappers of multimodal checkpoints, ``model.language_model.``
and ``language_model.``, are taken off); an architecture in models/ maps them to its own.
``metadata`` is the text model's settings (config.json, or its ``text_config`` where a multimodal
checkpoint nests them), read with ModelSource's checked accessors.
"""
from __future__ import annotations

import json
import os
import reprlib
import stat
from typing import Any

from ..errors import ModelFormatError
from .safetensors import SafetensorsFile
from .source import ModelSource, open_regular

__all__ = ["HFFolder", "read_json"]

# multimodal wrappers keep the text model under another prefix
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.lm_head.", "lm_head."))


def read_json(path: str, what: str) -> Any:
    if not os.path.lexists(path):
        raise ModelFormatError(f"{path}: missing ({what})")
    try:
        with open_regular(path, "r", encoding="utf-8") as f:
            return json.load(f)
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
        indexed = os.path.lexists(idx)
        if indexed:
            index = read_json(self._weights_file("model.safetensors.index.json", "the index"), "the safetensors index")
            wm = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(wm, dict) or not wm:
                got = ("is missing" if wm is None else "is empty" if isinstance(wm, dict)
                       else f"is a {type(wm).__name__}")
                raise ModelFormatError(f"{idx}: 'weight_map' (tensor name -> file name) {got}")
            for v in wm.values():
                if not isinstance(v, str) or v in ("", ".", "..") or os.path.basename(v) != v or "\0" in v:
                    raise ModelFormatError(f"{idx}: 'weight_map' values should be file names in the folder, "
                                           f"not {reprlib.repr(v)}")
            names = sorted(set(wm.values()))
        else:
            names = sorted(n for n in os.listdir(self.path) if n.endswith(".safetensors"))
            if not names:
                other = [n for n in os.listdir(self.path) if n.endswith((".bin", ".pt", ".pth"))]
                hint = f" (found {other[0]}: PyTorch pickles are not read; save with safe_serialization)" if other else ""
                raise ModelFormatError(f"{self.path}: no *.safetensors weights{hint}")
        named_by = "listed in model.safetensors.index.json" if indexed else "in the folder"
        return [SafetensorsFile(self._weights_file(n, named_by)) for n in names]

    def _weights_file(self, name: str, named_by: str) -> str:
        """The path of file ``name`` of the folder, checked by stat before anything opens it (a FIFO would
        block the reader for ever): a regular file, not a link out of the folder (whether the index or the
        listing names it), except a hub cache snapshot's links to its blobs (snapshots/<rev>/f -> ../../blobs/)."""
        path = os.path.join(self.path, name)
        root = os.path.realpath(self.path)
        roots = [root]
        if os.path.basename(os.path.dirname(root)) == "snapshots":
            roots.append(os.path.join(os.path.dirname(os.path.dirname(root)), "blobs"))
        real = os.path.realpath(path)
        try:
            inside = any(os.path.commonpath([real, r]) == r for r in roots)
        except ValueError:                   # another drive
            inside = False
        if not inside:
            raise ModelFormatError(f"{self.path}: {reprlib.repr(name)} ({named_by}) links outside the folder")
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise ModelFormatError(f"{self.path}: {reprlib.repr(name)} ({named_by}) is missing") from None
        except OSError as e:
            raise ModelFormatError(f"{self.path}: cannot read {reprlib.repr(name)}: {e.strerror}") from None
        if not stat.S_ISREG(mode):
            raise ModelFormatError(f"{self.path}: {reprlib.repr(name)} ({named_by}) is not a regular file")
        return path

    def release(self, st) -> None:
        """Drop the pages of safetensors tensor ``st`` from RAM (it is on the GPU now)."""
        f = self._file_of.get(id(st))
        if f is not None:
            f.release(st)

    def tokenizer(self, n_vocab: int | None = None):
        from .hf_tokenizer import HFTokenizer
        return HFTokenizer.from_folder(self.path, self.metadata, n_vocab=n_vocab)
