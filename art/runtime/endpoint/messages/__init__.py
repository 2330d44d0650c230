"""Anthropic's Messages API: `POST /v1/messages`, whole or streamed, on the shared engines.

A request is read as Anthropic documents it (`model`, `max_tokens`, `messages` of text,
`tool_use` and `tool_result` blocks, `system`, `tools`, `tool_choice`, `stop_sequences`,
`temperature`, `top_p`, `stream`, `metadata`, `output_config.format`) and translated into
a chat request; from there it is rendered, constrained and sampled as a chat completion
is (`jobs.py`). `request.py` holds what a request may hold, `chat.py` its reading as a
chat, `answer.py` the whole answer, `stream.py` the streamed one; the route is here.

What it cannot honour it refuses with a 400 naming the field, in Anthropic's error shape.
The `anthropic-version` header is required, as Anthropic requires it; its value is not
checked (one request shape is served). Beta features (`anthropic-beta`) are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..jobs import find_route, once, read_request, run_job
from ..request import ApiError
from ..streaming import event_stream
from .answer import answer
from .chat import parse_messages_request, ready
from .request import MessagesRequest
from .stream import stream

if TYPE_CHECKING:
    from ..response import Router


def add_messages_route(app: FastAPI, router: Router, max_body_bytes: Callable[[], int]) -> None:
    """Serve `POST /v1/messages` (Anthropic's Messages API) on `app`."""

    @app.post("/v1/messages", response_model=None)
    async def messages(request: Request) -> JSONResponse | StreamingResponse:
        if "anthropic-version" not in request.headers:
            raise ApiError(
                400,
                "anthropic-version: header is required (the Anthropic SDK sends it; "
                "e.g. anthropic-version: 2023-06-01)",
                param="anthropic-version",
            )
        if "anthropic-beta" in request.headers:
            raise ApiError(
                400,
                f"anthropic-beta: beta features ({request.headers['anthropic-beta']}) are not "
                "offered by this endpoint; call without betas",
                param="anthropic-beta",
            )
        body, chat = await read_request(request, max_body_bytes(), parse_messages_request)
        route = await find_route(router, body.model)
        release = once(route.release)
        streaming = False
        try:
            job = await ready(chat, route)
            if body.stream:
                streaming = True
                return event_stream(stream(body, chat, route, job, release), release)
            (sample,) = await run_job(request, route, job)
            reply, _ = answer(body, chat, route, job, sample)
            return JSONResponse(reply)
        finally:
            if not streaming:
                release()


__all__ = ["MessagesRequest", "add_messages_route", "parse_messages_request"]
