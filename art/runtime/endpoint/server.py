"""The model endpoint over HTTP: the app, its auth, its error answers and its routes.

Four protocols on the same engines, grammars and routing: Chat Completions
(`/v1/chat/completions`, here), Completions (`completions/`), Responses
(`responses/`) and Anthropic's Messages (`messages/`); `/v1/models` lists what is
served. The chat request schema and its errors are in `request.py`, its answers in
`response.py` (streamed by `chat_stream.py`), and what every protocol shares
(rendering, tool policy, grammar, running the engine) in `jobs.py`. Bad requests get a 4xx naming the parameter, in the protocol's
own error shape (OpenAI's `{"error": {...}}`, Anthropic's `{"type": "error", ...}` on
`/v1/messages`); the server keeps serving. Either credential an SDK sends is accepted:
`Authorization: Bearer KEY` (OpenAI's) or `x-api-key: KEY` (Anthropic's).

Nothing heavy runs on the event loop: the body is parsed, the chat template rendered and
the prompt tokenized in worker threads, so `/health` and small requests are answered
while a huge one is worked on. A client that disconnects, streaming or not, cancels its
request: the engine drops its rows at the next decode step.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ..engines.base import AdapterGone, EngineUnavailable
from .chat_stream import stream
from .completions import add_completions_route
from .jobs import ClientGone, ready_job, run_job
from .messages import add_messages_route
from .request import (
    BODY_BYTES_PER_TOKEN,
    MIN_BODY_BYTES,
    ApiError,
    ChatCompletionRequest,
    error_protocol,
    log_rejected,
    parse_chat_request,
    read_body,
    validation_error,
)
from .response import Route, Router, completion
from .responses import add_responses_route


def build_app(router: Router, api_key: str | None, *, tokens_as_ids: bool = False) -> FastAPI:
    """The FastAPI app serving `router`'s models. With `api_key`, /v1 routes require it.

    `tokens_as_ids`: logprob tokens are written `token_id:N` unless a request says
    otherwise (`return_tokens_as_token_ids`), as ART's vLLM server writes them.

    A chat request body may hold `BODY_BYTES_PER_TOKEN` bytes per token of the longest
    context served (at least `MIN_BODY_BYTES`).
    """
    app = FastAPI(title="art model endpoint", docs_url=None, redoc_url=None)

    def max_body_bytes() -> int:
        return max(MIN_BODY_BYTES, router.longest_context() * BODY_BYTES_PER_TOKEN)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        log_rejected(request, error.status, error.message)
        return error.response(error_protocol(request))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        refused = validation_error(error.errors())
        log_rejected(request, refused.status, refused.message)
        return refused.response(error_protocol(request))

    @app.exception_handler(EngineUnavailable)
    async def _unavailable(request: Request, error: EngineUnavailable) -> JSONResponse:
        log_rejected(request, 503, str(error))
        return ApiError(503, str(error), code="engine_unavailable").response(
            error_protocol(request)
        )

    @app.exception_handler(AdapterGone)
    async def _adapter_gone(request: Request, error: AdapterGone) -> JSONResponse:
        message = (
            "the model this request named is no longer served: it was unloaded or deleted, or "
            f"its checkpoint removed, while the request waited ({error}); GET /v1/models "
            "lists what is served"
        )
        log_rejected(request, 404, message)
        return ApiError(404, message, param="model", code="model_not_found").response(
            error_protocol(request)
        )

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, error: ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it; logged once already

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        log_rejected(request, error.status_code, str(error.detail))
        return ApiError(error.status_code, str(error.detail)).response(error_protocol(request))

    if api_key is not None:
        app.add_middleware(RequireApiKey, api_key=api_key)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = router.model_names()
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "art"} for name in names]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        raw = await read_body(request, max_body_bytes())
        body = await asyncio.to_thread(parse_chat_request, raw)
        del raw  # a large body is not kept alive while the request decodes
        if body.return_tokens_as_token_ids is None:
            body.return_tokens_as_token_ids = tokens_as_ids
        try:
            route = await asyncio.to_thread(router.route, body.model)
        except KeyError as error:
            raise ApiError(
                404, str(error.args[0]), param="model", code="model_not_found"
            ) from error
        streaming = False
        try:
            job = await ready_job(body, route)
            if body.stream:
                # Starlette cancels the stream when the client disconnects; the stream then
                # cancels its generation and releases the route (see `chat_stream.stream`),
                # and so does the background task if the stream never started.
                streaming = True
                return StreamingResponse(
                    stream(body, route, job),
                    media_type="text/event-stream",
                    background=BackgroundTask(route.release),
                )
            samples = await run_job(request, route, job, n=body.n)
            return JSONResponse(completion(body, route, job, samples))
        finally:
            if not streaming:
                route.release()

    add_completions_route(app, router, max_body_bytes, tokens_as_ids=tokens_as_ids)
    add_responses_route(app, router, max_body_bytes)
    add_messages_route(app, router, max_body_bytes)
    return app


class RequireApiKey:
    """ASGI middleware: /v1 routes answer 401 unless the request carries `api_key`, as
    `Authorization: Bearer KEY` or `x-api-key: KEY`.

    Plain ASGI rather than `@app.middleware("http")`: Starlette's `BaseHTTPMiddleware`
    runs each request in a task group of its own and wraps every `receive` (the
    disconnect watch of `jobs.py` included) in another; with 256 concurrent requests on
    2 cores that was a fifth of the server thread's time (py-spy, 2026-12-02)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            request = Request(scope)
            header = request.headers.get("authorization", "")
            given = header.removeprefix("Bearer ").strip() or request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), self.api_key):
                log_rejected(request, 401, "missing or wrong API key")
                error = ApiError(401, "missing or wrong API key", code="invalid_api_key")
                await error.response(error_protocol(request))(scope, receive, send)
                return
        await self.app(scope, receive, send)


__all__ = ["ApiError", "ChatCompletionRequest", "RequireApiKey", "Route", "Router", "build_app"]
