"""The OpenAI-compatible HTTP endpoint (`/v1/chat/completions`, `/v1/models`).

Each choice carries three fields beyond the OpenAI schema, which training reads:
`prompt_token_ids` (the exact prompt the engine saw), `token_ids` (the sampled tokens)
and `token_logprobs` (their logprobs under the model's temperature-1 distribution).
Bad requests get a 4xx in OpenAI's error shape naming the parameter; the server keeps
serving.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...core.trajectories import check_message_or_choice, check_tool
from .chat_format import parse_tool_calls, render_prompt
from .engine import Sample, SamplingParams, TransformersEngine
from .structured import Grammar, GrammarError, Grammars

DEFAULT_MAX_TOKENS = 2048  # when a request sets none: a small model can ramble for a long time


class ApiError(Exception):
    """An error answered as OpenAI does: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        body = {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


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


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=64)
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    frequency_penalty: float = Field(default=0.0, ge=0, le=0)
    presence_penalty: float = Field(default=0.0, ge=0, le=0)
    response_format: dict[str, Any] | None = None
    user: str | None = None  # an end-user id for the caller's own bookkeeping

    @field_validator("messages")
    @classmethod
    def _check_messages(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, message in enumerate(messages):
            checked = check_message_or_choice(message, f"messages[{index}]")
            if not isinstance(checked, dict):
                raise ValueError(f"messages[{index}] must be a message object")
        return messages

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for index, tool in enumerate(tools or []):
            check_tool(tool, f"tools[{index}]")
        return tools

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and (len(stop) > 4 or not all(stop)):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stop

    @field_validator("response_format")
    @classmethod
    def _check_response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        kind = (value or {}).get("type")
        if value is None or kind in ("text", "json_object"):
            return value
        if kind != "json_schema":
            raise ValueError(f"type {kind!r} is not one of 'text', 'json_object', 'json_schema'")
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise ValueError(
                'json_schema needs {"name": ..., "schema": {a JSON schema object}, "strict": true}'
            )
        return value


def build_app(router: Router, api_key: str | None) -> FastAPI:
    """The FastAPI app serving `router`'s models. With `api_key`, /v1 routes require it."""
    app = FastAPI(title="art model endpoint", docs_url=None, redoc_url=None)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return _validation_error(error).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return ApiError(error.status_code, str(error.detail)).response()

    @app.middleware("http")
    async def _auth(request: Request, call_next: Callable[[Request], Any]) -> Any:
        if api_key is not None and request.url.path.startswith("/v1"):
            header = request.headers.get("authorization", "")
            given = header.removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), api_key.encode()):
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
    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        try:
            route = await asyncio.to_thread(router.route, body.model)
        except KeyError as error:
            raise ApiError(
                404, str(error.args[0]), param="model", code="model_not_found"
            ) from error
        job = _prepare(body, route)
        constrained = job.prefill or (body.response_format or {}).get("type", "text") != "text"
        if constrained:  # compiling may take a while: off the event loop
            grammar = await asyncio.to_thread(_grammar, body, route, job)
            job = replace(job, params=replace(job.params, grammar=grammar))
        if body.stream:
            return StreamingResponse(_stream(body, route, job), media_type="text/event-stream")
        samples = await route.engine.generate(
            job.prompt_ids, job.params, n=body.n, adapter=route.adapter
        )
        return JSONResponse(_completion(body, route, job, samples))

    return app


def _validation_error(error: RequestValidationError) -> ApiError:
    first = error.errors()[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = f"unsupported parameter {param!r}"
    elif first.get("type") == "less_than_equal" and param in (
        "frequency_penalty",
        "presence_penalty",
    ):
        message = f"{param} is not supported by this engine; leave it at 0"
    if param and not message.startswith(param.split(".")[0]):
        message = f"{param}: {message}"
    return ApiError(400, message, param=param)


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


def _message(
    body: ChatCompletionRequest, job: _Job, sample: Sample, tokenizer: Any
) -> tuple[dict[str, Any], str, Sample]:
    """The assistant message of `sample`, its finish reason, and the sample as returned.

    With `parallel_tool_calls=False` only the first call is kept, and the returned sample
    ends where that call ends: the token ids (and logprobs) a trajectory trains on are
    the ones of the message it records, never of a call that was dropped.
    """
    text = job.prefill + sample.text
    if not job.parse_tools:
        return {"role": "assistant", "content": text}, sample.finish_reason, sample
    ends: list[int] = []
    if job.forced_tool is not None:
        calls, content = _forced_call(job.forced_tool, sample.text), None
    else:
        parsed = parse_tool_calls(text)
        calls, content, ends = parsed.tool_calls, parsed.content, parsed.call_ends
    if not calls or any(call["function"]["name"] not in job.tool_names for call in calls):
        # malformed: as text
        return {"role": "assistant", "content": text}, sample.finish_reason, sample
    if not body.parallel_tool_calls and len(calls) > 1:
        calls = calls[:1]
        sample = _truncated(sample, tokenizer, ends[0] - len(job.prefill))
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls", sample


def _truncated(sample: Sample, tokenizer: Any, end: int) -> Sample:
    """`sample` cut after the fewest tokens whose text reaches character `end`."""
    for count in range(1, len(sample.token_ids) + 1):
        text = tokenizer.decode(sample.token_ids[:count], skip_special_tokens=True)
        if len(text) >= end:
            break
    else:
        return sample
    return Sample(
        token_ids=sample.token_ids[:count],
        logprobs=sample.logprobs[:count],
        top_logprobs=sample.top_logprobs[:count],
        finish_reason=sample.finish_reason,
        text=tokenizer.decode(sample.token_ids[:count], skip_special_tokens=True),
    )


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
    message, finish_reason, sample = _message(body, job, sample, route.tokenizer)
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
        samples = await generation
        for index, sample in enumerate(samples):
            message, finish_reason, _ = _message(body, job, sample, route.tokenizer)
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
    finally:
        if not generation.done():
            generation.cancel()


__all__ = ["ApiError", "ChatCompletionRequest", "Route", "Router", "build_app"]
