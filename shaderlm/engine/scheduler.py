"""Many requests on one GPU: continuous batching over a paged KV cache.

One thread owns the GPU. Requests wait in a bounded queue; a request is admitted when a sequence slot
is free and the KV pool can promise the pages its prompt and completion may need (reusing cached
pages of an equal prompt prefix). Prompts are prefilled between decode batches, so running streams
keep flowing: a round's prompt pass takes the next tokens of the waiting prompts, up to a chunk in all
(many short prompts in one pass, a long one a chunk a round). A prompt done joins the decode batch,
which advances every running sequence one token a step, several steps a submit, two submits queued
on the GPU while the next is recorded. Tokens come back per sequence, are checked for the end
(end-of-generation token, stop string, max_tokens, a cancel) and go out as text events. A sequence
that has ended is dropped from the next batch; its slot and pages are freed once no batch in flight
still computes it.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import queue
import random
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field


from ..errors import ContextFullError
from ..models.serving import PromptPart, Serving
from ..options import Options
from .model import Model
from .pages import PagePool
from .requests import EngineClosedError, Event, QueueFullError, Request, TokenLogprob
from .text import TextStream

_ids = itertools.count(1)


class Stream:
    """A request's events, in order; iterate (blocking) or `async for` (asyncio). cancel() ends it."""

    def __init__(self, engine: "Engine", seq: "Sequence"):
        self.id = f"{seq.id}"
        self._engine, self._seq = engine, seq
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._waiters: list = []             # asyncio futures waiting for the next event
        self._lock = threading.Lock()
        self.done = False

    def _put(self, ev: Event):
        with self._lock:
            self._q.put(ev)
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_wake, fut)

    def __iter__(self):
        while not self.done:
            ev = self._q.get()
            self.done = ev.finish_reason is not None
            yield ev

    async def __aiter__(self):
        loop = asyncio.get_running_loop()
        while not self.done:
            with self._lock:
                try:
                    ev = self._q.get_nowait()
                except queue.Empty:
                    fut = loop.create_future()
                    self._waiters.append((loop, fut))
                    ev = None
            if ev is None:
                await fut
                continue
            self.done = ev.finish_reason is not None
            yield ev

    def ready(self) -> list[Event]:
        """The events already here, without waiting (for a reader that passes them on in batches)."""
        events = []
        while not self.done:
            try:
                ev = self._q.get_nowait()
            except queue.Empty:
                break
            self.done = ev.finish_reason is not None
            events.append(ev)
        return events

    def cancel(self):
        self._engine._cancel(self._seq)


def _wake(fut):
    if not fut.done():
        fut.set_result(None)


@dataclass
class Sequence:
    id: str
    request: Request
    prompt: list[int]
    max_tokens: int
    stream: Stream | None = None
    text: TextStream | None = None
    slot: int = -1
    pages: list = field(default_factory=list)
    reserved: int = 0                # pages promised, not yet allocated
    cached: int = 0                  # prompt tokens found in the prefix cache
    prefilled: int = 0               # prompt tokens whose K/V are on the GPU
    pos: int = 0                     # position of the token the next submitted step feeds
    generated: int = 0               # tokens handed out
    in_flight: int = 0               # submitted batches that compute this sequence
    finish: str | None = None        # why it ended (no more tokens are taken)
    cancelled: bool = False
    t_submit: float = 0.0

    def wanted(self) -> int:
        """Tokens still to sample that no submitted step samples (the first came with the prompt)."""
        return self.max_tokens - (1 + self.pos - len(self.prompt))


