"""The chat page at `/`, in a real headless Chromium (Debian's, driven by Playwright), over the fake engine.

It must stream a reply into the conversation, show its tok/s, send the system prompt and the earlier
turns with each request, and clear the conversation.
"""
from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing (Debian: apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
pytest.importorskip("fastapi")

from fake_engine import FakeEngine, running_server  # noqa: E402

from shaderlm.formats.tokenizer import Tokenizer  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def page_and_engine(tiny_gguf):
    engine = FakeEngine(Tokenizer.from_gguf(tiny_gguf), model_name="fake-model", token_delay=0.01)
    with running_server(engine) as url, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.set_default_timeout(15000)
        page.goto(url + "/")
        yield page, engine
        browser.close()
    engine.close()


def prompt_text(engine, stream) -> str:
    return engine.tokenizer.decode(stream.request.prompt_ids)


def expected_reply(engine, stream) -> str:
    """The fake engine's answer: the prompt's ordinary tokens, cycled, up to max_tokens."""
    tok = engine.tokenizer
    ids = [t for t in stream.request.prompt_ids if not tok.is_special(t)]
    return tok.decode((ids * stream.request.max_tokens)[:stream.request.max_tokens])


def test_chat_page_streams_a_reply(page_and_engine):
    page, engine = page_and_engine
    sync_api.expect(page.locator("#model")).to_have_text("fake-model")
    page.click("summary")                                  # the settings
    page.fill("#system", "Be brief.")
    page.fill("#max-tokens", "40")
    page.fill("#prompt", "hello world")
    page.click("#send")

    first = page.locator("#messages .assistant").first
    sync_api.expect(first).to_contain_text("hello world")  # the fake echoes the prompt
    sync_api.expect(page.locator("#stats")).to_contain_text("tok/s")
    page.wait_for_function("document.querySelector('#send').textContent === 'Send'")   # the reply has ended
    [stream] = engine.streams
    assert stream.finish_reason == "length" and stream.request.max_tokens == 40
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt_text(engine, stream)
    assert first.inner_text() == expected_reply(engine, stream)
    stats = page.locator("#stats").inner_text()
    assert stats.startswith("39 tokens") and float(stats.split("·")[1].split()[0]) > 0, stats

    # the second turn carries the first
    page.fill("#prompt", "and again")
    page.press("#prompt", "Enter")
    sync_api.expect(page.locator("#messages .assistant")).to_have_count(2)
    page.wait_for_function("document.querySelector('#send').textContent === 'Send'")
    second = prompt_text(engine, engine.streams[1])
    assert "hello world" in second and "and again" in second and first.inner_text() in second
    assert page.locator("#messages .assistant").nth(1).inner_text() == expected_reply(engine, engine.streams[1])

    page.click("#clear")
    sync_api.expect(page.locator("#messages > *")).to_have_count(0)


def test_chat_page_shows_errors(page_and_engine):
    page, engine = page_and_engine
    page.click("#clear")
    engine.submit_error = RuntimeError("the GPU caught fire")
    try:
        page.fill("#prompt", "hello")
        page.click("#send")
        sync_api.expect(page.locator("#messages .error")).to_contain_text("the GPU caught fire")
    finally:
        engine.submit_error = None
    assert page.input_value("#prompt") == "hello"          # the text is back in the box, to send again
