"""The OpenAI-compatible HTTP endpoint (`/v1/chat/completions`, `/v1/models`).

Each choice carries three fields beyond the OpenAI schema, which training reads:
`prompt_token_ids` (the exact prompt the engine saw), `token_ids` (the sampled tokens)
and `token_logprobs` (their logprobs under the model's temperature-1 distribution).
Bad requests get a 4xx in OpenAI's error shape naming the parameter (see
`openai_request.py`); the server keeps serving.

Nothing heavy runs on the event loop: the body is parsed, the chat template rendered and
the prompt tokenized in worker threads, so `/health` and small requests are answered
while a huge one is worked on. A client that disconnects, streaming or not, cancels its
request: the engine drops its rows at the next decode step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .chat_format import parse_tool_calls, render_prompt
from .engine import Sample, SamplingParams, TransformersEngine
from .openai_request import (
    BODY_BYTES_PER_TOKEN,
    MIN_BODY_BYTES,
    ApiError,
    ChatCompletionRequest,
    log_rejected,
    parse_chat_request,
    read_body,
    validation_error,
)
from .structured import Grammar, GrammarError, Grammars

logger = logging.getLogger("art.endpoint")

DEFAULT_MAX_TOKENS = 2048  # when a request sets none: a small model can ramble for a long time


@dataclass(frozen=True)
class Route:
    """Where a `model` name is served: an engine, and the adapter to use (None: the base)."""

    engine: TransformersEngine
    tokenizer: Any
    chat_template: str | None
    adapter: str | None
    context_length: int


class Router(Protocol):
    """Maps model names to routes (the model service is one)."""

    def route(self, model: str) -> Route:
        """The route for `model`; KeyError with a message naming what exists if none."""
        ...

    def model_names(self) -> list[str]: ...

    def longest_context(self) -> int:
        """The longest context (in tokens) of the models served; it bounds a request body."""
        ...


def build_app(router: Router, api_key: str | None) -> FastAPI:
    """The FastAPI app serving `router`'s models. With `api_key`, /v1 routes require it.

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
        try:
            route = await asyncio.to_thread(router.route, body.model)
        except KeyError as error:
            raise ApiError(
                404, str(error.args[0]), param="model", code="model_not_found"
            ) from error
        job = await asyncio.to_thread(_prepare, body, route)
        constrained = job.prefill or (body.response_format or {}).get("type", "text") != "text"
        if constrained:  # compiling may take a while: off the event loop
            grammar = await asyncio.to_thread(_grammar, body, route, job)
            job = replace(job, params=replace(job.params, grammar=grammar))
        if body.stream:
            # Starlette cancels the stream when the client disconnects; the stream then
            # cancels its generation (see `_stream`).
            return StreamingResponse(_stream(body, route, job), media_type="text/event-stream")
        generation = route.engine.generate(
            job.prompt_ids, job.params, n=body.n, adapter=route.adapter
        )
        samples = await _unless_disconnected(request, generation)
        return JSONResponse(_completion(body, route, job, samples))

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


@dataclass(frozen=True)
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    prefill: str  # assistant text forced before sampling (a required tool call)
    forced_tool: str | None  # the tool whose call the prefill opens
    tool_names: tuple[str, ...]  # the tools offered (none: no tool calls are parsed)

    @property
    def parse_tools(self) -> bool:
        return bool(self.tool_names)


def _prepare(body: ChatCompletionRequest, route: Route) -> _Job:
    tools = body.tools if body.tool_choice != "none" else None
    if tools and route.chat_template is None and "tools" not in str(route.tokenizer.chat_template):
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
        text = render_prompt(route.tokenizer, body.messages, tools, route.chat_template)
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
    return _Job(prompt_ids, params, prefill, forced, tool_names=tuple(names))


def _grammar(body: ChatCompletionRequest, route: Route, job: _Job) -> Grammar | None:
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


def _message(body: ChatCompletionRequest, job: _Job, sample: Sample) -> tuple[dict[str, Any], str]:
    text = job.prefill + sample.text
    if not job.parse_tools:
        return {"role": "assistant", "content": text}, sample.finish_reason
    if job.forced_tool is not None:
        calls, content = _forced_call(job.forced_tool, sample.text), None
    else:
        parsed = parse_tool_calls(text)
        calls, content = parsed.tool_calls, parsed.content
    if not calls or any(call["function"]["name"] not in job.tool_names for call in calls):
        return {"role": "assistant", "content": text}, sample.finish_reason  # malformed: as text
    calls = calls if body.parallel_tool_calls else calls[:1]
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


