"""Target: a Hugging Face folder opened as a model (open_model(folder): config.json, the safetensors
files or their index, tokenizer.json, tokenizer_config.json) with one file replaced, and its tokenizer
used once. An input is one byte choosing the (folder, file) of tiny.hf_inputs, then the file's bytes.

    python fuzz/hf_folder.py CORPUS [libFuzzer flags]      (seeds: python fuzz/corpus.py)
"""
import os
import random
import shutil

import atheris

import harness
import mutate
import tiny
from shaderlm.models.loading import open_model

BASE = tiny.hf_folders(harness.scratch("base"))
INPUTS = tiny.hf_inputs(BASE)
WORK = {name: shutil.copytree(path, harness.scratch(os.path.join("work", name))) for name, path in BASE.items()}
_changed = []         # the file the last input replaced, put back before the next


def one(data: bytes) -> None:
    for name, fname in _changed:
        harness.write(os.path.join(WORK[name], fname), open(os.path.join(BASE[name], fname), "rb").read())
    _changed[:] = [INPUTS[data[0] % len(INPUTS)] if data else INPUTS[0]]
    name, fname = _changed[0]
    harness.write(os.path.join(WORK[name], fname), data[1:])
    harness.use_tokenizer(open_model(WORK[name]).tokenizer)


def mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if data and rng.random() < 0.8:
        fname = INPUTS[data[0] % len(INPUTS)][1]
        body = data[1:]
        out = mutate.mutate_safetensors(body, rng) if fname.endswith(".safetensors") else mutate.mutate_json(body, rng)
        if out is not None and len(out) < max_size:
            return data[:1] + out
    return atheris.Mutate(data, max_size)


if __name__ == "__main__":
    harness.fuzz(one, mutator)
