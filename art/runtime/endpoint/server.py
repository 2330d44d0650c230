"""The OpenAI-compatible HTTP endpoint (`/v1/chat/completions`, `/v1/models`).

The request schema and its errors are in `request.py`, the answers (whole or streamed)
in `response.py`; here are the app, the tool-call policy (`_prepare`) and the choice of
grammar (`_grammar`). Bad requests get a 4xx in OpenAI's error shape
naming the parameter; the server keeps serving.

Nothing heavy runs on the event loop: the body is parsed, the chat template rendered and
the prompt tokenized in worker threads, so `/health` and small requests are answered
while a huge one is worked on. A client that disconnects, streaming or not, cancels its
request: the engine drops its rows at the next decode step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..chat_format import render_prompt
from ..engines.base import AdapterGone, EngineUnavailable, Sample, SamplingParams
from ..engines.structured import Grammar, GrammarError, Grammars
from .request import (
    BODY_BYTES_PER_TOKEN,
    MIN_BODY_BYTES,
    ApiError,
    ChatCompletionRequest,
    log_rejected,
    parse_chat_request,
    read_body,
    validation_error,
)
from .response import Job, Route, completion, stream

DEFAULT_MAX_TOKENS = 2048  # when a request sets none: a small model can ramble for a long time


class Router(Protocol):
    """Maps model names to routes (the model service is one)."""

    def route(self, model: str) -> Route:
        """The route for `model`; KeyError with a message naming what exists if none."""
        ...

    def model_names(self) -> list[str]: ...

    def longest_context(self) -> int:
        """The longest context (in tokens) of the models served; it bounds a request body."""
        ...


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
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        refused = validation_error(error.errors())
        log_rejected(request, refused.status, refused.message)
        return refused.response()

    @app.exception_handler(EngineUnavailable)
    async def _unavailable(request: Request, error: EngineUnavailable) -> JSONResponse:
        log_rejected(request, 503, str(error))
        return ApiError(503, str(error), code="engine_unavailable").response()

    @app.exception_handler(AdapterGone)
    async def _adapter_gone(request: Request, error: AdapterGone) -> JSONResponse:
        message = (
            "the model this request named is no longer served: it was unloaded or deleted, or "
            f"its checkpoint removed, while the request waited ({error}); GET /v1/models "
            "lists what is served"
        )
        log_rejected(request, 404, message)
        return ApiError(404, message, param="model", code="model_not_found").response()

    @app.exception_handler(_ClientGone)
    async def _gone(request: Request, error: _ClientGone) -> Response:
        return Response(status_code=499)  # nobody reads it; logged once already

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        log_rejected(request, error.status_code, str(error.detail))
        return ApiError(error.status_code, str(error.detail)).response()

    @app.middleware("http")
    async def _auth(request: Request, call_next: Callable[[Request], Any]) -> Any:
        if api_key is not None and request.url.path.startswith("/v1"):
            header = request.headers.get("authorization", "")
            given = header.removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                log_rejected(request, 401, "missing or wrong API key")
                return ApiError(401, "missing or wrong API key", code="invalid_api_key").response()
        return await call_next(request)

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
            job = await asyncio.to_thread(_prepare, body, route)
            constrained = job.prefill or (body.response_format or {}).get("type", "text") != "text"
            if constrained:  # compiling may take a while: off the event loop
                grammar = await asyncio.to_thread(_grammar, body, route, job)
                job = replace(job, params=replace(job.params, grammar=grammar))
            if body.stream:
                # Starlette cancels the stream when the client disconnects; the stream then
                # cancels its generation and releases the route (see `response.stream`),
                # and so does the background task if the stream never started.
                streaming = True
                return StreamingResponse(
                    stream(body, route, job),
                    media_type="text/event-stream",
                    background=BackgroundTask(route.release),
                )
            generation = route.engine.generate(
                job.prompt_ids, job.params, n=body.n, adapter=route.adapter
            )
            samples = await _unless_disconnected(request, generation)
            return JSONResponse(completion(body, route, job, samples))
        finally:
            if not streaming:
                route.release()

    return app


class _ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _unless_disconnected(request: Request, work: Awaitable[list[Sample]]) -> list[Sample]:
    """`await work`, cancelled as soon as the client disconnects.

    uvicorn does not cancel a handler whose client went away; once the body is read, the
    next ASGI message the request receives is its `http.disconnect`.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        log_rejected(request, 499, "the client disconnected; its generation was cancelled")
        raise _ClientGone
    return task.result()


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _prepare(body: ChatCompletionRequest, route: Route) -> Job:
    tools = body.tools if body.tool_choice != "none" else None
    if (
        tools
        and route.rendering.template is None
        and "tools" not in str(route.tokenizer.chat_template)
    ):
        raise ApiError(400, "this model's chat template has no tool support", param="tools")
    prefill, forced = "", None
    names = [tool["function"]["name"] for tool in tools or []]
    if tools and isinstance(body.tool_choice, dict):
        forced = body.tool_choice.get("function", {}).get("name")
        if forced not in names:
            raise ApiError(
                400, f"tool_choice names {forced!r}, which is not in tools", param="tool_choice"
            )
    elif tools and body.tool_choice == "required":
        forced = names[0] if len(names) == 1 else None
        prefill = "<tool_call>"
    if forced is not None:
        # The call is written up to its arguments; the model writes those.
        prefill = '<tool_call>{"name": ' + json.dumps(forced) + ', "arguments": '
    try:
        text = render_prompt(
            route.tokenizer, body.messages, tools, route.rendering, kwargs=body.chat_template_kwargs
        )
    except Exception as error:  # a template that cannot render these messages
        raise ApiError(400, f"messages: cannot be rendered: {error}", param="messages") from error
    prompt_ids: list[int] = route.tokenizer(text + prefill, add_special_tokens=False).input_ids
    room = route.context_length - len(prompt_ids)
    if room < 1:
        raise ApiError(
            400,
            f"messages: the prompt has {len(prompt_ids)} tokens; the model's context is "
            f"{route.context_length}",
            param="messages",
            code="context_length_exceeded",
        )
    asked = body.max_completion_tokens or body.max_tokens
    if asked is not None and asked > room:
        raise ApiError(
            400,
            f"max_tokens: {asked} does not fit: the prompt has {len(prompt_ids)} tokens and the "
            f"context is {route.context_length}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    params = SamplingParams(
        max_tokens=asked or min(DEFAULT_MAX_TOKENS, room),
        temperature=body.temperature,
        top_p=body.top_p,
        stop=stop,
        seed=body.seed,
        top_logprobs=body.top_logprobs or 0,
    )
    return Job(prompt_ids, params, prefill, forced, tool_names=tuple(names))