class Engine:
    """`shaderlm serve`'s engine, and the Python API for many prompts at once (submit, then iterate
    each stream). `parallel` sequences decode together, each up to `ctx` tokens (prompt and
    completion); `queue` more may wait; `kv_pages` bounds the KV pool (default: room for every
    sequence to be full)."""

    def __init__(self, path=None, *, options: Options | None = None, parallel: int = 8, ctx: int = 4096,
                 kv_pages: int | None = None, queue_size: int = 64, tokens_per_submit: int = 8,
                 prefill_chunk: int = 256, page: int = 16, progress: bool = True, quantize=None, log=None,
                 batches_in_flight: int = 2):
        self.model = Model(path, options=options, ctx=max(prefill_chunk, 64), batch=prefill_chunk,
                           tokens_per_submit=tokens_per_submit, progress=progress, quantize=quantize)
        net = self.model.net
        self.tokenizer = self.model.tokenizer
        self.model_name = os.path.basename(os.path.normpath(self.model.path))
        self.ctx = min(ctx, net.context_length)
        self.parallel = parallel
        # decode batches kept queued on the GPU; a sequence may run that many past its end
        self.depth = max(1, batches_in_flight)
        self.runner = Serving(net, slots=parallel, seq_ctx=self.ctx, pages=kv_pages, page=page,
                              steps_ahead=self.depth * tokens_per_submit, tokens_per_submit=tokens_per_submit,
                              in_flight=self.depth)
        self.pool = PagePool(self.runner.n_pages, page)
        self.chunk = prefill_chunk
        self.k = tokens_per_submit
        self.ramp = 1                         # steps of the next decode batch while ramping up to k
        self.queue_size = queue_size
        self.free_slots = list(range(parallel - 1, -1, -1))
        self.waiting: deque = deque()
        self.prefilling: deque = deque()
        self.running: list[Sequence] = []
        self.draining: list[Sequence] = []
        self.in_flight: deque = deque()
        self.totals = dict(requests=0, prompt_tokens=0, completion_tokens=0, cached_tokens=0)
        self._recent: deque = deque()         # (time, tokens) of the last decode batches
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="shaderlm-engine", daemon=True)
        self._thread.start()
        if log:
            log(self.describe())

    def describe(self) -> str:
        r = self.runner
        return (f"{self.model_name} on {self.model.device.name}: {self.parallel} sequences of up to {self.ctx} "
                f"tokens; KV cache {r.n_pages} pages of {r.page} tokens ({r.kv_bytes / 2**20:,.0f} MiB)")

    # ---- the API ---------------------------------------------------------------------------------
    def submit(self, request: Request) -> Stream:
        prompt = [int(t) for t in request.prompt_ids]
        if not prompt:
            raise ValueError("empty prompt: give at least one token")
        if any(not 0 <= t < self.tokenizer.vocab_size for t in prompt):
            raise ValueError(f"a prompt token id is outside the vocabulary (0..{self.tokenizer.vocab_size - 1})")
        if len(prompt) >= self.ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens; this server's context holds {self.ctx} "
                                   f"(prompt and completion)")
        if request.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if request.logprobs is not None and not 0 <= request.logprobs <= self.runner.max_top_logprobs:
            raise ValueError(f"logprobs {request.logprobs}: the most likely tokens given are 0 to "
                             f"{self.runner.max_top_logprobs}")
        seq = Sequence(id=f"seq-{next(_ids)}", request=request, prompt=prompt,
                       max_tokens=min(request.max_tokens, self.ctx - len(prompt)), t_submit=time.perf_counter())
        seq.stream = Stream(self, seq)
        seq.text = TextStream(self.tokenizer, request.stop)
        with self._cv:
            if self._closed:
                raise EngineClosedError("the engine has stopped")
            if len(self.waiting) >= self.queue_size:
                raise QueueFullError(f"{len(self.waiting)} requests are waiting, the most this server queues")
            self.waiting.append(seq)
            self.totals["requests"] += 1
            self._cv.notify()
        return seq.stream

    def generate(self, requests: list[Request]) -> list[str]:
        """Each request's whole completion text (they run together)."""
        streams = [self.submit(r) for r in requests]
        return ["".join(ev.text for ev in s) for s in streams]

    def stats(self) -> dict:
        with self._cv:
            now = time.perf_counter()
            recent = [(t, n) for t, n in self._recent if now - t < 5.0]
            span = now - recent[0][0] if recent else 0.0
            return dict(running=len(self.running) + len(self.prefilling), waiting=len(self.waiting),
                        kv_pages_used=self.pool.used, kv_pages_total=self.pool.n_pages,
                        prompt_tokens_total=self.totals["prompt_tokens"],
                        completion_tokens_total=self.totals["completion_tokens"],
                        cached_prompt_tokens_total=self.totals["cached_tokens"],
                        requests_total=self.totals["requests"], parallel=self.parallel,
                        decode_tokens_per_second=sum(n for _, n in recent) / span if span > 0.5 else 0.0,
                        closed=self._closed)

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=60)

    def _cancel(self, seq: Sequence):
        with self._cv:
            seq.cancelled = True
            self._cv.notify()

    # ---- the GPU thread --------------------------------------------------------------------------
    def _loop(self):
        while True:
            try:
                with self._cv:
                    while not self._closed and not (self.waiting or self.prefilling or self.running
                                                    or self.in_flight):
                        self._cv.wait()
                    if self._closed:
                        break
                    self._drop_cancelled_waiting()
                    self._admit()
                self._step()
            except Exception as e:  # noqa: BLE001 - a failed step ends its sequences, not the server
                traceback.print_exc()
                self._fail_all(f"{type(e).__name__}: {e}")
        self._fail_all("the engine stopped")

    def _drop_cancelled_waiting(self):
        for seq in [s for s in self.waiting if s.cancelled]:
            self.waiting.remove(seq)
            self._finish(seq, "cancelled")

    def _pages_for(self, n_positions: int) -> int:
        return -(-n_positions // self.pool.page)

    def _admit(self):
        """Waiting sequences into free slots, in order, while the pool can promise their pages."""
        while self.waiting and self.free_slots:
            seq = self.waiting[0]
            cached = self.pool.match(seq.prompt)
            need = self._pages_for(len(seq.prompt) + seq.max_tokens + self.depth * self.k) - len(cached)
            if not self.pool.reserve(need):
                self.pool.release(cached)
                break
            self.waiting.popleft()
            seq.slot, seq.pages, seq.reserved = self.free_slots.pop(), cached, need
            seq.cached = seq.prefilled = len(cached) * self.pool.page
            self.totals["cached_tokens"] += seq.cached
            self.prefilling.append(seq)

    def _ensure_pages(self, seq: Sequence, positions: int):
        """seq's table covers positions [0, positions)."""
        more = self._pages_for(positions) - len(seq.pages)
        if more > 0:
            new = self.pool.allocate(more)
            seq.reserved -= more
            seq.pages += new
            self.runner.set_pages(seq.slot, seq.pages)

    def _step(self):
        """One round: a prompt pass over the waiting prompts' next tokens, up to `chunk` of them in all
        (several short prompts at once, a long one a chunk a round), then decode batches kept in flight."""
        r = self.runner
        budget, parts, taken = self.chunk, [], []
        # a prompt being prefilled stays in `prefilling` (those done at its front), so that a failed step
        # fails it too
        while len(self.prefilling) > len(taken) and budget > 0:
            seq = self.prefilling[len(taken)]
            if seq.cancelled:
                del self.prefilling[len(taken)]
                self._end(seq, "cancelled")
                continue
            if seq.prefilled == seq.cached:
                req = seq.request
                seed = req.seed if req.seed is not None else random.randrange(1 << 32)
                r.set_sampling(seq.slot, req.temperature, req.top_k, req.top_p, seed, req.logprobs or 0)
                self._ensure_pages(seq, len(seq.prompt) + 1)
            end = min(len(seq.prompt), seq.prefilled + budget)
            parts.append(PromptPart(seq.slot, seq.prompt[seq.prefilled:end], seq.prefilled, end == len(seq.prompt),
                                    logprobs=seq.request.logprobs is not None))
            budget -= end - seq.prefilled
            taken.append(seq)
        if parts:
            r.prefill_pass(parts)
        prefilled = []
        for seq, part in zip(taken, parts):
            seq.prefilled += len(part.ids)
            if part.sample:
                self.pool.register(seq.prompt, seq.pages)
                seq.pos = len(seq.prompt)
                prefilled.append(seq)
        # prompts done join the decode batches now; where a token can be read without waiting for what
        # was submitted after it, their batches are queued behind the prefill before the first tokens are
        # read, so that the GPU goes on from the prompts to their decode steps without waiting for this
        # thread (a first token that ends its sequence leaves it a few steps to drop)
        for seq in prefilled:
            self.prefilling.popleft()
            self.running.append(seq)
        if r.reads_by_submission:
            self._queue_decode()
        for seq in prefilled:           # their first tokens, before any token of their decode steps
            first, lp = r.first_token(seq.slot, seq.request.logprobs)
            with self._cv:
                self.totals["prompt_tokens"] += len(seq.prompt) - seq.cached
            if seq.finish is None and not seq.cancelled:
                self._take(seq, first, lp)
        self._queue_decode()
        if self.in_flight:
            batch, seqs, positions = self.in_flight.popleft()
            tokens = r.tokens_of(batch)
            with self._cv:
                self._recent.append((time.perf_counter(), batch.n * batch.k))
                while len(self._recent) > 64:
                    self._recent.popleft()
            for i, s in enumerate(seqs):
                s.in_flight -= 1
                lps = None if s.request.logprobs is None else r.batch_logprobs(batch, i, s.request.logprobs)
                for j, tok in enumerate(tokens[i]):
                    if s.finish is not None or s.cancelled or not self._take(s, int(tok), None if lps is None else lps[j]):
                        break
        self._retire()

    def _drop_ended(self):
        """Sequences that ended (or were cancelled) leave the decode batch."""
        for s in [s for s in self.running if s.finish is not None or s.cancelled]:
            self.running.remove(s)
            self.draining.append(s)

    def _retire(self):
        """Sequences that ended leave the batch; once no batch in flight computes them, they end."""
        self._drop_ended()
        for s in [s for s in self.draining if s.in_flight == 0]:
            self.draining.remove(s)
            self._end(s, s.finish or "cancelled")

    def _queue_decode(self):
        """Keep `depth` decode batches queued (one, while a prompt waits for its next chunk)."""
        r = self.runner
        while len(self.in_flight) < (1 if self.prefilling else self.depth):
            self._drop_ended()
            live = [s for s in self.running if s.wanted() > 0]   # the rest wait for tokens in flight
            if not live:
                break
            # from an idle GPU (or one running only a prompt), batches of 1, 2, 4, .. steps, as single-stream
            # decode does: the first tokens reach their streams sooner
            if not self.in_flight:
                self.ramp = 1
            k = min(self.k, self.ramp, max(s.wanted() for s in live))   # the others compute a few past their end
            self.ramp = min(2 * self.ramp, self.k)
            for s in live:
                self._ensure_pages(s, s.pos + k)
            positions = [s.pos for s in live]
            batch = r.record([s.slot for s in live], positions, k,
                             logprobs=any(s.request.logprobs is not None for s in live))
            r.submit(batch)
            for s in live:
                s.pos += k
                s.in_flight += 1
            self.in_flight.append((batch, live, positions))

    def _take(self, seq: Sequence, tok: int, lp=None) -> bool:
        """Hand out token `tok` of seq (with its logprobs row `lp` where asked); False once seq has
        ended (its reason in seq.finish)."""
        if seq.request.stop_at_eos and tok in self.tokenizer.eos_ids:
            seq.finish = "stop"
            return False
        seq.generated += 1
        piece = seq.text.push(tok)
        if seq.text.stopped:
            seq.finish = "stop"
        elif seq.generated >= seq.max_tokens:
            seq.finish = "length"
        logprobs = [TokenLogprob(tok, *lp)] if lp is not None else []
        seq.stream._put(Event(text=piece, token_ids=[tok], logprobs=logprobs))
        return seq.finish is None

    def _end(self, seq: Sequence, reason: str):
        """seq is done: its slot and pages go back, its stream gets the last event."""
        self._give_back(seq)
        self._finish(seq, reason)

    def _give_back(self, seq: Sequence):
        """seq's pages, page reservation and slot go back to the engine."""
        self.pool.release(seq.pages)
        self.pool.unreserve(seq.reserved)
        seq.pages, seq.reserved = [], 0
        if seq.slot >= 0:
            self.free_slots.append(seq.slot)
            seq.slot = -1

    def _finish(self, seq: Sequence, reason: str, error: str | None = None):
        with self._cv:
            self.totals["completion_tokens"] += seq.generated
        tail = seq.text.finish() if reason in ("stop", "length") else ""
        seq.stream._put(Event(text=tail, finish_reason=reason, prompt_tokens=len(seq.prompt),
                              completion_tokens=seq.generated, error=error))

    def _fail_all(self, message: str):
        """Every sequence ends with an error event (a step failed, or the engine stopped)."""
        with self._cv:
            seqs = list(self.waiting) + list(self.prefilling) + self.running + self.draining
            self.waiting.clear()
            self.prefilling.clear()
            self.running, self.draining = [], []
            self.in_flight.clear()
        for seq in seqs:
            self._give_back(seq)
            self._finish(seq, "error", message)
