"""A Responses request read as a chat request, and a chat error named back in its terms.

instructions                     a system turn, first (never carried over from a
                                 previous response, as OpenAI does)
input: a string                  one user turn
input: message items             chat messages (`input_text`/`output_text` parts as text)
input: function_call items       `tool_calls` of the assistant turn just before them
input: function_call_output      a `tool` message answering its `call_id`
tools: function tools            chat function tools; hosted tools are refused
text.format                      `response_format` (text, json_object, json_schema)
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from ..jobs import ready_job
from ..request import ApiError, ChatCompletionRequest, validation_error
from ..response import Job, Route
from .request import ResponsesRequest
from .store import StoredResponse


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


async def ready(chat: ChatCompletionRequest, route: Route) -> Job:
    """`jobs.ready_job`, its errors naming the Responses parameters."""
    try:
        return await ready_job(chat, route)
    except ApiError as error:
        raise _in_responses_terms(error) from error


__all__ = ["chat_messages", "chat_request", "ready"]
