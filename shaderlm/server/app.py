"""`shaderlm serve`: OpenAI's chat and completions API over a serving engine, and a chat page.

The engine (engine/scheduler.py's Engine, or anything with its interface, as server/replicas.py's) does
the work: submit(Request) -> Stream of Events (or an awaitable of one), cancel(), stats(). This module turns HTTP bodies into Requests, relays Events as
OpenAI's objects, and frees an engine sequence as soon as its client has gone.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..engine.requests import EngineClosedError, QueueFullError
from ..errors import ContextFullError, ShaderLMError
from .completions import ChatFormat, Run, TextFormat, Writer
from .errors import APIError, from_validation, invalid, model_not_found, server_error
from .metrics import Metrics
from .protocol import ChatRequest, CompletionRequest

STATIC = Path(__file__).parent / "static"


class EventStream(StreamingResponse):
    """An SSE response that frees its engine sequences however it ends: done, failed, or the client gone
    (Starlette then cancels the response, and this `finally` still runs)."""

    def __init__(self, events, run: Run, headers: dict):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})
        self.run = run

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.cancel()


def create_app(engine) -> FastAPI:
    app = FastAPI(title="shaderlm", docs_url=None, redoc_url=None)   # the docs pages load scripts from a CDN
    metrics = Metrics(engine)
    started = int(time.time())
    page = (STATIC / "index.html").read_text(encoding="utf-8")

    # ---- errors: every one OpenAI-shaped, and counted ------------------------------------------------
    def error_response(err: APIError) -> JSONResponse:
        metrics.reject(err.status)
        headers = {"Retry-After": "1"} if err.status == 429 else None
        return JSONResponse(err.body(), status_code=err.status, headers=headers)

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc: HTTPException):
        msg = f"Invalid URL ({request.method} {request.url.path})" if exc.status_code in (404, 405) else exc.detail
        return error_response(APIError(exc.status_code, msg))

    @app.exception_handler(Exception)
    async def _internal_error(request, exc: Exception):   # Starlette re-raises it after: uvicorn logs it
        return error_response(server_error(f"Internal server error: {type(exc).__name__}: {exc}"))

    # ---- completions ----------------------------------------------------------------------------------
    async def submit(requests) -> list:
        streams = []
        try:
            for r in requests:
                stream = engine.submit(r)
                streams.append(await stream if inspect.isawaitable(stream) else stream)
        except QueueFullError as e:
            raise APIError(429, str(e) or "The server is busy: too many requests are waiting.",
                           type="rate_limit_error", code="rate_limit_exceeded") from e
        except EngineClosedError as e:
            raise server_error(str(e) or "The engine has stopped.", 503) from e
        except ContextFullError as e:
            raise invalid(str(e), code="context_length_exceeded") from e
        except (ValueError, ShaderLMError) as e:
            raise invalid(str(e)) from e
        finally:
            if len(streams) < len(requests):     # n > 1 and a later choice was refused: free the others
                for s in streams:
                    s.cancel()
        return streams

    async def complete(request: Request, kind, fmt):
        try:
            body = kind.model_validate_json(await request.body())
        except ValidationError as e:
            raise from_validation(e) from e
        body.check_supported()
        if body.model and body.model != engine.model_name:
            raise model_not_found(body.model)
        try:   # templates and tokenizing take a while on long prompts: off the event loop
            requests = await run_in_threadpool(body.engine_requests, engine.tokenizer, engine.ctx)
        except (ValueError, ShaderLMError) as e:
            raise invalid(str(e)) from e
        run = Run(await submit(requests), requests, body.n or 1)
        writer = Writer(fmt(engine.tokenizer), engine.model_name, run, body.wants_logprobs)
        # which replica took each choice, where there are replicas
        replicas = [getattr(s, "replica", None) for s in run.streams]
        headers = {"X-Shaderlm-Replica": ",".join(replicas)} if all(replicas) else {}
        if body.stream:
            return EventStream(writer.sse(body.include_usage), run, headers)
        try:
            result = await _unless_disconnected(request, writer.complete())
        finally:
            run.cancel()
        # 499: the client closed the connection (nobody reads this)
        return JSONResponse(result, headers=headers) if result is not None else Response(status_code=499)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, ChatRequest, ChatFormat)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, CompletionRequest, TextFormat)

    # ---- the rest -------------------------------------------------------------------------------------
    def model_card():
        return {"id": engine.model_name, "object": "model", "created": started, "owned_by": "shaderlm"}

    @app.get("/v1/models")
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def get_model(name: str):
        if name != engine.model_name:
            raise model_not_found(name)
        return model_card()

    @app.get("/health")
    async def health():
        stats = {"status": "ok", **engine.stats()}
        return JSONResponse(stats, status_code=200 if stats["status"] == "ok" else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse)
    async def chat_page():
        return page

    return app


async def _unless_disconnected(request: Request, work):
    """The result of coroutine `work`, or None if the client disconnects first (then `work` is cancelled)."""
    async def gone():
        # the body has been read: the next message is the disconnect
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        finished = task.done()
        if not finished:
            task.cancel()
    return task.result() if finished else None


def serve(engine, host: str = "127.0.0.1", port: int = 8080, log_level: str = "info") -> None:
    """Serve until interrupted. Streams still open at shutdown are cut after a few seconds (and their
    sequences freed); closing the engine is the caller's business."""
    import uvicorn
    uvicorn.run(create_app(engine), host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
