"""What a caller gives the serving engine and what it gets back: plain data, no GPU.

A request is token ids plus sampling and stop settings; its result arrives as a stream of events, each
a piece of text with the token ids it came from, then a final event with the reason generation ended
and the token counts. The engine (engine/scheduler.py) runs many requests at once; the HTTP server
(server/) and the Python API both use these types.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ShaderLMError

FINISH_REASONS = ("stop", "length", "cancelled", "error")


class QueueFullError(ShaderLMError):
    """The engine's waiting queue is full: try again later (HTTP 429)."""


class EngineClosedError(ShaderLMError):
    """The engine has stopped and takes no more requests (HTTP 503)."""


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int = 256
    temperature: float = 0.0            # 0: greedy
    top_k: int = 0                      # 0: off
    top_p: float = 1.0                  # 1: off
    seed: int | None = None             # None: a random seed
    stop: list[str] = field(default_factory=list)    # stop strings: generation ends before the first
    stop_at_eos: bool = True            # end at the model's end-of-generation tokens
    logprobs: int | None = None         # None: none; n >= 0: each token's log-probability and the n most likely


@dataclass
class TokenLogprob:
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)    # (token, logprob), most likely first


@dataclass
class Event:
    """A piece of the completion. `text` is never half a UTF-8 character and never shows part of a
    stop string; `token_ids` are the tokens it came from (a piece may hold several, or none while a
    character is incomplete). The last event of a stream has `finish_reason` set (one of
    FINISH_REASONS) and the counts; `error` says what went wrong when it is "error"."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
