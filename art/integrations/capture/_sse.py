"""A streamed chat completion (server-sent events) put back together as one `Choice`."""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat.chat_completion import Choice

# Fields of a streamed choice that are not deltas of the message; any others (our
# endpoint's token ids and logprobs) are extras kept on the Choice.
_STANDARD = {"index", "delta", "finish_reason", "logprobs"}


def choices_from_sse(body: bytes) -> list[Choice]:
    """Every choice of a streamed completion (`n > 1` streams them interleaved), by index."""
    indices = sorted(
        {part.get("index", 0) for chunk in _events(body) for part in chunk.get("choices") or []}
    )
    if not indices:
        raise ValueError("the stream held no choice")
    return [choice_from_sse(body, index) for index in indices]


def choice_from_sse(body: bytes, index: int = 0) -> Choice:
    """Choice `index` of a streamed completion, with the extra fields its chunks carried.

    Text is concatenated, tool calls are merged by their index (name and arguments arrive
    in pieces), logprobs are concatenated; of the extras, `prompt_token_ids` is taken
    once and other lists are concatenated, since an endpoint may send token ids per chunk.
    Raises ValueError when no chunk holds the choice or the stream never finished it.
    """
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    logprobs: list[dict[str, Any]] | None = None
    extras: dict[str, Any] = {}
    finish_reason: str | None = None
    seen = False
    for chunk in _events(body):
        for part in chunk.get("choices") or []:
            if part.get("index", 0) != index:
                continue  # another of n > 1 choices
            seen = True
            delta = part.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or []:
                merge_call(calls.setdefault(call.get("index", len(calls)), {}), call)
            if part.get("logprobs") and part["logprobs"].get("content") is not None:
                logprobs = (logprobs or []) + list(part["logprobs"]["content"])
            finish_reason = part.get("finish_reason") or finish_reason
            for key, value in part.items():
                if key in _STANDARD:
                    continue
                if isinstance(value, list) and isinstance(extras.get(key), list):
                    if key != "prompt_token_ids":
                        extras[key] = extras[key] + value
                else:
                    extras[key] = value
    if not seen:
        raise ValueError("the stream held no choice")
    if finish_reason is None:
        raise ValueError("the stream ended before its choice finished")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return Choice.model_validate(
        {
            **extras,
            "index": index,
            "message": message,
            "finish_reason": finish_reason,
            "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
        }
    )


def _events(body: bytes) -> list[dict[str, Any]]:
    events = []
    for line in body.decode("utf-8").splitlines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data and data != "[DONE]":
            events.append(json.loads(data))
    return events


def merge_call(into: dict[str, Any], delta: dict[str, Any]) -> None:
    """Add one streamed piece of a tool call (id, name and argument text) to `into`."""
    if delta.get("id"):
        into["id"] = delta["id"]
    into["type"] = delta.get("type") or into.get("type") or "function"
    function = into.setdefault("function", {"name": "", "arguments": ""})
    piece = delta.get("function") or {}
    function["name"] += piece.get("name") or ""
    arguments = piece.get("arguments") or ""
    function["arguments"] += arguments if isinstance(arguments, str) else json.dumps(arguments)
