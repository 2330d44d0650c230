"""OpenAI's Responses API on the chat engine: `POST /v1/responses`, `GET /v1/responses/{id}`.

A request is read into a `ChatCompletionRequest` and runs as a chat does (`jobs.ready_job`,
`run_job`, `response.assistant_message`):

    instructions                     a system turn, first (never carried over from a
                                     previous response, as OpenAI does)
    input: a string                  one user turn
    input: message items             chat messages (`input_text`/`output_text` parts as text)
    input: function_call items       `tool_calls` of the assistant turn just before them
    input: function_call_output      a `tool` message answering its `call_id`
    tools: function tools            chat function tools; hosted tools are refused
    text.format                      `response_format` (text, json_object, json_schema)

The answer is a `response` object: a `message` item holding the text as `output_text`,
then a `function_call` item per tool call. The four fields training reads
(`prompt_token_ids`, `token_ids`, `token_logprobs`, `policy_version`) sit on the response
object; in a stream, on the response inside its last event, `response.completed`.

Stored responses (`store`, true by default) are kept in memory, the last `STORED_RESPONSES`
used, for `previous_response_id` and GET; the server forgets them when it stops.
Parameters we cannot honour (reasoning, background, truncation, hosted tools, ...) are
refused naming them, unless they are unset or at OpenAI's default.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.background import BackgroundTask

from ..engines.base import Sample
from .jobs import ready_job, run_job
from .request import ApiError, ChatCompletionRequest, read_body, validation_error
from .response import Job, Route, assistant_message

if TYPE_CHECKING:
    from .server import Router

STORED_RESPONSES = 1000  # responses kept for `previous_response_id` and GET, least recent out

# OpenAI's limits on `metadata` (its API reference, "metadata").
_METADATA_KEYS, _METADATA_KEY_CHARS, _METADATA_VALUE_CHARS = 16, 64, 512


class ResponsesRequest(BaseModel):
    """A `POST /v1/responses` body: OpenAI's fields, the ones we cannot honour refused."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[Any] | None = None
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None  # end-user ids for the caller's own bookkeeping, echoed back
    safety_identifier: str | None = None
    text: dict[str, Any] | None = None
    # Refused unless unset or at their default (`_UNSUPPORTED` says why each is).
    reasoning: Any = None
    include: Any = None
    background: Any = None
    truncation: Any = None
    top_logprobs: Any = None
    max_tool_calls: Any = None
    service_tier: Any = None
    stream_options: Any = None
    prompt: Any = None
    conversation: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    context_management: Any = None
    moderation: Any = None
    image: Any = None
    access_programs: Any = None

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is not None and (
            len(metadata) > _METADATA_KEYS
            or any(len(key) > _METADATA_KEY_CHARS for key in metadata)
            or any(len(value) > _METADATA_VALUE_CHARS for value in metadata.values())
        ):
            raise ValueError(
                f"at most {_METADATA_KEYS} keys of at most {_METADATA_KEY_CHARS} characters, "
                f"values of at most {_METADATA_VALUE_CHARS}"
            )
        return metadata


def _unset_or(*defaults: object) -> Callable[[object], bool]:
    return lambda value: value is None or any(value == default for default in defaults)


def _no_reasoning(value: object) -> bool:
    return value is None or (isinstance(value, dict) and all(v is None for v in value.values()))


# Each parameter we cannot honour: the values that ask nothing of us, and why others are refused.
_UNSUPPORTED: dict[str, tuple[Callable[[object], bool], str]] = {
    "reasoning": (_no_reasoning, "these models do not reason apart from their answer"),
    "include": (_unset_or([]), "there is nothing extra to include; send [] or leave it out"),
    "background": (_unset_or(False), "responses run in the foreground only"),
    "truncation": (_unset_or("disabled"), "a prompt over the context is refused, not cut"),
    "top_logprobs": (_unset_or(0), "the sampled tokens' logprobs are in `token_logprobs`"),
    "max_tool_calls": (_unset_or(), "tool calls are not counted across a response"),
    "service_tier": (_unset_or("auto", "default"), "there is one service tier"),
    "stream_options": (
        _unset_or({}, {"include_obfuscation": False}),
        "stream events are not obfuscated; send include_obfuscation false",
    ),
    "prompt": (_unset_or(), "there are no stored prompt templates"),
    "conversation": (_unset_or(), "use previous_response_id to continue a conversation"),
    "prompt_cache_key": (_unset_or(), "prompt caching is not offered"),
    "prompt_cache_retention": (_unset_or(), "prompt caching is not offered"),
    "prompt_cache_options": (_unset_or(), "prompt caching is not offered"),
    "context_management": (_unset_or(), "the context is not compacted"),
    "moderation": (_unset_or(), "moderation is not offered"),
    "image": (_unset_or(), "these models do not make images"),
    "access_programs": (_unset_or(), "there are no access programs"),
}


