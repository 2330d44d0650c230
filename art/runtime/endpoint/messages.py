"""Anthropic's Messages API: `POST /v1/messages`, whole or streamed, on the shared engines.

A request is read as Anthropic documents it (`model`, `max_tokens`, `messages` of text,
`tool_use` and `tool_result` blocks, `system`, `tools`, `tool_choice`, `stop_sequences`,
`temperature`, `top_p`, `stream`, `metadata`, `output_config.format`) and translated into
a chat request: `tool_use` blocks become OpenAI `tool_calls`, each `tool_result` a `tool`
message (its text prefixed `Error: ` when `is_error`), consecutive turns of one role are
combined as Anthropic combines them, and `tool_choice` any/tool/none becomes
required/function/none. From there it is rendered, constrained and sampled as a chat
completion is (`jobs.py`), and the answer is one message of `text` and `tool_use` blocks
with Anthropic's `stop_reason` and `usage`, and beside them our four token fields
(`prompt_token_ids`, `token_ids`, `token_logprobs`, `policy_version`): at the top level
of the message, or streamed, at the top level of the `message_delta` event.

What it cannot honour it refuses with a 400 naming the field, in Anthropic's error shape:
images and documents (text-only models), thinking, prompt caching (`cache_control`),
server tools, `top_k`, service tiers, prefill (a conversation ending with an assistant
turn), and any field it does not know. The `anthropic-version` header is required, as
Anthropic requires it; its value is not checked (one request shape is served).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from starlette.background import BackgroundTask

from ..engines.base import Sample
from .jobs import ready_job, run_job
from .request import ApiError, ChatCompletionRequest, read_body, validation_error
from .response import Job, Route, assistant_message

if TYPE_CHECKING:
    from .server import Router

# Top-level fields the Anthropic SDK can send that this endpoint cannot honour; null is
# taken as absent. Each says why, and what to send instead.
_REFUSED = {
    "top_k": "top_k is not supported by this engine (it samples with temperature and top_p); "
    "remove it",
    "cache_control": "prompt caching is not offered by this endpoint; remove cache_control",
    "container": "containers (for server tools) are not offered by this endpoint; remove it",
    "diagnostics": "prompt-cache diagnostics are not offered by this endpoint; remove it",
    "inference_geo": "inference regions are not offered by this endpoint; remove it",
    "service_tier": "this endpoint has a single service tier; remove service_tier",
    "speed": "speed modes are not offered by this endpoint; remove speed",
    "user_profile_id": "user profiles are not offered by this endpoint; remove user_profile_id",
    "workspace_id": "workspaces are not offered by this endpoint; remove workspace_id",
}
_NO_CACHE = "prompt caching is not offered by this endpoint; remove cache_control"
_TOOL_NAME = r"^[a-zA-Z0-9_-]{1,128}$"
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # "tool": a function


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Cacheable(_Strict):
    cache_control: Any = None

    @field_validator("cache_control")
    @classmethod
    def _no_cache(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError(_NO_CACHE)
        return value


class _TextBlock(_Cacheable):
    type: Literal["text"]
    text: str
    citations: list[Any] | None = None  # the SDK may send back a response's `null`

    @field_validator("citations")
    @classmethod
    def _no_citations(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("citations are not supported by this endpoint; send plain text")
        return value


class _DirectCaller(_Strict):
    type: Literal["direct"]


class _ToolUseBlock(_Cacheable):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    caller: _DirectCaller | None = None  # as a response's block is sent back
    toolset_name: None = None


class _ToolResultBlock(_Cacheable):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] = ""  # text blocks, read by `_blocks`
    is_error: bool = False
    toolset_name: None = None


_Block = _TextBlock | _ToolUseBlock | _ToolResultBlock
_BLOCKS: dict[str, type[_Block]] = {
    "text": _TextBlock,
    "tool_use": _ToolUseBlock,
    "tool_result": _ToolResultBlock,
}
_ALLOWED = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use"),
    "system": ("text",),
}


class _Message(_Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]] = Field(min_length=1)  # blocks, read by `_blocks`


class _Tool(_Cacheable):
    type: Literal["custom"] | None = None
    name: str = Field(pattern=_TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None

    @field_validator("type", mode="before")
    @classmethod
    def _custom_only(cls, value: Any) -> Any:
        if value not in (None, "custom"):
            raise ValueError(
                f"server tools ({value!r}) are not offered by this endpoint; only custom tools, "
                'given as {"name", "description", "input_schema"}'
            )
        return value

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError('a tool\'s input_schema is a JSON schema with "type": "object"')
        return value

    @field_validator("strict")
    @classmethod
    def _not_strict(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(
                "strict tools are not offered: inputs are constrained to the schema only under "
                'tool_choice {"type": "any"} or {"type": "tool"}; remove strict'
            )
        return value


class _ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _name_for_tool(self) -> _ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('name is given with type "tool", and only then')
        return self


class _Metadata(_Strict):
    user_id: str | None = None  # an end-user id for the caller's own bookkeeping


class _JsonFormat(_Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class _OutputConfig(_Strict):
    format: _JsonFormat | None = None
    effort: None = None


class MessagesRequest(_Strict):
    """A Messages API request, as Anthropic documents it, less what is refused."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[_Message] = Field(min_length=1)
    system: str | list[_TextBlock] | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    stop_sequences: list[str] | None = None
    temperature: float = Field(default=1.0, ge=0, le=1, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    stream: bool = False
    metadata: _Metadata | None = None
    thinking: dict[str, Any] | None = None
    output_config: _OutputConfig | None = None
    top_k: Any = None
    cache_control: Any = None
    container: Any = None
    diagnostics: Any = None
    inference_geo: Any = None
    service_tier: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None

    @field_validator(*_REFUSED)
    @classmethod
    def _refused(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            raise ValueError(_REFUSED[str(info.field_name)])
        return value

    @field_validator("thinking")
    @classmethod
    def _thinking_off(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value != {"type": "disabled"}:
            raise ValueError(
                "extended thinking is not offered by this endpoint; omit thinking or send "
                '{"type": "disabled"}'
            )
        return value

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not all(value):
            raise ValueError("stop sequences must not be empty strings")
        return value

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[_Tool] | None) -> list[_Tool] | None:
        names = [tool.name for tool in tools or []]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise ValueError(f"tools[{index}].name: {name!r} names two tools; names are unique")
        return tools


# --- reading a request ---------------------------------------------------------------------


def parse_messages_request(raw: bytes) -> tuple[MessagesRequest, ChatCompletionRequest]:
    """The request in `raw` and the chat request it reads as, or a 400 naming the field.

    Synchronous (it validates every block): the route calls it in a worker thread.
    """
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(
            400, f"body: the request body is not valid JSON ({error})", param="body"
        ) from error
    if not isinstance(data, dict):
        raise ApiError(400, "body: the request body must be a JSON object", param="body")
    try:
        body = MessagesRequest.model_validate(data)
    except ValidationError as error:
        raise validation_error(error.errors()) from error
    return body, _chat_request(body)


def _chat_request(body: MessagesRequest) -> ChatCompletionRequest:
    tool_choice: str | dict[str, Any] | None = None
    choice = body.tool_choice
    if choice is not None:
        if choice.type in ("any", "tool") and not body.tools:
            raise ApiError(
                400,
                f'tool_choice: {{"type": "{choice.type}"}} needs tools; give tools or use "auto"',
                param="tool_choice",
            )
        if choice.type == "tool" and choice.name not in [tool.name for tool in body.tools or []]:
            raise ApiError(
                400, f"tool_choice.name: {choice.name!r} is not in tools", param="tool_choice.name"
            )
        forced = {"type": "function", "function": {"name": choice.name}}
        tool_choice = forced if choice.type == "tool" else _TOOL_CHOICES[choice.type]
    response_format = None
    if body.output_config is not None and body.output_config.format is not None:
        schema = body.output_config.format.json_schema
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema, "strict": True},
        }
    chat = ChatCompletionRequest(
        model=body.model,
        messages=_chat_messages(body),
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        tools=[_function_tool(tool) for tool in body.tools] if body.tools else None,
        tool_choice=tool_choice,
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        stream=body.stream,
        response_format=response_format,
        user=body.metadata.user_id if body.metadata is not None else None,
    )
    # Anthropic bounds stop sequences by count only loosely; OpenAI's limit of four is not ours.
    return chat.model_copy(update={"stop": body.stop_sequences})


