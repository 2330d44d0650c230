"""Chat message helpers ART keeps in `art.utils.append_only`: merging streamed deltas,
reading a request's history-preserving options, and tool-call arguments as JSON text.

`merge_chat_delta` is the one place a streamed chat message is put together: the capture
pipeline's re-assembly of a recorded stream (`exchange_capture.assemble_chat_stream`),
the SDK stream helpers of `art.openai` and the Langfuse trace all merge through it, and
`finished_chat_message` completes what it merged as OpenAI's message type requires.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_REPLACED_TEXT = {"role", "type", "id"}  # streamed once, never concatenated


def merge_chat_delta(message: dict[str, Any], delta: Mapping[str, Any]) -> None:
    """Fold one streamed `delta` into `message` in place: text fields concatenate
    (`role`, `type`, `id` are replaced), nested objects merge, and `tool_calls` parts
    merge into the call at their `index`."""
    for name, value in delta.items():
        if name == "tool_calls" and isinstance(value, list):
            calls: list[dict[str, Any]] = message.setdefault("tool_calls", [])
            for part in value:
                position = part["index"]
                calls.extend({} for _ in range(position + 1 - len(calls)))
                merge_chat_delta(calls[position], {k: v for k, v in part.items() if k != "index"})
        elif isinstance(value, Mapping):
            merge_chat_delta(message.setdefault(name, {}), value)
        elif isinstance(value, str):
            message[name] = value if name in _REPLACED_TEXT else message.get(name, "") + value


def finished_chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message merged from deltas (`merge_chat_delta`) as OpenAI's `ChatCompletionMessage`
    takes it: `content` present, each tool call of type "function" with a name and JSON
    text arguments; a call no piece named (a gap in the indexes) is dropped."""
    done = {"content": None, **message}
    if isinstance(message.get("tool_calls"), list):
        done["tool_calls"] = [
            {
                **call,
                "type": call.get("type") or "function",
                "function": {"name": "", "arguments": ""}
                | dict(_with_text_arguments(call.get("function") or {})),
            }
            for call in message["tool_calls"]
            if call
        ]
    return done


def preserves_history(kwargs: Mapping[str, Any] | None) -> bool:
    """False where chat template options ask to drop earlier reasoning
    (`preserve_thinking=False`, `clear_thinking=True` or `drop_thinking=True`)."""
    options = kwargs or {}
    return not (
        options.get("preserve_thinking") is False
        or options.get("clear_thinking") is True
        or options.get("drop_thinking") is True
    )


def has_renderable_tool_arguments(message: Mapping[str, Any]) -> bool:
    """Whether every tool call's (and `function_call`'s) string arguments are a JSON
    object (empty text counts as `{}`); arguments given as a mapping always are."""
    functions = [call.get("function", {}) for call in message.get("tool_calls") or []]
    if message.get("function_call"):
        functions.append(message["function_call"])
    for function in functions:
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            continue
        try:
            if not isinstance(json.loads(arguments or "{}"), dict):
                return False
        except json.JSONDecodeError:
            return False
    return True


def _with_text_arguments(function: Mapping[str, Any]) -> Mapping[str, Any]:
    arguments = function.get("arguments")
    if isinstance(arguments, Mapping):
        return {**function, "arguments": json.dumps(arguments)}
    return function


def openai_tool_arguments(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """`message` with tool-call (and `function_call`) arguments given as mappings turned
    into JSON text, as OpenAI's API carries them; anything else is kept as it is."""
    result = dict(message)
    function_call = message.get("function_call")
    if isinstance(function_call, Mapping):
        result["function_call"] = _with_text_arguments(function_call)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        result["tool_calls"] = [
            {**call, "function": _with_text_arguments(call["function"])}
            if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping)
            else call
            for call in calls
        ]
    return result


__all__ = [
    "finished_chat_message",
    "has_renderable_tool_arguments",
    "merge_chat_delta",
    "openai_tool_arguments",
    "preserves_history",
]
