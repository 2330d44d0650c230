"""OpenAI's Responses API on the chat engine: `POST /v1/responses`, `GET /v1/responses/{id}`.

A request is read into a `ChatCompletionRequest` and runs as a chat does (`jobs.ready_job`,
`run_job`, `response.assistant_message`). `request.py` holds what a request may hold,
`chat.py` its reading as a chat, `answer.py` the response object, `stream.py` its event
sequence and `store.py` the stored responses; the routes are here.

The four fields training reads (`prompt_token_ids`, `token_ids`, `token_logprobs`,
`policy_version`) sit on the response object; in a stream, on the response inside its
last event, `response.completed`. Stored responses (`store`, true by default) are kept in
memory, the last `STORED_RESPONSES` used, for `previous_response_id` and GET; the server
forgets them when it stops. Parameters we cannot honour (reasoning, background,
truncation, hosted tools, ...) are refused naming them, unless they are unset or at
OpenAI's default.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..jobs import find_route, once, read_request, run_job
from ..request import ApiError
from ..streaming import event_stream
from .answer import Answer, new_id
from .chat import chat_messages, chat_request, ready
from .request import ResponsesRequest, parse_responses_request
from .store import STORED_RESPONSES, ResponseStore, StoredResponse
from .stream import stream

if TYPE_CHECKING:
    from ..response import Router


def add_responses_route(app: FastAPI, router: Router, max_body_bytes: Callable[[], int]) -> None:
    """Serve `POST /v1/responses` and `GET /v1/responses/{response_id}` on `app`."""
    store = ResponseStore()

    @app.post("/v1/responses", response_model=None)
    async def create_response(request: Request) -> JSONResponse | StreamingResponse:
        body = await read_request(request, max_body_bytes(), parse_responses_request)
        previous = None
        if body.previous_response_id is not None:
            previous = store.get(body.previous_response_id)
            if previous is None:
                raise ApiError(
                    400,
                    f"previous_response_id: no stored response has id "
                    f"{body.previous_response_id!r} (responses are kept in memory, the last "
                    f"{store.capacity}, while the server runs, and only with store true)",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
        chat, items = await asyncio.to_thread(chat_request, body, previous)
        route = await find_route(router, body.model)
        release = once(route.release)
        streaming = False
        try:
            job = await ready(chat, route)
            answer = Answer(new_id("resp"), int(time.time()), body, route, job, chat)
            if body.stream:
                streaming = True
                return event_stream(stream(answer, store, items, release), release)
            (sample,) = await run_job(request, route, job)
            output, sample, length = answer.output(sample)
            final = answer.finished(sample, output, length)
            if body.store is not False:
                store.put(answer.id, StoredResponse(final, [*items, *output]))
            return JSONResponse(final)
        finally:
            if not streaming:
                release()

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> JSONResponse:
        for name in request.query_params:
            raise ApiError(
                400, f"{name}: not supported when retrieving a response; leave it out", param=name
            )
        stored = store.get(response_id)
        if stored is None:
            raise ApiError(
                404,
                f"no stored response has id {response_id!r}",
                param="response_id",
                code="not_found",
            )
        return JSONResponse(stored.response)


__all__ = [
    "STORED_RESPONSES",
    "ResponseStore",
    "ResponsesRequest",
    "StoredResponse",
    "add_responses_route",
    "chat_messages",
    "chat_request",
    "parse_responses_request",
]