def _function_tool(tool: _Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema
    return {"type": "function", "function": function}


def _chat_messages(body: MessagesRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages: system first, then each turn."""
    chat: list[dict[str, Any]] = []
    if body.system is not None:
        system = body.system
        chat.append(
            {"role": "system", "content": system if isinstance(system, str) else _parts(system)}
        )
    turns = _turns(body.messages)
    if turns and turns[-1][0] == "assistant":
        raise ApiError(
            400,
            f"messages[{len(body.messages) - 1}].role: the conversation ends with an assistant "
            "turn; continuing it (prefill) is not supported: end with a user turn",
            param=f"messages[{len(body.messages) - 1}].role",
        )
    called: set[str] = set()
    for role, blocks in turns:
        if role == "assistant":
            chat.append(_assistant(blocks))
            called.update(block.id for block, _ in blocks if isinstance(block, _ToolUseBlock))
        elif role == "system":
            chat.append({"role": "system", "content": _parts(_texts(blocks))})
        else:
            chat.extend(_user(blocks, called))
    return chat


_Turn = tuple[str, list[tuple[_Block, str]]]  # a role, and its blocks with their paths


def _turns(messages: Sequence[_Message]) -> list[_Turn]:
    """The messages' blocks, read and checked; consecutive turns of one role combined."""
    turns: list[_Turn] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}].content"
        content = message.content
        items = [{"type": "text", "text": content}] if isinstance(content, str) else content
        blocks = _blocks(items, where, _ALLOWED[message.role])
        if turns and turns[-1][0] == message.role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((message.role, blocks))
    return turns


