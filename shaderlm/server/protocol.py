"""The request bodies of /v1/chat/completions and /v1/completions, and what they become: prompt token
ids and engine Requests.

Parsed strictly (a string where a number belongs is a 400, as at OpenAI); fields OpenAI knows but
shaderlm does not use are ignored, like unknown fields, unless ignoring them would change the answer
the client asked for (penalties, logit_bias, echo ...), which is a 400 saying so.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine.requests import Request
from .errors import context_exceeded, invalid

MAX_N = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class ContentPart(_Body):
    type: str
    text: str | None = None


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class StreamOptions(_Body):
    include_usage: bool | None = False


class ResponseFormat(_Body):
    type: str


class _Sampling(_Body):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)                  # not OpenAI's: llama.cpp's and vLLM's extension
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def check_supported(self) -> None:
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name):
                raise invalid(f"'{name}' is not supported by this server (only 0).", name)
        if self.logit_bias:
            raise invalid("'logit_bias' is not supported by this server.", "logit_bias")
        if self.stream_options is not None and not self.stream:
            raise invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          "stream_options")

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requests(self, prompt_ids: list[int], ctx: int, max_tokens: int | None, logprobs: int | None,
                 param: str) -> list[Request]:
        """One engine Request per choice (n), seeds seed, seed+1, ... so that choices differ."""
        room = ctx - len(prompt_ids)
        if room < 1:
            raise context_exceeded(ctx, len(prompt_ids), param)
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        base = dict(prompt_ids=prompt_ids, max_tokens=min(max_tokens or room, room),
                    temperature=1.0 if self.temperature is None else self.temperature,   # OpenAI's defaults
                    top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
                    stop=[s for s in stop if s], logprobs=logprobs)
        return [Request(**base, seed=None if self.seed is None else self.seed + i) for i in range(self.n or 1)]


class ChatRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs and not self.logprobs:
            raise invalid("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
        if self.response_format and self.response_format.type != "text":
            raise invalid(f"response_format '{self.response_format.type}' is not supported by this server "
                          "(only 'text').", "response_format")

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    def chat_messages(self) -> list[dict]:
        """The messages as the chat template takes them: content as one string."""
        out = []
        for i, m in enumerate(self.messages):
            content = m.content
            if isinstance(content, list):
                for j, part in enumerate(content):
                    if part.type != "text" or part.text is None:
                        raise invalid(f"Content parts of type '{part.type}' are not supported by this server "
                                      "(only 'text').", f"messages[{i}].content[{j}].type")
                content = "".join(part.text for part in content)
            msg = {"role": "system" if m.role == "developer" else m.role, "content": content or ""}
            msg.update({k: v for k in ("name", "tool_call_id", "tool_calls") if (v := getattr(m, k)) is not None})
            out.append(msg)
        return out

    def engine_requests(self, tokenizer, ctx: int) -> list[Request]:
        ids = tokenizer.encode_chat(self.chat_messages())
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self.requests(ids, ctx, self.max_completion_tokens or self.max_tokens, logprobs, "messages")


TokenIds = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise invalid("'echo' is not supported by this server.", "echo")
        if self.suffix:
            raise invalid("'suffix' is not supported by this server.", "suffix")
        if self.best_of not in (None, 1, self.n or 1):
            raise invalid("'best_of' is not supported by this server.", "best_of")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def prompts(self, tokenizer) -> list[list[int]]:
        """Each prompt as token ids: OpenAI takes a string, a list of strings, token ids or lists of them."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):   # one prompt
            p = [p]
        out = [tokenizer.encode(x) if isinstance(x, str) else list(x) for x in p]
        vocab = tokenizer.vocab_size
        for ids in out:
            if not ids:
                raise invalid("The prompt is empty.", "prompt")
            if max(ids) >= vocab:
                raise invalid(f"Token id {max(ids)} is outside the vocabulary (0..{vocab - 1}).", "prompt")
        return out

    def engine_requests(self, tokenizer, ctx: int) -> list[Request]:
        """n Requests per prompt, in OpenAI's order: choice index = prompt index * n + i."""
        prompts = self.prompts(tokenizer)
        if len(prompts) * (self.n or 1) > MAX_N:
            raise invalid(f"At most {MAX_N} completions per request (prompts times n).", "prompt")
        return [r for ids in prompts for r in self.requests(ids, ctx, self.max_tokens or 16, self.logprobs, "prompt")]
