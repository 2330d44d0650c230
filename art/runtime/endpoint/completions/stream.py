"""A streamed `/v1/completions` answer: server-sent `text_completion` chunks, then `[DONE]`."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ...engines.base import Sample
from ..response import Route
from ..streaming import TextFeed, failed_chunk
from .answer import choice, usage
from .request import CompletionRequest, Prompt


async def stream(
    body: CompletionRequest, route: Route, prompts: list[Prompt], release: Callable[[], None]
) -> AsyncIterator[str]:
    """Server-sent `text_completion` chunks: text as tokens are sampled, then each choice's
    last chunk with its finish reason and token ids, then `[DONE]`.

    With logprobs the text is sent whole in the last chunk, with the logprobs that go with
    it; with stop strings, as it is sampled but for a tail that could begin one
    (`TextFeed`).
    """
    incremental = body.logprobs is None
    completion_id, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    with_usage = body.stream_options is not None and body.stream_options.include_usage
    n, total = body.n, len(prompts) * body.n

    def chunk(choices: list[dict[str, Any]], counts: dict[str, int] | None = None) -> str:
        data: dict[str, Any] = {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": body.model,
            "choices": choices,
        }
        if with_usage:
            data["usage"] = counts  # null but in the last chunk, as OpenAI sends it
        return f"data: {json.dumps(data)}\n\n"

    feed = TextFeed(route.tokenizer, total, prompts[0].job.params.stop if prompts else ())
    tasks = [
        feed.generate(route, prompt.job, n, first_row=p * n, fed=incremental)
        for p, prompt in enumerate(prompts)
    ]
    generation = asyncio.gather(*tasks)
    # A client that hangs up leaves `generation` unawaited, failed with the cancellation
    # of its tasks: retrieving that here keeps asyncio from logging it as unhandled.
    generation.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        if body.echo:
            for index in range(total):
                text = prompts[index // n].text
                yield chunk(
                    [{"text": text, "index": index, "logprobs": None, "finish_reason": None}]
                )
        if incremental:
            async for index, delta in feed.deltas(generation):
                yield chunk(
                    [{"text": delta, "index": index, "logprobs": None, "finish_reason": None}]
                )
        try:
            samples = await generation
        except Exception as error:
            yield failed_chunk(completion_id, error)
            return
        finals = await asyncio.to_thread(_finals, body, route, prompts, samples, feed.sent)
        for final in finals:
            yield chunk([final])
        if with_usage:
            yield chunk([], usage(prompts, samples))
        yield "data: [DONE]\n\n"
    finally:  # the client may have gone: stop decoding for it
        for task in tasks:
            task.cancel()
        release()


def _finals(
    body: CompletionRequest,
    route: Route,
    prompts: list[Prompt],
    samples: list[list[Sample]],
    sent: list[str],
) -> list[dict[str, Any]]:
    """The last chunk of each streamed choice: the text not sent yet, and the ids."""
    finals = []
    for p, row in enumerate(samples):
        for j, sample in enumerate(row):
            index = p * body.n + j
            final = choice(body, route, index, prompts[p], sample)
            final["text"] = sample.text[len(sent[index]) :]
            finals.append(final)
    return finals


__all__ = ["stream"]