def _blocks(items: Sequence[Any], where: str, allowed: Sequence[str]) -> list[tuple[_Block, str]]:
    """`items` read as content blocks of the kinds `allowed`, each with its path."""
    blocks: list[tuple[_Block, str]] = []
    for index, item in enumerate(items):
        path = f"{where}[{index}]"
        kind = item.get("type") if isinstance(item, dict) else None
        if kind not in allowed:
            raise ApiError(400, _unsupported_block(kind, path, allowed), param=f"{path}.type")
        try:
            blocks.append((_BLOCKS[str(kind)].model_validate(item), path))
        except ValidationError as error:
            prefix = _path_parts(path)
            raise validation_error(
                [{**e, "loc": (*prefix, *e["loc"])} for e in error.errors()]
            ) from error
    return blocks


def _unsupported_block(kind: object, path: str, allowed: Sequence[str]) -> str:
    takes = f"this content takes {' and '.join(allowed)} blocks"
    if kind in ("image", "document", "search_result"):
        return (
            f"{path}: {kind} blocks are not supported: this endpoint serves text-only models; "
            f"send the content as text ({takes})"
        )
    if kind in ("thinking", "redacted_thinking"):
        return f"{path}: {kind} blocks are not supported: thinking is not offered ({takes})"
    if kind in _BLOCKS:
        return f"{path}: {kind} blocks do not belong here; {takes}"
    return f"{path}: {kind!r} blocks are not supported by this endpoint; {takes}"


def _path_parts(path: str) -> list[int | str]:
    """`messages[2].content[0]` as ("messages", 2, "content", 0)."""
    return [int(part) if part.isdigit() else part for part in re.findall(r"[^.\[\]]+", path)]


def _texts(blocks: Sequence[tuple[_Block, str]]) -> list[_TextBlock]:
    return [block for block, _ in blocks if isinstance(block, _TextBlock)]


def _parts(blocks: Sequence[_TextBlock]) -> list[dict[str, Any]]:
    """Text blocks as OpenAI text parts: the rendering joins them or keeps them, as its
    template reads content."""
    return [{"type": "text", "text": block.text} for block in blocks]


