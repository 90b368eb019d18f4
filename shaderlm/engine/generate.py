"""Token-level generation over a Transformer's plans: prefill, decode N tokens per submit, logits.

The sampler runs on the GPU and writes each new token into the token buffer, where the next step's
embedding reads it, so a submit of N decode steps needs no host round trip; only token ids come back,
copied at the end of each batch into a small mapped buffer. Two batches stay queued on the GPU (so it
never waits for this thread between them) while the CPU encodes the next. A batch queued past a stop
runs to no effect: its tokens are never read, and the cache positions it writes are past the kept
history, so the next request overwrites them.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import ContextFullError
from .runner import Runner


@dataclass
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Stats:
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    submits: int = 0
    encode_s: float = 0.0     # CPU time spent recording decode batches (overlaps the GPU's work)
    stop_reason: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def prompt_tps(self):
        return self.prompt_tokens / self.prompt_s if self.prompt_s else 0.0

    @property
    def decode_tps(self):
        return self.decode_tokens / self.decode_s if self.decode_s else 0.0


class Generator:
    def __init__(self, runner: Runner, tokens_per_submit: int = 8, batches_in_flight: int = 2):
        self.m = runner
        self.k = max(1, tokens_per_submit)
        self.history: list[int] = []      # tokens whose K/V are in the cache, in order
        self.stats = Stats()
        self.depth = max(1, batches_in_flight)
        # one readback per batch in flight, one for the batch being recorded
        runner.prepare_decode(self.k, self.depth + 1)

    @property
    def ctx(self):
        return self.m.ctx

    def reset(self):
        self.history = []

    def _common_prefix(self, ids) -> int:
        n = 0
        for a, b in zip(self.history, ids):
            if a != b:
                break
            n += 1
        return min(n, len(ids) - 1)      # always run at least one token to get fresh logits

    def _record(self, pos: int, k: int):
        """A batch feeding the token at `pos` and sampling k more, recorded while the GPU runs."""
        t0 = time.perf_counter()
        batch = self.m.record_decode(pos, k)
        self.stats.encode_s += time.perf_counter() - t0
        return pos, k, batch

    def logits(self, ids) -> np.ndarray:
        """Logits for every position of `ids` (a fresh sequence), shape (len, vocab)."""
        out = self.m.logits(list(ids))
        self.history = list(ids)
        return out

    def generate(self, prompt_ids, max_tokens: int, sampling: Sampling | None = None,
                 stop_ids=(), keep_history=True):
        """Yield generated token ids. Reuses the cached prefix shared with the previous call."""
        sampling = sampling or Sampling()
        prompt_ids = list(prompt_ids)
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        if len(prompt_ids) > self.ctx:
            raise ContextFullError(f"prompt of {len(prompt_ids)} tokens does not fit the context of "
                                   f"{self.ctx} tokens (use --ctx to raise it, up to the model's "
                                   f"{self.m.context_length})")
        self.stats = st = Stats(prompt_tokens=len(prompt_ids))
        self.m.set_sampling(sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed)
        reuse = self._common_prefix(prompt_ids) if keep_history else 0
        seq = prompt_ids[:]                        # prompt + generated; positions < pos are in the cache
        pos = len(prompt_ids)                      # where the next sampled token sits (not yet fed)
        t0 = time.perf_counter()
        try:
            st.submits += self.m.prefill(prompt_ids[reuse:], reuse, sample=True)
            if max_tokens <= 0:
                st.stop_reason = "length"
                return
            pending = self.m.read_tokens(pos, 1)
            st.prompt_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            st.decode_tokens = 1
            stop_ids = set(stop_ids)
            last = len(prompt_ids) + max_tokens - 1     # position of the final token asked for
            end = pos                   # tokens up to `end` are sampled or being sampled on the GPU
            inflight = deque()          # submitted batches, oldest first
            ahead = None                # the next batch, encoded while the GPU runs
            n0 = st.submits

            def encode_next():
                # sizes 1, 2, 4, ... up to k: the first batch is encoded while the GPU is idle (a
                # 1B step encodes in about 0.3 ms), later ones while earlier ones run
                return self._record(end, min(self.k, 1 << (st.submits - n0), last - end, self.ctx - end))
            while True:
                for tok in pending:
                    if tok in stop_ids:
                        st.stop_reason = "eos"
                        return
                    seq.append(tok)
                    yield tok
                    if len(seq) - len(prompt_ids) >= max_tokens:
                        st.stop_reason = "length"
                        return
                if pos >= self.ctx:             # the sampled token has no cache slot left
                    st.stop_reason = "context"
                    return
                # keep `depth` batches queued, so the GPU never waits for this thread between them;
                # a batch feeding the token at q samples q+1 .. q+k (k <= ctx - q: cache slots)
                while len(inflight) < self.depth and end < min(last, self.ctx):
                    ahead = ahead or encode_next()
                    self.m.submit_decode(ahead[2])
                    inflight.append(ahead)
                    st.submits += 1
                    end += ahead[1]
                    ahead = None
                # while the GPU runs them, encode the next
                if end < min(last, self.ctx):
                    ahead = encode_next()
                q, k, batch = inflight.popleft()
                pending = self.m.decoded_tokens(batch)
                st.decode_tokens += k
                pos = q + k
                st.decode_s = time.perf_counter() - t1
        finally:
            if st.decode_tokens and "t1" in locals():
                st.decode_s = time.perf_counter() - t1
            self.history = seq[:pos]
