"""Target: shaderlm.formats.safetensors.SafetensorsFile on a file, and its float tensors read.

    python fuzz/safetensors_file.py CORPUS [libFuzzer flags]      (seeds: python fuzz/corpus.py)
"""
import random

import atheris

import harness
import mutate
from shaderlm.formats.safetensors import FLOAT_DTYPES, SafetensorsFile

PATH = harness.scratch("model.safetensors")


def one(data: bytes) -> None:
    harness.write(PATH, data)
    for t in SafetensorsFile(PATH).tensors.values():
        if t.dtype in FLOAT_DTYPES:
            t.to_numpy()


def mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    if rng.random() < 0.7:
        out = mutate.mutate_safetensors(data, rng)
        if out is not None and len(out) <= max_size:
            return out
    return atheris.Mutate(data, max_size)


if __name__ == "__main__":
    harness.fuzz(one, mutator)