def parse_responses_request(raw: bytes) -> ResponsesRequest:
    """The validated request in `raw` (a JSON body), or a 400 naming the bad value."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ApiError(
            400, f"body: the request body is not valid JSON ({error})", param="body"
        ) from error
    if not isinstance(data, dict):
        raise ApiError(400, "body: the request body must be a JSON object", param="body")
    try:
        body = ResponsesRequest.model_validate(data)
    except ValidationError as error:
        raise validation_error(error.errors()) from error
    for name, (accepted, why) in _UNSUPPORTED.items():
        if not accepted(getattr(body, name)):
            raise ApiError(
                400, f"{name}: not supported by this endpoint ({why}); leave it unset", param=name
            )
    return body


# --- the request as a chat ---------------------------------------------------------------


@dataclass(frozen=True)
class StoredResponse:
    """A response as answered, and the conversation it ends (input and output items,
    without `instructions`), which a request naming it as `previous_response_id` extends."""

    response: dict[str, Any]
    items: list[dict[str, Any]]


class ResponseStore:
    """The last `capacity` stored responses by id, least recently used out first."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            stored = self._responses.get(response_id)
            if stored is not None:
                self._responses.move_to_end(response_id)
            return stored

    def put(self, response_id: str, stored: StoredResponse) -> None:
        with self._lock:
            self._responses[response_id] = stored
            self._responses.move_to_end(response_id)
            while len(self._responses) > self.capacity:
                self._responses.popitem(last=False)


def chat_request(
    body: ResponsesRequest, previous: StoredResponse | None
) -> tuple[ChatCompletionRequest, list[dict[str, Any]]]:
    """`body` as a chat request, and the conversation items it sends (the previous
    response's, then its own input)."""
    earlier = previous.items if previous is not None else []
    given = [{"type": "message", "role": "user", "content": body.input}]
    items = given if isinstance(body.input, str) else list(body.input or [])
    messages = chat_messages([*earlier, *items], given_from=len(earlier))
    if body.instructions is not None:
        messages.insert(0, {"role": "system", "content": body.instructions})
    if not messages:
        raise ApiError(400, "input: give at least one input item", param="input")
    tools = [_chat_tool(tool, f"tools[{i}]") for i, tool in enumerate(body.tools or [])]
    if body.tool_choice not in (None, "auto", "none") and not tools:
        raise ApiError(
            400, "tool_choice: it asks for a tool call, but no tools are given", param="tool_choice"
        )
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_tokens": body.max_output_tokens,
        "tools": tools or None,
        "tool_choice": _chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "response_format": _response_format(body.text),
        "user": body.user,
    }
    if body.temperature is not None:
        fields["temperature"] = body.temperature
    if body.top_p is not None:
        fields["top_p"] = body.top_p
    try:
        chat = ChatCompletionRequest.model_validate(fields)
    except ValidationError as error:
        raise _in_responses_terms(validation_error(error.errors())) from error
    return chat, [*earlier, *items]


def chat_messages(items: list[Any], given_from: int = 0) -> list[dict[str, Any]]:
    """Responses input items as chat messages; a bad one is a 400 naming `input[i]`, counted
    from `given_from` (the items before it come from a stored response)."""
    messages: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    for index, item in enumerate(items):
        where = f"input[{index - given_from}]"
        if not isinstance(item, dict):
            raise ApiError(
                400,
                f'{where}: an input item is an object, such as {{"role": "user", "content": '
                '"..."}',
                param=where,
            )
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            call_ids.add(call["id"])
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the turn that made the call
                last["tool_calls"] = [*last.get("tool_calls", []), call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_call_output(item, where, call_ids))
        else:
            raise ApiError(
                400,
                f"{where}.type: {kind!r} items are not supported here; give 'message', "
                "'function_call' or 'function_call_output' items",
                param=f"{where}.type",
            )
    return messages


def _check_keys(item: dict[str, Any], where: str, allowed: set[str]) -> None:
    for key, value in item.items():
        if key not in allowed and value is not None:
            raise ApiError(
                400, f"{where}.{key}: not supported here; leave it out", param=f"{where}.{key}"
            )


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise ApiError(400, f"{where}.{key}: a string is required", param=f"{where}.{key}")
    return value