def _assistant(blocks: list[tuple[_Block, str]]) -> dict[str, Any]:
    text = "".join(block.text for block in _texts(blocks))
    calls = [
        {
            "id": block.id,
            "type": "function",
            "function": {"name": block.name, "arguments": json.dumps(block.input)},
        }
        for block, _ in blocks
        if isinstance(block, _ToolUseBlock)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[tuple[_Block, str]], called: set[str]) -> list[dict[str, Any]]:
    """A user turn: a `tool` message per tool result, a user message per run of text."""
    chat: list[dict[str, Any]] = []
    text: list[_TextBlock] = []
    for block, path in blocks:
        if isinstance(block, _TextBlock):
            text.append(block)
            continue
        assert isinstance(block, _ToolResultBlock)
        if text:
            chat.append({"role": "user", "content": _parts(text)})
            text = []
        if block.tool_use_id not in called:
            raise ApiError(
                400,
                f"{path}.tool_use_id: {block.tool_use_id!r} answers no tool_use block of an "
                "earlier assistant turn",
                param=f"{path}.tool_use_id",
            )
        chat.append(
            {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result(block, path)}
        )
    if text:
        chat.append({"role": "user", "content": _parts(text)})
    return chat


def _result(block: _ToolResultBlock, path: str) -> str:
    if isinstance(block.content, str):
        text = block.content
    else:
        parts = _blocks(block.content, f"{path}.content", ("text",))
        text = "\n".join(part.text for part in _texts(parts))
    return f"Error: {text}" if block.is_error else text


# --- answering -------------------------------------------------------------------------------


def _answer(
    body: MessagesRequest, chat: ChatCompletionRequest, route: Route, job: Job, sample: Sample
) -> tuple[dict[str, Any], Sample]:
    """The message for `sample` (token fields included), and the sample it stands for."""
    message, finish_reason, sample = assistant_message(chat, job, sample, route.tokenizer)
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append(
            {
                "type": "tool_use",
                "id": "toolu_" + call["id"].removeprefix("call_"),
                "name": call["function"]["name"],
                "input": json.loads(call["function"]["arguments"]),
            }
        )
    stop_reason, stop_sequence = _stop_reason(finish_reason, sample, body.stop_sequences, route)
    answer = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": body.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": len(job.prompt_ids), "output_tokens": len(sample.token_ids)},
        **_token_fields(route, job, sample),
    }
    return answer, sample


def _token_fields(route: Route, job: Job, sample: Sample) -> dict[str, Any]:
    return {
        "prompt_token_ids": job.prompt_ids,
        "token_ids": sample.token_ids,
        "token_logprobs": sample.logprobs,
        "policy_version": route.step,
    }


def _stop_reason(
    finish_reason: str, sample: Sample, stops: list[str] | None, route: Route
) -> tuple[str, str | None]:
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if stops:
        # The engine cuts the text before the stop string it met; the sampled ids hold it.
        full = route.tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        if full.startswith(sample.text):
            after = full[len(sample.text) :]
            for stop in stops:
                if after.startswith(stop):
                    return "stop_sequence", stop
    return "end_turn", None


def _renamed(error: ApiError) -> ApiError:
    """A chat-shaped error from rendering or compiling, with this protocol's field names."""
    renames = [
        (r"^tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema"),
        (r"^response_format", "output_config.format"),
    ]
    param, message = error.param, error.message
    for pattern, name in renames:
        if param is not None and re.match(pattern, param):
            param = re.sub(pattern, name, param)
            message = re.sub(pattern, name, message)
    return ApiError(error.status, message, param=param, code=error.code)


def _event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


