"""A streamed Messages answer: Anthropic's server-sent events, from `message_start` to
`message_stop`, our four token fields at the top level of the `message_delta` event."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..request import ChatCompletionRequest
from ..response import Job, Route
from ..streaming import TextFeed, named_event
from .answer import answer, token_fields
from .request import MessagesRequest


async def stream(
    body: MessagesRequest,
    chat: ChatCompletionRequest,
    route: Route,
    job: Job,
    release: Callable[[], None],
) -> AsyncIterator[str]:
    """Anthropic's server-sent events: text as it is sampled, then the finished blocks.

    Text with tools or a forced call is sent whole at the end, once it is known whether it
    holds a tool call; with stop sequences, as it is sampled but for a tail that could
    begin one (`TextFeed`).
    """
    incremental = not job.parse_tools and not job.prefill
    feed = TextFeed(route.tokenizer, 1, job.params.stop)
    generation = feed.generate(route, job, fed=incremental)
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
        yield named_event("message_start", {"type": "message_start", "message": start})
        yield named_event("ping", {"type": "ping"})
        if incremental:
            opened = False
            async for _, delta in feed.deltas(generation):
                if not opened:
                    yield _block_start(0, {"type": "text", "text": ""})
                    opened = True
                yield _delta(0, {"type": "text_delta", "text": delta})
        try:
            (sample,) = await generation
        except Exception as error:  # headers are sent: the failure goes in the stream
            failure = {"type": "api_error", "message": f"generation failed: {error}"}
            yield named_event("error", {"type": "error", "error": failure})
            return
        reply, sample = answer(body, chat, route, job, sample)
        sent = feed.sent[0]
        if sent and not reply["content"]:  # streamed text the answer does not hold
            yield _block_stop(0)
        for index, block in enumerate(reply["content"]):
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
            yield _block_stop(index)
        final = {
            "type": "message_delta",
            "delta": {
                "stop_reason": reply["stop_reason"],
                "stop_sequence": reply["stop_sequence"],
            },
            "usage": {"output_tokens": reply["usage"]["output_tokens"]},
            **token_fields(route, job, sample),
        }
        yield named_event("message_delta", final)
        yield named_event("message_stop", {"type": "message_stop"})
    finally:  # the client may have gone: stop decoding for it
        generation.cancel()
        release()


def _block_start(index: int, block: dict[str, Any]) -> str:
    data = {"type": "content_block_start", "index": index, "content_block": block}
    return named_event("content_block_start", data)


def _delta(index: int, delta: dict[str, Any]) -> str:
    return named_event(
        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
    )


def _block_stop(index: int) -> str:
    return named_event("content_block_stop", {"type": "content_block_stop", "index": index})


__all__ = ["stream"]
