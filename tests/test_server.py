"""The HTTP server (shaderlm/server) against OpenAI's own Python client, over a fake engine (no GPU).

The fake echoes the prompt's ordinary tokens (fake_engine.py), so every test knows the exact text a
request must get back; the server must relay it in OpenAI's shapes, map every failure to OpenAI's
status codes and error bodies, and free the engine's sequence of every client that goes away.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from fake_engine import FakeEngine, running_server  # noqa: E402

from shaderlm.engine.requests import EngineClosedError  # noqa: E402
from shaderlm.formats.tokenizer import Tokenizer  # noqa: E402

MODEL = "fake-model"
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello world"}]


@pytest.fixture(scope="module")
def tok(tiny_gguf):
    return Tokenizer.from_gguf(tiny_gguf)


@pytest.fixture(scope="module")
def server(tok):
    engine = FakeEngine(tok, model_name=MODEL, ctx=512, token_delay=0.001)
    with running_server(engine) as url:
        yield engine, url
    engine.close()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server[1] + "/v1", api_key="unused", max_retries=0, timeout=20) as c:
        yield c


def reply(tok, prompt_ids, n_tokens, seed=0, stop=()):
    """What the fake engine answers: the prompt's ordinary tokens, cycled from `seed`, cut at a stop."""
    ids = [t for t in prompt_ids if not tok.is_special(t)]
    ids = ids[seed % len(ids):] + ids[:seed % len(ids)]
    text = tok.decode(list(itertools.islice(itertools.cycle(ids), n_tokens)))
    for s in stop:
        if s in text:
            text = text[:text.index(s)]
    return text


