"""Seed corpora for the targets, made by shaderlm's own generator at run time (no binary files in the repo).

    python fuzz/corpus.py OUT        writes OUT/<target>/seed-NNN for every target
"""
from __future__ import annotations

import os
import random
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny  # noqa: E402

TARGETS = ("gguf_file", "gguf_metadata", "safetensors_file", "hf_folder")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def seeds() -> dict[str, list[bytes]]:
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ggufs = tiny.gguf_models(os.path.join(tmp, "gguf"))
        folders = tiny.hf_folders(os.path.join(tmp, "hf"))
        return {
            "gguf_file": [_read(p) for p in ggufs.values()],
            # FuzzedDataProvider reads integers from the end: [0, i] is model i unchanged
            "gguf_metadata": [bytes([0, i]) for i in range(len(ggufs))]
            + [random.Random(i).randbytes(32) for i in range(16)],
            "safetensors_file": [_read(os.path.join(p, f)) for p in folders.values() for f in sorted(os.listdir(p))
                                 if f.endswith(".safetensors")],
            "hf_folder": [bytes([i]) + _read(os.path.join(folders[name], f))
                          for i, (name, f) in enumerate(tiny.hf_inputs(folders))],
        }


def write_corpus(out: str, targets=TARGETS) -> str:
    for target, items in seeds().items():
        if target not in targets:
            continue
        folder = os.path.join(out, target)
        os.makedirs(folder, exist_ok=True)
        for i, data in enumerate(items):
            with open(os.path.join(folder, f"seed-{i:03d}"), "wb") as f:
                f.write(data)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    write_corpus(sys.argv[1])
