"""A whole Messages answer: one message of `text` and `tool_use` blocks with Anthropic's
`stop_reason` and `usage`, and beside them our four token fields (`prompt_token_ids`,
`token_ids`, `token_logprobs`, `policy_version`) at the top level of the message."""

from __future__ import annotations

import json
import uuid
from typing import Any

from ...engines.base import Sample
from ..request import ChatCompletionRequest
from ..response import Job, Route, assistant_message
from .request import MessagesRequest


def answer(
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
    reply = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": body.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": len(job.prompt_ids), "output_tokens": len(sample.token_ids)},
        **token_fields(route, job, sample),
    }
    return reply, sample


def token_fields(route: Route, job: Job, sample: Sample) -> dict[str, Any]:
    """The four fields training reads: the prompt and sampled ids, their logprobs, the step."""
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


__all__ = ["answer", "token_fields"]
