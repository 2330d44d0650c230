"""A streamed `response`: OpenAI's event sequence, from `response.created` to
`response.completed`, which holds the whole response and its token ids."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..streaming import TextFeed, named_event
from .answer import Answer, message_item, new_id, output_text_part
from .store import ResponseStore, StoredResponse


async def stream(
    answer: Answer, store: ResponseStore, items: list[dict[str, Any]], release: Callable[[], None]
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
        return named_event(kind, {"type": kind, "sequence_number": next(sequence), **fields})

    incremental = not job.parse_tools and not job.prefill
    feed = TextFeed(route.tokenizer, 1, job.params.stop)
    generation = feed.generate(route, job, fed=incremental)
    try:
        yield event("response.created", response=answer.envelope("in_progress"))
        yield event("response.in_progress", response=answer.envelope("in_progress"))
        message_id = new_id("msg")
        if incremental:
            for line in _message_opened(event, message_id, 0):
                yield line
            async for _, delta in feed.deltas(generation):
                yield _text_delta(event, message_id, 0, delta)
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
                for line in _message_closed(event, item, index, feed.sent[0]):
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
        release()


Event = Callable[..., str]


def _message_opened(event: Event, item_id: str, index: int) -> list[str]:
    part = output_text_part("")
    return [
        event("response.output_item.added", output_index=index, item=message_item(item_id, None)),
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


__all__ = ["stream"]
