"""Running one HTTP request's choices on the engine and writing them as OpenAI's objects: a whole
chat.completion / text_completion, or server-sent event chunks.

The two endpoints differ only in how a choice is written (ChatFormat, TextFormat); the rest, relaying
the engine's events of n streams in the order they come, is shared.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid

from ..engine.requests import Event, Request
from .errors import server_error

log = logging.getLogger("shaderlm.server")


class Run:
    """The engine streams of one HTTP request, one per choice, and which of them have finished."""

    def __init__(self, streams, requests: list[Request], n: int):
        self.streams, self.requests, self.n = streams, requests, n
        self.done = [False] * len(streams)

    async def events(self):
        """Lists of (choice index, Event) from all streams as they come, each list what has arrived (so that
        a response writes them at once); each stream's last event has a finish_reason."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i, stream):
            try:
                async for ev in stream:
                    queue.put_nowait((i, ev))
                    if ev.finish_reason:
                        return
                queue.put_nowait((i, Event(finish_reason="error", error="the engine ended the stream early")))
            except Exception as e:          # an engine bug ends this request, not the server
                log.exception("engine stream %s failed", getattr(stream, "id", i))
                queue.put_nowait((i, Event(finish_reason="error", error=f"{type(e).__name__}: {e}")))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            while not all(self.done):
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                for i, ev in batch:
                    if ev.finish_reason:
                        self.done[i] = True
                yield batch
        finally:
            for t in tasks:
                t.cancel()

    def cancel(self):
        """Free the sequences still running (the client went away, or the request failed)."""
        for stream, done in zip(self.streams, self.done, strict=True):
            if not done:
                stream.cancel()

    def usage(self, completion_tokens: list[int]) -> dict:
        # every prompt is counted once, though n choices share it
        prompt = sum(len(r.prompt_ids) for r in self.requests[::self.n])
        completion = sum(completion_tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def failure(ev: Event) -> str | None:
    """Why a stream failed, or None: "cancelled" reaches a client only as an error (the engine stopped)."""
    if ev.finish_reason == "error":
        return ev.error or "the engine failed"
    if ev.finish_reason == "cancelled":
        return "the request was cancelled by the server"
    return None


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.token_to_bytes(token_id).decode("utf-8", errors="replace")


class ChatFormat:
    object, chunk_object, id_prefix = "chat.completion", "chat.completion.chunk", "chatcmpl-"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def logprobs(self, items, offset: int = 0):
        def entry(token, logprob):
            b = self.tokenizer.token_to_bytes(token)
            return {"token": b.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(b)}
        return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, p) for t, p in lp.top]}
                            for lp in items], "refusal": None}

    def choice(self, index, text, logprobs, finish_reason):
        return {"index": index, "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": logprobs, "finish_reason": finish_reason}

    def first_delta(self, index):
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}

    def delta(self, index, text, logprobs, finish_reason):
        return {"index": index, "delta": {"content": text} if finish_reason is None else {},
                "logprobs": logprobs, "finish_reason": finish_reason}


class TextFormat:
    """The legacy completions endpoint: logprobs as parallel lists with character offsets."""
    object, chunk_object, id_prefix = "text_completion", "text_completion", "cmpl-"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def logprobs(self, items, offset: int = 0):
        tokens, offsets = [], []
        for lp in items:
            offsets.append(offset)
            tokens.append(token_text(self.tokenizer, lp.token))
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in items],
                "top_logprobs": [{token_text(self.tokenizer, t): p for t, p in lp.top} for lp in items],
                "text_offset": offsets}

    def choice(self, index, text, logprobs, finish_reason):
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def first_delta(self, index):
        return None

    delta = choice


class Writer:
    """One response's id, creation time and model, and the objects written with them."""

    def __init__(self, fmt, model: str, run: Run, want_logprobs: bool):
        self.fmt, self.model, self.run, self.want_logprobs = fmt, model, run, want_logprobs
        self.id = fmt.id_prefix + uuid.uuid4().hex
        self.created = int(time.time())

    def _object(self, obj: str, **fields) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, **fields}

    async def complete(self) -> dict:
        """The whole response object; raises APIError (500) when the engine failed a choice."""
        n = len(self.run.streams)
        texts = [[] for _ in range(n)]
        items = [[] for _ in range(n)]
        reasons, completion = [None] * n, [0] * n
        async with contextlib.aclosing(self.run.events()) as events:
            async for batch in events:
                for i, ev in batch:
                    if why := failure(ev):
                        raise server_error(why)
                    texts[i].append(ev.text)
                    items[i].extend(ev.logprobs)
                    if ev.finish_reason:
                        reasons[i], completion[i] = ev.finish_reason, ev.completion_tokens
        choices = [self.fmt.choice(i, "".join(texts[i]), self.fmt.logprobs(items[i]) if self.want_logprobs else None,
                                   reasons[i]) for i in range(n)]
        return self._object(self.fmt.object, choices=choices, usage=self.run.usage(completion))

    async def sse(self, include_usage: bool):
        """Server-sent events, as OpenAI writes them: one JSON chunk per `data:` line, then [DONE]."""
        extra = {"usage": None} if include_usage else {}

        def chunk(choice):
            return _sse(self._object(self.fmt.chunk_object, choices=[choice], **extra))

        # a text delta's chunk written once a choice, around its text: a stream's most common object,
        # one a token, so its JSON is not rebuilt every time (the event loop's time a token adds up
        # over many streams, and it takes the GIL from the engine's thread)
        around: dict[int, list[str]] = {}

        def text_chunk(i, text):
            if i not in around:
                around[i] = chunk(self.fmt.delta(i, _MARK, None, None)).rsplit(json.dumps(_MARK), 1)
            before, after = around[i]
            return before + json.dumps(text, ensure_ascii=False) + after

        n = len(self.run.streams)
        offsets, completion = [0] * n, [0] * n
        try:
            for i in range(n):
                if (first := self.fmt.first_delta(i)) is not None:
                    yield chunk(first)
            failed = False
            async with contextlib.aclosing(self.run.events()) as events:
                async for batch in events:
                    out = []          # the batch's chunks, sent as one write
                    for i, ev in batch:
                        if why := failure(ev):
                            out.append(_sse(server_error(why).body()))
                            failed = True
                            break
                        if ev.text and not self.want_logprobs:
                            out.append(text_chunk(i, ev.text))
                        elif ev.text or ev.logprobs:
                            lp = self.fmt.logprobs(ev.logprobs, offsets[i]) if self.want_logprobs else None
                            offsets[i] += len(ev.text)
                            out.append(chunk(self.fmt.delta(i, ev.text, lp, None)))
                        if ev.finish_reason:
                            completion[i] = ev.completion_tokens
                            out.append(chunk(self.fmt.delta(i, "", None, ev.finish_reason)))
                    if out:
                        yield "".join(out)
                    if failed:
                        break
            if include_usage and not failed:
                yield _sse(self._object(self.fmt.chunk_object, choices=[], usage=self.run.usage(completion)))
        except Exception as e:       # headers are sent: the error goes in the stream, as OpenAI does it
            log.exception("streaming %s failed", self.id)
            yield _sse(server_error(f"{type(e).__name__}: {e}").body())
        yield "data: [DONE]\n\n"


_MARK = "\x00text\x00"        # a delta's text in the chunk text_chunk fills in (the JSON's last string)


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"
