"""The valid models the targets start from, made by shaderlm's own generator (shaderlm.synth): a GGUF
file per architecture plus a SentencePiece variant, and Hugging Face folders (one weights file, and
sharded with an index). GGUF metadata is also handled here as (value, type, element type) per key, the
way gguf's GGUFWriter takes it, so that a target can change a value and write the file again."""
from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

import gguf
from gguf import GGUFValueType as T

from shaderlm.formats.gguf import write_tensor_data
from shaderlm.synth import write_synthetic_gguf, write_synthetic_hf

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
# the tiny preset, narrower: every input then runs in milliseconds
SMALL = dict(dim=32, n_heads=2, n_kv_heads=1, head_dim=16, ffn_dim=32, n_layers=2)
HF_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors")
INDEX = "model.safetensors.index.json"

Meta = dict[str, tuple[Any, T, "T | None"]]          # key -> (value, type, element type of an array)
Tensors = list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType, bytes]]


def gguf_models(folder: str) -> dict[str, str]:
    """name -> path of a tiny GGUF: one per architecture, and "llama-spm" (a SentencePiece vocabulary)."""
    os.makedirs(folder, exist_ok=True)
    out = {a: write_synthetic_gguf(os.path.join(folder, f"{a}.gguf"), arch=a, preset="tiny", **SMALL)
           for a in ARCHS}
    meta, tensors = read_gguf(out["llama"])
    out["llama-spm"] = os.path.join(folder, "llama-spm.gguf")
    write_gguf(out["llama-spm"], with_spm_vocabulary(meta), tensors)
    return out


def hf_folders(folder: str) -> dict[str, str]:
    """name -> a tiny Hugging Face folder: one per architecture, and "llama-sharded" (with an index)."""
    out = {a: write_synthetic_hf(os.path.join(folder, a), arch=a, preset="tiny", dtype="F16", **SMALL)
           for a in ARCHS}
    out["llama-sharded"] = write_synthetic_hf(os.path.join(folder, "llama-sharded"), arch="llama", preset="tiny",
                                              dtype="F16", shard_bytes=16 << 10, **SMALL)
    return out


def hf_inputs(folders: dict[str, str]) -> list[tuple[str, str]]:
    """The (folder name, file name) pairs the folder target replaces, in a fixed order (its selector):
    every file of the one-file folders, the index and JSON files of the sharded one."""
    return [(name, f) for name, path in folders.items() for f in sorted(os.listdir(path))
            if f in HF_FILES or f == INDEX]


# ---- GGUF metadata as values to rewrite ----------------------------------------------------------

def read_gguf(path: str) -> tuple[Meta, Tensors]:
    r = gguf.GGUFReader(path)
    meta: Meta = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        v = field.contents()
        v = [x.encode() if isinstance(x, str) else x for x in v] if isinstance(v, list) else \
            v.encode() if isinstance(v, str) else v
        meta[key] = (v, field.types[0], field.types[1] if len(field.types) > 1 else None)
    tensors = [(t.name, tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type, t.data.tobytes())
               for t in r.tensors]
    return meta, tensors


_NUMPY = {T.UINT8: "<u1", T.INT8: "<i1", T.UINT16: "<u2", T.INT16: "<i2", T.UINT32: "<u4", T.INT32: "<i4",
          T.UINT64: "<u8", T.INT64: "<i8", T.FLOAT32: "<f4", T.FLOAT64: "<f8", T.BOOL: "?"}


class _Writer(gguf.GGUFWriter):
    """GGUFWriter, plus the empty arrays it refuses to write (a file may hold them all the same), and
    flat arrays packed in one go (element by element, a vocabulary takes longer than reading it back)."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype != T.ARRAY or (val and sub_type not in _NUMPY and sub_type != T.STRING):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        out = (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", sub_type or T.INT32) + \
            self._pack("Q", len(val))
        if sub_type == T.STRING:
            return out + b"".join(struct.pack("<Q", len(s)) + s for s in val)
        return out + np.asarray(val, dtype=_NUMPY.get(sub_type, "<i4")).tobytes()


def write_gguf(path: str, meta: Meta, tensors: Tensors) -> None:
    w = _Writer(path, arch="")
    w.kv_data[0].clear()             # general.architecture is the metadata's, if any
    for key, (v, vtype, sub) in meta.items():
        w.add_key_value(key, v, vtype, sub)
    for name, shape, qtype, data in tensors:
        w.add_tensor_info(name, shape, np.dtype(np.float32), len(data), raw_dtype=qtype)
    try:
        write_tensor_data(w, ((name, len(data), [np.frombuffer(data, np.uint8)]) for name, _, _, data in tensors),
                          sum(len(t[3]) for t in tensors))
    finally:
        w.close()


def with_spm_vocabulary(meta: Meta) -> Meta:
    """The same model with a SentencePiece ("llama" kind) vocabulary of the same size."""
    n = len(meta["tokenizer.ggml.tokens"][0])
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "▁abcdefghijklmnopqrstuvwxyz"
    pieces = list(letters) + [a + b for a in letters for b in letters]
    tokens += pieces[:n - len(tokens)]
    types += [1] * (n - len(types))
    out = {k: v for k, v in meta.items() if not k.startswith("tokenizer.ggml.")}
    out.update({
        "tokenizer.ggml.model": (b"llama", T.STRING, None),
        "tokenizer.ggml.tokens": ([t.encode() for t in tokens], T.ARRAY, T.STRING),
        "tokenizer.ggml.token_type": (types, T.ARRAY, T.INT32),
        "tokenizer.ggml.scores": ([-float(i) for i in range(n)], T.ARRAY, T.FLOAT32),
        "tokenizer.ggml.bos_token_id": (1, T.UINT32, None),
        "tokenizer.ggml.eos_token_id": (2, T.UINT32, None),
        "tokenizer.ggml.unknown_token_id": (0, T.UINT32, None),
        "tokenizer.ggml.add_space_prefix": (True, T.BOOL, None),
        "tokenizer.ggml.add_bos_token": (True, T.BOOL, None),
    })
    return out