_MESSAGE_KEYS = {"type", "role", "content", "id", "status"}
_ROLES = ("user", "system", "developer", "assistant")


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    _check_keys(item, where, _MESSAGE_KEYS)
    role = item.get("role")
    if role not in _ROLES:
        raise ApiError(
            400, f"{where}.role: {role!r} is not one of {', '.join(_ROLES)}", param=f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise ApiError(
            400,
            f"{where}.content: a string or a list of input_text parts is required",
            param=f"{where}.content",
        )
    parts = [_text_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)]
    return {"role": role, "content": [{"type": "text", "text": text} for text in parts]}


# Replayed output text may carry the annotations and logprobs it was answered with: they
# describe the text, they are not input.
_TEXT_PART_KEYS = {
    "input_text": {"type", "text"},
    "output_text": {"type", "text", "annotations", "logprobs"},
}


def _text_part(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(part, dict) or kind not in _TEXT_PART_KEYS:
        raise ApiError(
            400,
            f"{where}.type: {kind!r} content is not supported here (the models read text); "
            "give input_text or output_text parts",
            param=f"{where}.type",
        )
    _check_keys(part, where, _TEXT_PART_KEYS[kind])
    return _string(part, "text", where)


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    _check_keys(item, where, {"type", "call_id", "name", "arguments", "id", "status", "caller"})
    caller = item.get("caller")
    if caller is not None and caller != {"type": "direct"}:
        raise ApiError(
            400, f"{where}.caller: only direct calls are supported", param=f"{where}.caller"
        )
    call_id, name = _string(item, "call_id", where), _string(item, "name", where)
    arguments = _string(item, "arguments", where)
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise ApiError(
            400,
            f"{where}.arguments: a JSON object in a string is required, such as '{{\"x\": 1}}'",
            param=f"{where}.arguments",
        )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _call_output(item: dict[str, Any], where: str, call_ids: set[str]) -> dict[str, Any]:
    _check_keys(item, where, {"type", "call_id", "output", "id", "status"})
    call_id = _string(item, "call_id", where)
    if call_id not in call_ids:
        raise ApiError(
            400,
            f"{where}.call_id: no function_call with call_id {call_id!r} comes before it",
            param=f"{where}.call_id",
        )
    output = item.get("output")
    if isinstance(output, list):
        output = "\n".join(
            _text_part(part, f"{where}.output[{i}]") for i, part in enumerate(output)
        )
    if not isinstance(output, str):
        raise ApiError(
            400,
            f"{where}.output: a string or a list of input_text parts is required",
            param=f"{where}.output",
        )
    return {"role": "tool", "tool_call_id": call_id, "content": output}


_TOOL_KEYS = ("name", "description", "parameters", "strict")


def _chat_tool(tool: Any, where: str) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or kind != "function":
        raise ApiError(
            400,
            f"{where}.type: {kind!r} tools are not available here; give function tools "
            '({"type": "function", "name": ..., "parameters": {...}})',
            param=f"{where}.type",
        )
    _check_keys(tool, where, {"type", *_TOOL_KEYS})
    _string(tool, "name", where)
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise ApiError(
            400,
            f"{where}.parameters: a JSON schema object is required",
            param=f"{where}.parameters",
        )
    function = {key: tool[key] for key in _TOOL_KEYS if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise ApiError(
            400,
            'tool_choice: "auto", "none", "required" or {"type": "function", "name": ...}; '
            f"{choice.get('type')!r} tool choices are not supported here",
            param="tool_choice",
        )
    _check_keys(choice, "tool_choice", {"type", "name"})
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text` (its `format`) as a chat `response_format`."""
    if text is None:
        return None
    _check_keys(text, "text", {"format"})
    form = text.get("format")
    kind = form.get("type") if isinstance(form, dict) else None
    if form is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema" or not isinstance(form, dict):
        raise ApiError(
            400,
            f"text.format.type: {kind!r} is not one of 'text', 'json_object', 'json_schema'",
            param="text.format.type",
        )
    _check_keys(form, "text.format", {"type", "name", "schema", "strict", "description"})
    if not isinstance(form.get("schema"), dict):
        raise ApiError(
            400, "text.format.schema: a JSON schema object is required", param="text.format.schema"
        )
    # OpenAI's Responses API follows a json_schema format loosely unless `strict` is true.
    spec = {
        "name": form.get("name"),
        "schema": form["schema"],
        "strict": form.get("strict") is True,
    }
    if form.get("description") is not None:
        spec["description"] = form["description"]
    return {"type": "json_schema", "json_schema": spec}


# Chat's parameter names, as the Responses request calls them.
_RESPONSES_NAMES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def _in_responses_terms(error: ApiError) -> ApiError:
    """A chat request's error, naming the Responses parameter the caller sent."""
    param = error.param
    if param is None:
        return error
    new = param.replace(".function.", ".", 1) if param.startswith("tools[") else param
    for chat_name, name in _RESPONSES_NAMES.items():
        if param == chat_name or param.startswith((f"{chat_name}.", f"{chat_name}[")):
            new = name + param[len(chat_name) :]
    if new == param:
        return error
    message = error.message  # a chat error starts with the path of the bad value
    if message.startswith(param):
        message = new + message[len(param) :]
    return ApiError(error.status, message, param=new, code=error.code)


async def _ready(chat: ChatCompletionRequest, route: Route) -> Job:
    try:
        return await ready_job(chat, route)
    except ApiError as error:
        raise _in_responses_terms(error) from error


# --- the answer ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Answer:
    """What a response says about its request, whatever its output."""

    id: str
    created_at: int
    body: ResponsesRequest
    route: Route
    job: Job
    chat: ChatCompletionRequest

    def envelope(self, status: str) -> dict[str, Any]:
        """The response object with no output yet."""
        body = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "completed_at": None,
            "error": None,
            "incomplete_details": None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "model": body.model,
            "output": [],
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "safety_identifier": body.safety_identifier,
            "service_tier": "default",
            "store": body.store is not False,
            "temperature": self.chat.temperature,
            "text": _text_config(body.text),
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": [_tool_echo(tool) for tool in body.tools or []],
            "top_logprobs": 0,
            "top_p": self.chat.top_p,
            "truncation": "disabled",
            "usage": None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def finished(
        self, sample: Sample, output: list[dict[str, Any]], length: bool
    ) -> dict[str, Any]:
        """The response with its output, usage and the token ids training reads."""
        prompt, sampled = len(self.job.prompt_ids), len(sample.token_ids)
        return {
            **self.envelope("incomplete" if length else "completed"),
            "completed_at": int(time.time()),
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "output": output,
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": sampled,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + sampled,
            },
            "prompt_token_ids": self.job.prompt_ids,
            "token_ids": sample.token_ids,
            "token_logprobs": sample.logprobs,
            # The checkpoint step that sampled it (ART's `policy_version`); None: the base.
            "policy_version": self.route.step,
        }

    def output(self, sample: Sample) -> tuple[list[dict[str, Any]], Sample, bool]:
        """The output items of `sample`, the sample they hold, and whether it ran out of room."""
        message, finish_reason, sample = assistant_message(
            self.chat, self.job, sample, self.route.tokenizer
        )
        length = finish_reason == "length"
        calls = message.get("tool_calls") or []
        items: list[dict[str, Any]] = []
        if message.get("content") or not calls:
            items.append(_message_item(_item_id("msg"), message.get("content") or "", length))
        items.extend(_call_item(call) for call in calls)
        return items, sample, length


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part_out(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str | None, length: bool = False) -> dict[str, Any]:
    """A message item: in progress (no text yet) when `text` is None."""
    status = "in_progress" if text is None else "incomplete" if length else "completed"
    content = [] if text is None else [_text_part_out(text)]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": _item_id("fc"),
        "type": "function_call",
        "status": "completed",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
    }


def _text_config(text: dict[str, Any] | None) -> dict[str, Any]:
    form = (text or {}).get("format") or {"type": "text"}
    return {"format": form}


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "strict": None, **tool}


# --- streaming -------------------------------------------------------------------------------


async def _stream(
    answer: _Answer, store: ResponseStore, items: list[dict[str, Any]], release: Callable[[], None]
) -> AsyncIterator[str]:
    """OpenAI's event sequence: the response created, its output items as they are
    written, then `response.completed` holding the whole response and its token ids.

    A message is streamed token by token when no tools are offered; with tools it is sent
    whole at the end, once it is known whether it is text or calls. The last event is
    `response.completed` even when the output ran out of room (status "incomplete"), where
    OpenAI sends `response.incomplete`: the SDK's `get_final_response()` and ART's capture
    read only `response.completed`.
    """
    sequence = itertools.count()
    route, job = answer.route, answer.job

    def event(kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n"

    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue[int] = asyncio.Queue()
    incremental = not job.parse_tools and not job.prefill and not job.params.stop

    def on_token(index: int, token_id: int) -> None:
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
        yield event("response.created", response=answer.envelope("in_progress"))
        yield event("response.in_progress", response=answer.envelope("in_progress"))
        message_id, sent = _item_id("msg"), ""
        ids: list[int] = []
        if incremental:
            for line in _message_opened(event, message_id, 0):
                yield line
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
                yield _text_delta(event, message_id, 0, text[len(sent) :])
                sent = text
        try:
            (sample,) = await generation
        except Exception as error:  # headers are sent: the failure goes in the stream
            failure = {"code": "server_error", "message": f"generation failed: {error}"}
            yield event("error", code="server_error", message=failure["message"], param=None)
            yield event("response.failed", response={**answer.envelope("failed"), "error": failure})
            return
        output, sample, length = answer.output(sample)
        for index, item in enumerate(output):
            if item["type"] == "message":
                if incremental:
                    item = {**item, "id": message_id}
                    output[index] = item
                else:
                    for line in _message_opened(event, item["id"], index):
                        yield line
                for line in _message_closed(event, item, index, sent):
                    yield line
            else:
                for line in _call_events(event, item, index):
                    yield line
        final = answer.finished(sample, output, length)
        if answer.body.store is not False:
            store.put(answer.id, StoredResponse(final, [*items, *output]))
        yield event("response.completed", response=final)
    finally:  # the client may have gone: stop decoding for it
        generation.cancel()
        if getter is not None:
            getter.cancel()
        release()


Event = Callable[..., str]


def _message_opened(event: Event, item_id: str, index: int) -> list[str]:
    part = _text_part_out("")
    return [
        event("response.output_item.added", output_index=index, item=_message_item(item_id, None)),
        event(
            "response.content_part.added",
            item_id=item_id,
            output_index=index,
            content_index=0,
            part=part,
        ),
    ]


def _text_delta(event: Event, item_id: str, index: int, delta: str) -> str:
    return event(
        "response.output_text.delta",
        item_id=item_id,
        output_index=index,
        content_index=0,
        delta=delta,
        logprobs=[],
    )


def _message_closed(event: Event, item: dict[str, Any], index: int, sent: str) -> list[str]:
    """The rest of a message's text (after the `sent` part), then its done events."""
    part = item["content"][0]
    text, item_id = part["text"], item["id"]
    rest = text[len(sent) :] if text.startswith(sent) else text
    where = {"item_id": item_id, "output_index": index, "content_index": 0}
    lines = [_text_delta(event, item_id, index, rest)] if rest else []
    return [
        *lines,
        event("response.output_text.done", **where, text=text, logprobs=[]),
        event("response.content_part.done", **where, part=part),
        event("response.output_item.done", output_index=index, item=item),
    ]


def _call_events(event: Event, item: dict[str, Any], index: int) -> list[str]:
    opened = {**item, "status": "in_progress", "arguments": ""}
    where = {"item_id": item["id"], "output_index": index}
    return [
        event("response.output_item.added", output_index=index, item=opened),
        event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
        event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
        event("response.output_item.done", output_index=index, item=item),
    ]


# --- the routes ------------------------------------------------------------------------------


def _once(release: Callable[[], None]) -> Callable[[], None]:
    """`release`, called once however many ways the request ends."""
    done = threading.Event()

    def once() -> None:
        if not done.is_set():
            done.set()
            release()

    return once


def add_responses_route(app: FastAPI, router: Router, max_body_bytes: Callable[[], int]) -> None:
    """Serve `POST /v1/responses` and `GET /v1/responses/{response_id}` on `app`."""
    store = ResponseStore()

    @app.post("/v1/responses", response_model=None)
    async def create_response(request: Request) -> JSONResponse | StreamingResponse:
        raw = await read_body(request, max_body_bytes())
        body = await asyncio.to_thread(parse_responses_request, raw)
        del raw
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
        try:
            route = await asyncio.to_thread(router.route, body.model)
        except KeyError as error:
            raise ApiError(
                404, str(error.args[0]), param="model", code="model_not_found"
            ) from error
        release = _once(route.release)
        streaming = False
        try:
            job = await _ready(chat, route)
            answer = _Answer(_item_id("resp"), int(time.time()), body, route, job, chat)
            if body.stream:
                # Starlette cancels the stream when the client disconnects; the stream then
                # cancels its generation and releases the route, and so does the background
                # task if the stream never started.
                streaming = True
                return StreamingResponse(
                    _stream(answer, store, items, release),
                    media_type="text/event-stream",
                    background=BackgroundTask(release),
                )
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
