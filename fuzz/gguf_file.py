"""Target: a GGUF file opened as a model (shaderlm.models.loading.open_model: the GGUF reader, the
architecture's args, the tensor checks, the tokenizer) and its tokenizer used once.

    python fuzz/gguf_file.py CORPUS [libFuzzer flags]      (seeds: python fuzz/corpus.py)
"""
import random

import atheris

import harness
from shaderlm.models.loading import open_model

PATH = harness.scratch("model.gguf")


def one(data: bytes) -> None:
    harness.write(PATH, data)
    harness.use_tokenizer(open_model(PATH).tokenizer)


def mutator(data: bytes, max_size: int, seed: int) -> bytes:
    # the header, metadata and tensor infos come first: most mutations go there, not into weight bytes
    rng = random.Random(seed)
    cut = min(len(data), rng.choice((64, 1024, 8192, 8192, len(data))))
    if len(data) > max_size or cut == len(data):
        return atheris.Mutate(data, max_size)
    return atheris.Mutate(data[:cut], max_size - (len(data) - cut)) + data[cut:]


if __name__ == "__main__":
    harness.fuzz(one, mutator)
