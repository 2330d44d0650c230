"""A streamed `/v1/chat/completions` answer: `chat.completion.chunk`s, then `[DONE]`."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from .request import ChatCompletionRequest
from .response import Job, Route, assistant_message, choice, usage
from .streaming import TextFeed, failed_chunk


async def stream(body: ChatCompletionRequest, route: Route, job: Job) -> AsyncIterator[str]:
    """Server-sent events: text deltas as tokens are sampled, then the finished choices.

    Text with tools is sent whole at the end, once it is known whether it holds a tool
    call; with stop strings, as it is sampled but for a tail that could begin one
    (`TextFeed`).
    """
    incremental = not job.parse_tools and not job.prefill
    completion_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chunk(choices: list[dict[str, Any]], counts: dict[str, int] | None = None) -> str:
        data: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": body.model,
            "choices": choices,
        }
        if counts is not None:
            data["usage"] = counts
        return f"data: {json.dumps(data)}\n\n"

    feed = TextFeed(route.tokenizer, body.n, job.params.stop)
    generation = feed.generate(route, job, body.n, fed=incremental)
    try:
        for index in range(body.n):
            opening = {"role": "assistant", "content": ""}
            yield chunk([{"index": index, "delta": opening, "finish_reason": None}])
        if incremental:
            async for index, delta in feed.deltas(generation):
                yield chunk([{"index": index, "delta": {"content": delta}, "finish_reason": None}])
        try:
            samples = await generation
        except Exception as error:  # headers are sent: the failure goes in the stream
            yield failed_chunk(completion_id, error)
            return
        for index, sample in enumerate(samples):
            message, finish_reason, sample = assistant_message(body, job, sample, route.tokenizer)
            final_delta: dict[str, Any] = {}
            unsent = (message.get("content") or "")[len(feed.sent[index]) :]
            if unsent:
                final_delta["content"] = unsent
            if message.get("tool_calls"):
                final_delta["tool_calls"] = [
                    {"index": i, **call} for i, call in enumerate(message["tool_calls"])
                ]
            final = choice(body, route, job, index, sample)
            final.pop("message")
            yield chunk([{**final, "delta": final_delta, "finish_reason": finish_reason}])
        if body.stream_options and body.stream_options.get("include_usage"):
            yield chunk([], usage(job, samples))
        yield "data: [DONE]\n\n"
    finally:  # the client may have gone: stop decoding for it
        generation.cancel()
        route.release()


__all__ = ["stream"]