def wait_idle(engine, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not engine.idle():
        assert time.monotonic() < deadline, engine.stats()
        time.sleep(0.01)


def sse_events(text: str) -> list[dict]:
    """The JSON of each event of an SSE body before [DONE], checking it is written as OpenAI writes it."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    blocks = text.split("\n\n")[:-2]
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), text
    return [json.loads(b[len("data: "):]) for b in blocks]


# ---- chat ----------------------------------------------------------------------------------------------

def test_chat(client, tok):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
    ids = tok.encode_chat(HELLO)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    assert abs(r.created - time.time()) < 60
    [c] = r.choices
    assert (c.index, c.message.role, c.finish_reason, c.logprobs) == (0, "assistant", "length", None)
    assert c.message.content == reply(tok, ids, 12)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (len(ids), 12, len(ids) + 12)


def test_chat_stream_with_usage(client, tok):
    chunks = list(client.chat.completions.create(messages=HELLO, model=MODEL, max_tokens=10, stream=True,
                                                 stream_options={"include_usage": True}))
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL for c in chunks)
    first = chunks[0].choices[0]
    assert (first.delta.role, first.delta.content, first.finish_reason) == ("assistant", "", None)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply(tok, tok.encode_chat(HELLO), 10)
    last = chunks[-2].choices[0]
    assert last.finish_reason == "length" and last.delta.content is None
    assert [c for c in chunks if c.choices and c.choices[0].finish_reason] == [chunks[-2]]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert chunks[-1].usage.prompt_tokens == len(tok.encode_chat(HELLO))
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_stream_wire_format(server):
    _, url = server
    body = {"messages": HELLO, "max_tokens": 4, "stream": True}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert all("usage" not in e for e in events)         # only with include_usage
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"][0]["delta"] == {}


def test_stream_text_chunks_wire_format(server, tok):
    """Every token's chunk (written from a template a choice) is the object OpenAI sends, for texts JSON must
    escape and for non-ASCII text, which stays unescaped as OpenAI writes it."""
    _, url = server
    messages = [{"role": "user", "content": 'say "hi" \\ back\nthen é ✓ and </tag>'}]
    body = {"messages": messages, "max_tokens": 40, "stream": True, "n": 2, "seed": 3,
            "stream_options": {"include_usage": True}}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    events = sse_events(r.text)
    assert "é" in r.text and "\\u00e9" not in r.text
    head = {k: events[0][k] for k in ("id", "object", "created", "model")}
    texts = ["", ""]
    for e in events[:-1]:
        assert {k: e[k] for k in head} == head and set(e) == {*head, "choices", "usage"} and e["usage"] is None
        [c] = e["choices"]
        if c["finish_reason"] is None and "content" in c["delta"] and "role" not in c["delta"]:
            assert c == {"index": c["index"], "delta": {"content": c["delta"]["content"]}, "logprobs": None,
                         "finish_reason": None}
            texts[c["index"]] += c["delta"]["content"]
    ids = tok.encode_chat(messages)
    assert texts == [reply(tok, ids, 40, seed=3 + i) for i in range(2)]


def test_content_parts_and_roles(client, tok):
    parts = [{"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]},
             {"role": "user", "content": "hello world"}, {"role": "assistant", "content": "hi"},
             {"role": "user", "content": [{"type": "text", "text": "again"}]}]
    r = client.chat.completions.create(model=MODEL, messages=parts, max_tokens=30)
    flat = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
             else "".join(p["text"] for p in m["content"])} for m in parts]
    assert r.choices[0].message.content == reply(tok, tok.encode_chat(flat), 30)


def test_stop(client, tok):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=60, stop=["world", "zzz"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == reply(tok, tok.encode_chat(HELLO), 60, stop=["world"])
    assert "wor" not in r.choices[0].message.content.split("hello")[-1]
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=60, stop="world",
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_n_choices_with_seed(client, tok):
    ids = tok.encode_chat(HELLO)
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, n=2, seed=5)
    assert [c.index for c in r.choices] == [0, 1]
    assert [c.message.content for c in r.choices] == [reply(tok, ids, 8, seed=5), reply(tok, ids, 8, seed=6)]
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 16
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8, n=2, seed=5,
                                                 stream=True, stream_options={"include_usage": True}))
    texts, finished = ["", ""], []
    for c in chunks[:-1]:
        [choice] = c.choices
        texts[choice.index] += choice.delta.content or ""
        if choice.finish_reason:
            finished.append(choice.index)
    assert texts == [c.message.content for c in r.choices] and sorted(finished) == [0, 1]
    assert chunks[-1].usage.completion_tokens == 16


def test_chat_logprobs(client, tok):
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    assert b"".join(bytes(t.bytes) for t in content).decode() == r.choices[0].message.content
    for t in content:
        assert t.logprob < 0 and len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
    r = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, logprobs=True)
    assert all(t.top_logprobs == [] for t in r.choices[0].logprobs.content)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, logprobs=True,
                                                 top_logprobs=1, stream=True))
    assert sum(len(c.choices[0].logprobs.content) for c in chunks if c.choices[0].logprobs) == 6


# ---- completions -----------------------------------------------------------------------------------------

def test_completions(client, tok):
    prompt = "The quick brown fox"
    ids = tok.encode(prompt)
    r = client.completions.create(model=MODEL, prompt=prompt)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    [c] = r.choices
    assert c.text == reply(tok, ids, 16) and c.finish_reason == "length"      # OpenAI's default max_tokens: 16
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 16)
    assert client.completions.create(model=MODEL, prompt=ids, max_tokens=7).choices[0].text == reply(tok, ids, 7)
    assert client.completions.create(model=MODEL, prompt=[prompt], max_tokens=7).choices[0].text == reply(tok, ids, 7)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, stop=["fox", "dog"])
    assert r.choices[0].text == reply(tok, ids, 40, stop=["fox"]) and r.choices[0].finish_reason == "stop"


def test_completions_stream(client, tok):
    ids = tok.encode("The quick brown fox")
    chunks = list(client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=9, stream=True,
                                            stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == reply(tok, ids, 9)
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9


def test_completions_logprobs_and_batch(client, tok):
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(len(top) <= 2 and lp.tokens[i] in top for i, top in enumerate(lp.top_logprobs))
    # several prompts: choice index = prompt index * n + i, as at OpenAI
    r = client.completions.create(model=MODEL, prompt=["one two", "three four"], max_tokens=5, n=2, seed=0)
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    expect = [reply(tok, tok.encode(p), 5, seed=s) for p in ("one two", "three four") for s in (0, 1)]
    assert texts == expect
    assert r.usage.prompt_tokens == len(tok.encode("one two")) + len(tok.encode("three four"))


def test_unknown_fields_are_ignored(server, tok):
    body = {"messages": HELLO, "max_tokens": 3, "parallel_tool_calls": True, "metadata": {"a": "b"},
            "user": "someone", "frequency_penalty": 0, "presence_penalty": 0.0, "future_option": [1, 2]}
    r = httpx.post(server[1] + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == reply(tok, tok.encode_chat(HELLO), 3)


# ---- errors ----------------------------------------------------------------------------------------------

CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path,body,status,param,code", [
    (CHAT, b'{"messages": [', 400, None, None),
    (CHAT, b"not json at all", 400, None, None),
    (CHAT, b"[1, 2]", 400, None, None),
    (CHAT, {}, 400, "messages", None),
    (CHAT, {"messages": []}, 400, "messages", None),
    (CHAT, {"messages": "hi"}, 400, "messages", None),
    (CHAT, {"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages[0].role", None),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", None),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages[0].content[0].type", None),
    (CHAT, {"messages": USER, "temperature": "hot"}, 400, "temperature", None),
    (CHAT, {"messages": USER, "temperature": 2.5}, 400, "temperature", None),
    (CHAT, {"messages": USER, "top_p": 0}, 400, "top_p", None),
    (CHAT, {"messages": USER, "max_tokens": "10"}, 400, "max_tokens", None),
    (CHAT, {"messages": USER, "max_tokens": 0}, 400, "max_tokens", None),
    (CHAT, {"messages": USER, "n": 17}, 400, "n", None),
    (CHAT, {"messages": USER, "stream": "yes"}, 400, "stream", None),
    (CHAT, {"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    (CHAT, {"messages": USER, "top_logprobs": 21, "logprobs": True}, 400, "top_logprobs", None),
    (CHAT, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs", None),
    (CHAT, {"messages": USER, "frequency_penalty": 0.5}, 400, "frequency_penalty", None),
    (CHAT, {"messages": USER, "presence_penalty": 1}, 400, "presence_penalty", None),
    (CHAT, {"messages": USER, "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    (CHAT, {"messages": USER, "model": "gpt-4o"}, 404, "model", "model_not_found"),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 600}]}, 400, "messages", "context_length_exceeded"),
    (TEXT, {"prompt": "hi", "echo": True}, 400, "echo", None),
    (TEXT, {"prompt": "hi", "logprobs": 6}, 400, "logprobs", None),
    (TEXT, {"prompt": 5}, 400, "prompt", None),
    (TEXT, {"prompt": [100000]}, 400, "prompt", None),
    (TEXT, {"prompt": [-1]}, 400, "prompt[0]", None),
    (TEXT, {"prompt": ""}, 400, "prompt", None),
    (TEXT, {"prompt": "word " * 600}, 400, "prompt", "context_length_exceeded"),
])
def test_bad_requests(server, path, body, status, param, code):
    _, url = server
    if isinstance(body, bytes):
        r = httpx.post(url + path, content=body, headers={"Content-Type": "application/json"}, timeout=10)
    else:
        r = httpx.post(url + path, json=body, timeout=10)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code)


def test_errors_through_the_client(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=USER, temperature=3)
    assert e.value.status_code == 400 and e.value.param == "temperature"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=USER)
    assert e.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="word " * 600)
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_unknown_route(server):
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v1/embeddings"), ("GET", "/v1/chat/completions")):
        r = httpx.request(method, server[1] + path, timeout=10)
        assert r.status_code in (404, 405)
        assert r.json()["error"]["message"] == f"Invalid URL ({method} {path})"


def test_engine_failures_stay_in_their_request(server, client):
    engine, url = server
    engine.submit_error = RuntimeError("the GPU caught fire")
    try:
        r = httpx.post(url + CHAT, json={"messages": USER}, timeout=10)
    finally:
        engine.submit_error = None
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "GPU caught fire" in r.json()["error"]["message"]

    engine.fail_after = 3
    try:
        r = httpx.post(url + CHAT, json={"messages": USER, "max_tokens": 20}, timeout=10)
        assert r.status_code == 500 and r.json()["error"]["message"] == "fake engine failure"
        r = httpx.post(url + CHAT, json={"messages": USER, "max_tokens": 20, "stream": True}, timeout=10)
        events = sse_events(r.text)
        assert events[-1] == {"error": {"message": "fake engine failure", "type": "server_error",
                                                    "param": None, "code": None}}
        with pytest.raises(openai.APIError, match="fake engine failure"):
            list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=20, stream=True))
    finally:
        engine.fail_after = None
    # and the server goes on
    assert client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2).choices[0].finish_reason == "length"


def test_queue_full_and_engine_closed(tok):
    engine = FakeEngine(tok, model_name=MODEL, parallel=1, max_waiting=1, token_delay=0.01)
    with running_server(engine) as url, openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        running = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=1000, stream=True)
        for chunk in running:        # it runs: a token came (a loaded machine could still have it waiting)
            if chunk.choices and chunk.choices[0].delta.content:
                break
        waiting = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=1000, stream=True)
        with pytest.raises(openai.RateLimitError) as e:
            client.chat.completions.create(model=MODEL, messages=USER)
        assert e.value.status_code == 429 and e.value.response.headers["retry-after"]
        assert e.value.body["type"] == "rate_limit_error"
        running.close()
        waiting.close()
        wait_idle(engine)
        assert all(s.cancel_called and s.finish_reason == "cancelled" for s in engine.streams)

        engine.close()
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=MODEL, messages=USER)
        assert e.value.status_code == 503
        assert httpx.get(url + "/health").json()["status"] == "ok"


def test_engine_closed_error_type(server):
    engine, url = server
    engine.submit_error = EngineClosedError("shutting down")
    try:
        r = httpx.post(url + TEXT, json={"prompt": "hi"}, timeout=10)
    finally:
        engine.submit_error = None
    assert r.status_code == 503 and r.json()["error"] == {"message": "shutting down", "type": "server_error",
                                                          "param": None, "code": None}


# ---- many clients, some leaving early --------------------------------------------------------------------

def test_concurrent_clients_and_cancellation(tok):
    """16 streaming clients at once, 4 running and the rest queued; half leave early, some while still
    queued. Every request is answered or cancelled, none hangs, and the engine saw every cancel."""
    engine = FakeEngine(tok, model_name=MODEL, parallel=4, max_waiting=32, token_delay=0.005)

    async def one(client, i):
        leave_after = {0: 1, 1: 3}.get(i % 4)             # chunks read before leaving; None: read all
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"client {i}"}], stream=True,
            max_tokens=400 if leave_after else 20)
        text, n = "", 0
        async for chunk in stream:
            n += 1
            text += chunk.choices[0].delta.content or ""
            if leave_after and n == leave_after:
                await stream.close()
                return "left"
        return text

    async def main(url):
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, i) for i in range(16))), 30)

    with running_server(engine) as url:
        results = asyncio.run(main(url))
        wait_idle(engine)
        for i, res in enumerate(results):
            if i % 4 in (0, 1):
                assert res == "left"
            else:
                assert res == reply(tok, tok.encode_chat([{"role": "user", "content": f"client {i}"}]), 20)
        assert len(engine.streams) == 16
        for s in engine.streams:
            left = s.request.max_tokens == 400
            assert s.cancel_called == left and s.finish_reason == ("cancelled" if left else "length")
        # the server still answers, and the stats agree that nothing runs
        r = httpx.post(url + CHAT, json={"messages": USER, "max_tokens": 3}, timeout=10)
        assert r.status_code == 200
        health = httpx.get(url + "/health").json()
        assert (health["running"], health["waiting"], health["kv_pages_used"]) == (0, 0, 0)
    engine.close()


def test_non_streamed_client_timeout_cancels(tok):
    engine = FakeEngine(tok, model_name=MODEL, token_delay=0.005)
    with running_server(engine) as url:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url + CHAT, json={"messages": USER, "max_tokens": 2000}, timeout=0.3)
        wait_idle(engine)
        [s] = engine.streams
        assert s.cancel_called and s.finish_reason == "cancelled" and s.generated < s.request.max_tokens
    engine.close()


# ---- models, health, metrics -----------------------------------------------------------------------------

def test_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    m = client.models.retrieve(MODEL)
    assert (m.id, m.object, m.owned_by) == (MODEL, "model", "shaderlm")


def test_health_and_metrics(server, client):
    from prometheus_client.parser import text_string_to_metric_families

    engine, url = server
    client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)
    httpx.get(url + "/no/such/page")
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok"
    assert {"running", "waiting", "kv_pages_used", "kv_pages_total", "requests_total", "parallel"} <= set(health)

    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(r.text) for s in family.samples}
    stats = engine.stats()
    assert samples[("shaderlm_kv_pages_total", ())] == stats["kv_pages_total"] == 4 * 512 // 16
    assert samples[("shaderlm_requests_total", ())] >= 1
    assert samples[("shaderlm_completion_tokens_total", ())] >= 2
    assert samples[("shaderlm_requests_running", ())] == 0
    assert samples[("shaderlm_requests_rejected_total", (("code", "404"),))] >= 1
