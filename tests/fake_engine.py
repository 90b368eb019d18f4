"""A serving engine with the real one's interface (submit / Stream / stats / close) and no GPU, for the
server's tests.

It echoes: a completion is the prompt's ordinary (not special) tokens over and over, started `seed`
tokens in, so a test can say exactly what text comes back. One thread steps every running sequence
by a token every `token_delay` seconds, as continuous batching does; at most `parallel` run, at most
`max_waiting` wait (then QueueFullError). Stop strings are held back and cut as the real engine does.
`streams` keeps every stream submitted, so a test can check that each was finished or cancelled.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import socket
import threading
import time

from shaderlm.engine.requests import EngineClosedError, Event, QueueFullError, TokenLogprob
from shaderlm.errors import ContextFullError
from shaderlm.formats.tokenizer import StreamDecoder

PAGE = 16   # tokens per KV page, for stats()


class FakeStream:
    def __init__(self, engine: FakeEngine, request, sid: str):
        self.id, self.request, self.engine = sid, request, engine
        ids = [t for t in request.prompt_ids if not engine.tokenizer.is_special(t)] or [engine.tokenizer.eos_id]
        start = (request.seed or 0) % len(ids)
        self.reply = itertools.cycle(ids[start:] + ids[:start])
        self.decoder = StreamDecoder(engine.tokenizer)
        self.held = ""                  # text that may be the start of a stop string
        self.generated = 0
        self.cancel_called = False
        self.finish_reason: str | None = None
        self._events: collections.deque[Event] = collections.deque()
        self._cond = threading.Condition()
        self._wakers: set = set()       # (loop, asyncio.Event) of async readers

    # ---- the interface ---------------------------------------------------------------------------
    def cancel(self):
        self.cancel_called = True
        self.engine._wake()

    def __iter__(self):
        while True:
            with self._cond:
                while not self._events:
                    self._cond.wait()
                ev = self._events.popleft()
            yield ev
            if ev.finish_reason:
                return

    async def __aiter__(self):
        waker = (asyncio.get_running_loop(), asyncio.Event())
        with self._cond:
            self._wakers.add(waker)
        try:
            while True:
                with self._cond:
                    ev = self._events.popleft() if self._events else None
                    if ev is None:
                        waker[1].clear()      # under the lock: a put after this sets it again
                if ev is None:
                    await waker[1].wait()
                    continue
                yield ev
                if ev.finish_reason:
                    return
        finally:
            with self._cond:
                self._wakers.discard(waker)

    # ---- the engine's side -----------------------------------------------------------------------
    def _put(self, ev: Event):
        with self._cond:
            self._events.append(ev)
            self._cond.notify_all()
            wakers = list(self._wakers)
        for loop, flag in wakers:
            with contextlib.suppress(RuntimeError):     # that reader's event loop has closed
                loop.call_soon_threadsafe(flag.set)

    def _finish(self, reason: str, text: str = "", token_ids=(), logprobs=(), error: str | None = None):
        self.finish_reason = reason
        self._put(Event(text, list(token_ids), list(logprobs), reason, len(self.request.prompt_ids),
                        self.generated, error))

    def _step(self):
        """One token; returns False once the stream has ended."""
        req, eng = self.request, self.engine
        if self.cancel_called:
            self._finish("cancelled")
            return False
        if eng.fail_after is not None and self.generated >= eng.fail_after:
            self._finish("error", error="fake engine failure")
            return False
        tok = next(self.reply)
        self.generated += 1
        lps = [] if req.logprobs is None else [_logprob(tok, self.generated, req.logprobs, eng.tokenizer.vocab_size)]
        self.held += self.decoder.push(tok)
        stops = req.stop
        cut = min((self.held.find(s) for s in stops if s in self.held), default=-1)
        if cut >= 0:
            self._finish("stop", self.held[:cut], [tok], lps)
            return False
        if self.generated >= req.max_tokens:
            self._finish("length", self.held + self.decoder.flush(), [tok], lps)
            return False
        safe = max(len(self.held) - max((len(s) - 1 for s in stops), default=0), 0)
        while safe < len(self.held) and not any(s.startswith(self.held[safe:]) for s in stops):
            safe += 1             # hold back only a tail that may begin a stop string
        text, self.held = self.held[:safe], self.held[safe:]
        self._put(Event(text, [tok], lps))
        return True


def _logprob(tok: int, k: int, n_top: int, vocab: int) -> TokenLogprob:
    lp = -0.25 * (k % 4) - 0.1
    return TokenLogprob(tok, lp, [((tok + j) % vocab, lp - j) for j in range(n_top)])


class FakeEngine:
    def __init__(self, tokenizer, *, model_name="fake-model", ctx=512, parallel=4, max_waiting=32,
                 token_delay=0.002):
        self.tokenizer, self.model_name, self.ctx = tokenizer, model_name, ctx
        self.parallel, self.max_waiting, self.token_delay = parallel, max_waiting, token_delay
        self.fail_after: int | None = None          # streams end with finish_reason "error" after this many tokens
        self.submit_error: Exception | None = None  # submit raises this
        self.streams: list[FakeStream] = []
        self._waiting: collections.deque[FakeStream] = collections.deque()
        self._running: list[FakeStream] = []
        self._totals = collections.Counter()
        self._recent: collections.deque[float] = collections.deque()   # when each recent token was made
        self._lock = threading.Condition()
        self._closed = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    def submit(self, request) -> FakeStream:
        if self.submit_error is not None:
            raise self.submit_error
        if len(request.prompt_ids) >= self.ctx:
            raise ContextFullError(f"the prompt ({len(request.prompt_ids)} tokens) does not fit the context "
                                   f"({self.ctx})")
        if request.temperature < 0 or not 0 < request.top_p <= 1:
            raise ValueError("bad sampling settings")
        with self._lock:
            if self._closed:
                raise EngineClosedError("the engine is closed")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFullError(f"{len(self._waiting)} requests are waiting already")
            stream = FakeStream(self, request, f"seq-{next(self._ids)}")
            self.streams.append(stream)
            self._waiting.append(stream)
            self._totals["requests"] += 1
            self._totals["prompt"] += len(request.prompt_ids)
            self._lock.notify_all()
        return stream

    def stats(self) -> dict:
        with self._lock:
            now = time.monotonic()
            recent = sum(1 for t in self._recent if now - t < 1.0)
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "kv_pages_used": sum(-(-(len(s.request.prompt_ids) + s.generated) // PAGE) for s in self._running),
                    "kv_pages_total": self.parallel * self.ctx // PAGE,
                    "prompt_tokens_total": self._totals["prompt"],
                    "completion_tokens_total": self._totals["completion"],
                    "requests_total": self._totals["requests"], "decode_tokens_per_second": float(recent),
                    "parallel": self.parallel}

    def close(self):
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join()
        for s in list(self._waiting) + self._running:
            s._finish("cancelled")

    def idle(self) -> bool:
        with self._lock:
            return not self._waiting and not self._running

    def _wake(self):
        with self._lock:
            self._lock.notify_all()

    def _loop(self):
        while True:
            with self._lock:
                while not self._closed and not self._waiting and not self._running:
                    self._lock.wait()
                if self._closed:
                    return
                for s in [s for s in self._waiting if s.cancel_called]:   # cancelled before they ran
                    self._waiting.remove(s)
                    s._finish("cancelled")
                while self._waiting and len(self._running) < self.parallel:
                    self._running.append(self._waiting.popleft())
                batch = list(self._running)
            before = sum(s.generated for s in batch)
            ended = [s for s in batch if not s._step()]
            with self._lock:
                made = sum(s.generated for s in batch) - before
                self._totals["completion"] += made
                now = time.monotonic()
                self._recent.extend([now] * made)
                while self._recent and now - self._recent[0] > 1.0:
                    self._recent.popleft()
                for s in ended:
                    self._running.remove(s)
            if self.token_delay:
                time.sleep(self.token_delay)


@contextlib.contextmanager
def running_server(engine):
    """create_app(engine) served by uvicorn on a free port of 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn

    from shaderlm.server import create_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
