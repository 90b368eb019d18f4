"""Target: the model args and the tokenizer built from GGUF metadata with values of the wrong type, size
or sign (open_model: gguf_args, the tensor checks, Tokenizer.from_metadata; and Tokenizer.from_gguf:
read_gguf_metadata + from_metadata), each tokenizer used once.

An input is a recipe read with atheris.FuzzedDataProvider: which tiny model, then one to three edits
(a key, existing or one the readers look for, deleted or given a value of any GGUF type). The model is
written back with gguf's GGUFWriter, so every finding is a file on disk.

    python fuzz/gguf_metadata.py CORPUS [libFuzzer flags]      (seeds: python fuzz/corpus.py)
"""
import atheris

import harness
import mutate
import tiny
from shaderlm.formats.tokenizer import Tokenizer
from shaderlm.models.loading import open_model

BASES = [tiny.read_gguf(p) for p in tiny.gguf_models(harness.scratch("base")).values()]
PATH = harness.scratch("model.gguf")


def edited(data: bytes):
    """The recipe's model: (metadata, tensors)."""
    fdp = atheris.FuzzedDataProvider(data)
    meta, tensors = BASES[fdp.ConsumeIntInRange(0, len(BASES) - 1)]
    meta = dict(meta)
    keys = sorted(set(meta) | set(mutate.gguf_keys(meta["general.architecture"][0].decode())))
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        key = fdp.PickValueInList(keys)
        if fdp.ConsumeIntInRange(0, 7) == 0:
            meta.pop(key, None)
        else:
            meta[key] = mutate.gguf_value(fdp, meta.get(key))
    return meta, tensors


def one(data: bytes) -> None:
    tiny.write_gguf(PATH, *edited(data))
    harness.each(lambda: harness.use_tokenizer(open_model(PATH).tokenizer),
                 lambda: harness.use_tokenizer(Tokenizer.from_gguf(PATH)))


if __name__ == "__main__":
    harness.fuzz(one)