def _forced_call(name: str, arguments_text: str) -> list[dict[str, Any]]:
    """The call whose arguments the model wrote after a forced `"arguments": ` prefill.

    The first complete JSON object is the arguments; whatever follows is ignored.
    """
    try:
        arguments, _ = json.JSONDecoder().raw_decode(arguments_text.lstrip())
    except json.JSONDecodeError:
        return []
    if not isinstance(arguments, dict):
        return []
    call = {"name": name, "arguments": arguments}
    return parse_tool_calls(f"<tool_call>{json.dumps(call)}</tool_call>").tool_calls


def _logprobs(route: Route, sample: Sample) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = route.tokenizer.decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}

    content = []
    for i, (token_id, logprob) in enumerate(zip(sample.token_ids, sample.logprobs, strict=True)):
        item = entry(token_id, logprob)
        alternatives = sample.top_logprobs[i] if sample.top_logprobs else []
        item["top_logprobs"] = [entry(t, lp) for t, lp in alternatives]
        content.append(item)
    return {"content": content, "refusal": None}


def _choice(
    body: ChatCompletionRequest, route: Route, job: _Job, index: int, sample: Sample
) -> dict[str, Any]:
    message, finish_reason = _message(body, job, sample)
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason,
        "logprobs": _logprobs(route, sample) if body.logprobs else None,
        "prompt_token_ids": job.prompt_ids,
        "token_ids": sample.token_ids,
        "token_logprobs": sample.logprobs,
    }


def _usage(job: _Job, samples: list[Sample]) -> dict[str, int]:
    completion = sum(len(sample.token_ids) for sample in samples)
    prompt = len(job.prompt_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _completion(
    body: ChatCompletionRequest, route: Route, job: _Job, samples: list[Sample]
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.model,
        "choices": [_choice(body, route, job, i, sample) for i, sample in enumerate(samples)],
        "usage": _usage(job, samples),
    }


async def _stream(body: ChatCompletionRequest, route: Route, job: _Job) -> AsyncIterator[str]:
    """Server-sent events: text deltas as tokens are sampled, then the finished choices.

    Text with tools or stop strings is sent whole at the end, once it is known whether it
    holds a tool call or a stop string.
    """
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    incremental = not job.parse_tools and not job.params.stop and not job.prefill
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        data: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": body.model,
            "choices": choices,
        }
        if usage is not None:
            data["usage"] = usage
        return f"data: {json.dumps(data)}\n\n"

    def on_token(index: int, token_id: int) -> None:
        loop.call_soon_threadsafe(tokens.put_nowait, (index, token_id))

    generation = asyncio.ensure_future(
        route.engine.generate(
            job.prompt_ids,
            job.params,
            n=body.n,
            adapter=route.adapter,
            on_token=on_token if incremental else None,
        )
    )
    getter: asyncio.Future[tuple[int, int]] | None = None
    try:
        for index in range(body.n):
            yield chunk(
                [
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                ]
            )
        sent = [""] * body.n
        ids: list[list[int]] = [[] for _ in range(body.n)]
        while incremental and not (generation.done() and tokens.empty()):
            getter = asyncio.ensure_future(tokens.get())
            await asyncio.wait({getter, generation}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            index, token_id = getter.result()
            ids[index].append(token_id)
            text = route.tokenizer.decode(ids[index], skip_special_tokens=True)
            if text.endswith("\ufffd"):
                continue  # half of a multi-byte character: wait for the rest
            delta, sent[index] = text[len(sent[index]) :], text
            if delta:
                yield chunk([{"index": index, "delta": {"content": delta}, "finish_reason": None}])
        try:
            samples = await generation
        except Exception as error:  # headers are sent: the failure goes in the stream
            logger.warning("stream %s failed: %s: %s", completion_id, type(error).__name__, error)
            failure = {"message": f"generation failed: {error}", "type": "server_error"}
            yield f"data: {json.dumps({'error': failure})}\n\n"
            return
        for index, sample in enumerate(samples):
            message, finish_reason = _message(body, job, sample)
            final_delta: dict[str, Any] = {}
            content = message.get("content") or ""
            if content[len(sent[index]) :]:
                final_delta["content"] = content[len(sent[index]) :]
            if message.get("tool_calls"):
                final_delta["tool_calls"] = [
                    {"index": i, **call} for i, call in enumerate(message["tool_calls"])
                ]
            final = _choice(body, route, job, index, sample)
            final.pop("message")
            yield chunk([{**final, "delta": final_delta, "finish_reason": finish_reason}])
        if body.stream_options and body.stream_options.get("include_usage"):
            yield chunk([], usage=_usage(job, samples))
        yield "data: [DONE]\n\n"
    finally:  # the client may have gone: stop decoding for it
        generation.cancel()
        if getter is not None:
            getter.cancel()


__all__ = ["ApiError", "ChatCompletionRequest", "Route", "Router", "build_app"]
