"""Shared by the synthetic-model tests (test_model.py, test_archs.py): random token ids, the logit
tolerance, and a per-module cache of loaded models keyed by case name and load options."""
from __future__ import annotations

import numpy as np

import shaderlm

try:
    from reference import reference_logits
except ImportError:  # tests/ imported as a package
    from tests.reference import reference_logits

# The GPU keeps K/V in f16 (relative rounding 2^-11 ~ 4.9e-4) and sums in its own order; on these tiny
# models that moves logits by about 1e-4..1e-3 of their scale.
REL_TOL = 2e-3


def random_ids(vocab: int, n: int, seed: int) -> list:
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def logit_tol(ref) -> float:
    return REL_TOL * float(np.abs(ref).max())


def model_cache(synth_gguf, cases: dict):
    """get(name, **load_kw) -> (path, model): each case's GGUF written once (seed 1), each load once."""
    cache = {}

    def get(name, **kw):
        key = (name, tuple(sorted(kw.items())))
        if key not in cache:
            path = synth_gguf(seed=1, **cases[name])
            cache[key] = (path, shaderlm.load(path, progress=False, **kw))
        return cache[key]
    return get


def check_logits(path, model, name: str, n: int = 29, seed: int = 0):
    """The model's logits for n random tokens against the NumPy reference on the same file."""
    ids = random_ids(model.config.vocab_size, n, seed)
    ref = reference_logits(path, ids)
    got = model.logits(ids)
    err = np.abs(got - ref).max()
    assert np.isfinite(got).all()
    assert err <= logit_tol(ref), f"{name}: max |logit error| {err:.3g} > {logit_tol(ref):.3g}"