def _grammar(body: ChatCompletionRequest, route: Route, job: Job) -> Grammar | None:
    """The grammar the completion is sampled under: a forced call's arguments, else the
    `response_format` (a turn that must call a tool has no room for other JSON)."""
    grammars = route.engine.grammars
    if job.prefill:
        tools = body.tools or []
        if job.forced_tool is None:
            # `required` among several tools: one call of any of them, named and with
            # arguments that fit that tool's parameters.
            schema = {"anyOf": [_call_schema(tool) for tool in tools]}
            return _tools_grammar(
                grammars, tools, lambda: grammars.json_then(schema, "</tool_call>")
            )
        tool = next(t for t in tools if t["function"]["name"] == job.forced_tool)
        parameters = tool["function"].get("parameters")
        if not isinstance(parameters, dict):
            return None
        return _tools_grammar(
            grammars, tools, lambda: grammars.json_then(parameters, "}</tool_call>"), only=tool
        )
    response_format = body.response_format or {}
    try:
        if response_format.get("type") == "json_object":
            return grammars.json_object()
        if response_format.get("type") == "json_schema":
            spec = response_format["json_schema"]
            return grammars.json_schema(spec["schema"], strict=spec.get("strict") is not False)
    except GrammarError as error:
        raise ApiError(
            400,
            f"response_format: the JSON schema does not compile: {error}",
            param="response_format",
        ) from error
    return None


def _call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """A `<tool_call>` body for `tool`: its name, then arguments under its parameters."""
    parameters = tool["function"].get("parameters")
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool["function"]["name"]},
            "arguments": parameters if isinstance(parameters, dict) else {"type": "object"},
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _tools_grammar(
    grammars: Grammars,
    tools: list[dict[str, Any]],
    compile: Callable[[], Grammar],
    only: dict[str, Any] | None = None,
) -> Grammar:
    """`compile()`d, or a 400 naming the tool (of `tools`, or just `only`) that breaks it."""
    try:
        return compile()
    except GrammarError as error:
        param = "tools"
        for index, tool in enumerate(tools):
            parameters = tool["function"].get("parameters")
            if (only is not None and tool is not only) or not isinstance(parameters, dict):
                continue
            try:
                grammars.json_then(parameters, "")
            except GrammarError:
                param = f"tools[{index}].function.parameters"
                break
        raise ApiError(400, f"{param}: not a usable JSON schema: {error}", param=param) from error


__all__ = ["ApiError", "ChatCompletionRequest", "Route", "Router", "build_app"]
