"""The user-facing model: tokenizer + a model on the GPU + generator, with text in and text out."""
from __future__ import annotations

import os
import sys

from ..models import load, open_model
from ..models.loading import default_model_path
from ..options import Options
from .generate import Generator, Sampling
from .text import TextStream


class Model:
    def __init__(self, path=None, *, options: Options | None = None, ctx=None, batch=None, tokens_per_submit=8,
                 progress=True, quantize=None):
        self.options = options or Options.from_env()
        self.path = os.fspath(path or default_model_path())
        opened = open_model(self.path, quantize)
        self.arch = opened.arch.gguf_arch
        self.config = opened.args
        self.metadata = opened.metadata
        self.tokenizer = opened.tokenizer
        bar = _Progress(sum(t.n_bytes for t in opened.source.tensors.values()), os.path.basename(self.path)) \
            if progress else None
        self.net = load(opened, self.options, ctx=ctx, batch=batch, progress=bar.update if bar else None)
        if bar:
            bar.close()
        self.device = self.net.dev
        self.generator = Generator(self.net, tokens_per_submit)

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
        """Yield pieces of text as they are generated (never half a UTF-8 character, never part of a
        stop string)."""
        ids = prompt if _is_ids(prompt) else self.encode_prompt(prompt, raw=raw)
        text = TextStream(self.tokenizer, stop)
        gen = self.generator.generate(ids, max_tokens, Sampling(temperature, top_k, top_p, seed),
                                      stop_ids=self.tokenizer.eos_ids, keep_history=keep_history)
        for tok in gen:
            piece = text.push(tok)
            if piece:
                yield piece
            if text.stopped:
                self.generator.stats.stop_reason = "stop"
                gen.close()
                return
        piece = text.finish()
        if piece:
            yield piece

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
