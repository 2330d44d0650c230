"""A whole `response` object: a `message` item holding the text as `output_text`, then a
`function_call` item per tool call, and the four fields training reads
(`prompt_token_ids`, `token_ids`, `token_logprobs`, `policy_version`) on the response."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from ...engines.base import Sample
from ..request import ChatCompletionRequest
from ..response import Job, Route, assistant_message
from .request import ResponsesRequest


@dataclass(frozen=True)
class Answer:
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
            items.append(message_item(new_id("msg"), message.get("content") or "", length))
        items.extend(_call_item(call) for call in calls)
        return items, sample, length


def new_id(prefix: str) -> str:
    """A fresh id for a response (`resp`) or an output item (`msg`, `fc`)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def output_text_part(text: str) -> dict[str, Any]:
    """A message item's `output_text` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, length: bool = False) -> dict[str, Any]:
    """A message item: in progress (no text yet) when `text` is None."""
    status = "in_progress" if text is None else "incomplete" if length else "completed"
    content = [] if text is None else [output_text_part(text)]
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _call_item(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": new_id("fc"),
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


__all__ = ["Answer", "message_item", "new_id", "output_text_part"]