async def _stream(
    body: MessagesRequest,
    chat: ChatCompletionRequest,
    route: Route,
    job: Job,
    release: Callable[[], None],
) -> AsyncIterator[str]:
    """Anthropic's server-sent events: text as it is sampled, then the finished blocks.

    Text with tools, stop sequences or a forced call is sent whole at the end, once it is
    known whether it holds a tool call or a stop sequence.
    """
    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[int] = asyncio.Queue()
    incremental = not job.parse_tools and not job.params.stop and not job.prefill

    def on_token(_: int, token_id: int) -> None:
        loop.call_soon_threadsafe(tokens.put_nowait, token_id)

    generation = asyncio.ensure_future(
        route.engine.generate(
            job.prompt_ids,
            job.params,
            n=1,
            adapter=route.adapter,
            on_token=on_token if incremental else None,
        )
    )
    getter: asyncio.Future[int] | None = None
    try:
        start: dict[str, Any] = {
            "id": f"msg_{uuid.uuid4().hex}",
            "type": "message",
            "role": "assistant",
            "model": body.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(job.prompt_ids), "output_tokens": 0},
        }
        yield _event("message_start", {"type": "message_start", "message": start})
        yield _event("ping", {"type": "ping"})
        sent, ids = "", []
        while incremental and not (generation.done() and tokens.empty()):
            getter = asyncio.ensure_future(tokens.get())
            await asyncio.wait({getter, generation}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            ids.append(getter.result())
            text = route.tokenizer.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd"):
                continue  # half of a multi-byte character: wait for the rest
            if text[len(sent) :]:
                if not sent:
                    yield _block_start(0, {"type": "text", "text": ""})
                yield _delta(0, {"type": "text_delta", "text": text[len(sent) :]})
                sent = text
        try:
            (sample,) = await generation
        except Exception as error:  # headers are sent: the failure goes in the stream
            failure = {"type": "api_error", "message": f"generation failed: {error}"}
            yield _event("error", {"type": "error", "error": failure})
            return
        answer, sample = _answer(body, chat, route, job, sample)
        if sent and not answer["content"]:  # streamed text the answer does not hold
            yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        for index, block in enumerate(answer["content"]):
            if block["type"] == "text":
                streamed = sent if index == 0 else ""  # incremental text is block 0
                if not streamed:
                    yield _block_start(index, {"type": "text", "text": ""})
                rest = block["text"][len(streamed) :]
                if rest:
                    yield _delta(index, {"type": "text_delta", "text": rest})
            else:
                yield _block_start(index, {**block, "input": {}})
                partial = json.dumps(block["input"])
                yield _delta(index, {"type": "input_json_delta", "partial_json": partial})
            yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
        final = {
            "type": "message_delta",
            "delta": {
                "stop_reason": answer["stop_reason"],
                "stop_sequence": answer["stop_sequence"],
            },
            "usage": {"output_tokens": answer["usage"]["output_tokens"]},
            **_token_fields(route, job, sample),
        }
        yield _event("message_delta", final)
        yield _event("message_stop", {"type": "message_stop"})
    finally:  # the client may have gone: stop decoding for it
        generation.cancel()
        if getter is not None:
            getter.cancel()
        release()


def _block_start(index: int, block: dict[str, Any]) -> str:
    data = {"type": "content_block_start", "index": index, "content_block": block}
    return _event("content_block_start", data)


def _delta(index: int, delta: dict[str, Any]) -> str:
    return _event(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def _once(release: Callable[[], None]) -> Callable[[], None]:
    """`release`, run on the first call only: a stream may end two ways."""
    done = threading.Event()

    def once() -> None:
        if not done.is_set():
            done.set()
            release()

    return once


# --- the route -------------------------------------------------------------------------------


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
        raw = await read_body(request, max_body_bytes())
        body, chat = await asyncio.to_thread(parse_messages_request, raw)
        del raw
        try:
            route = await asyncio.to_thread(router.route, body.model)
        except KeyError as error:
            raise ApiError(
                404, str(error.args[0]), param="model", code="model_not_found"
            ) from error
        release = _once(route.release)
        streaming = False
        try:
            try:
                job = await ready_job(chat, route)
            except ApiError as error:
                raise _renamed(error) from error
            if body.stream:
                # As the chat route: the stream releases the route when it ends however it
                # ends, and the background task does if the stream never started.
                streaming = True
                return StreamingResponse(
                    _stream(body, chat, route, job, release),
                    media_type="text/event-stream",
                    background=BackgroundTask(release),
                )
            (sample,) = await run_job(request, route, job)
            answer, _ = _answer(body, chat, route, job, sample)
            return JSONResponse(answer)
        finally:
            if not streaming:
                release()


__all__ = ["MessagesRequest", "add_messages_route", "parse_messages_request"]
