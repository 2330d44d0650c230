"""What the Completions, Responses and Messages streams share: the sampled text as it
grows, and the server-sent-events response that carries a stream.

An engine reports each sampled token from its own thread (`on_token`); `TextFeed` carries
them to the event loop and reads each token's text once (`TokenText`), so a stream sends
text as it is sampled, never half a character.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from ..engines.base import Sample
from ..engines.token_text import StopWatch, TokenText
from .response import Job, Route

logger = logging.getLogger("art.endpoint")


def event_stream(events: AsyncIterator[str], release: Callable[[], None]) -> StreamingResponse:
    """`events` as a `text/event-stream` response.

    Starlette cancels the stream when the client disconnects; the stream then cancels its
    generation and calls `release`, and so does the background task if the stream never
    started: `release` must run once only (`jobs.once`).
    """
    return StreamingResponse(
        events, media_type="text/event-stream", background=BackgroundTask(release)
    )


def failed_chunk(stream_id: str, error: Exception) -> str:
    """The data line that ends an OpenAI-shaped stream whose generation failed (its
    headers are sent, so the failure goes in the stream), logged."""
    logger.warning("stream %s failed: %s: %s", stream_id, type(error).__name__, error)
    failure = {"message": f"generation failed: {error}", "type": "server_error"}
    return f"data: {json.dumps({'error': failure})}\n\n"


def named_event(name: str, data: dict[str, Any]) -> str:
    """A server-sent event with an `event:` name, as the Responses and Messages APIs send."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


class TextFeed:
    """The text of `rows` sampled sequences as it grows, read on the event loop.

    `sent[row]` is the text of `row` already handed out by `deltas`. With `stop` strings,
    the tail that could begin one is held back and nothing from a stop string on is handed
    out (`StopWatch`), so `sent` is always a prefix of the answer (the text cut before its
    first stop string).
    """

    def __init__(self, tokenizer: Any, rows: int, stop: tuple[str, ...] = ()) -> None:
        self._loop = asyncio.get_running_loop()
        self._tokens: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
        self._texts = [TokenText(tokenizer) for _ in range(rows)]
        self._watches = [StopWatch(stop) for _ in range(rows)] if stop else None
        self.sent = [""] * rows

    def generate(
        self, route: Route, job: Job, n: int = 1, *, first_row: int = 0, fed: bool = True
    ) -> asyncio.Future[list[Sample]]:
        """`n` samples of `job` on `route`'s engine, started now; with `fed`, their tokens
        come here as rows `first_row` to `first_row + n - 1`."""

        def on_token(row: int, token_id: int) -> None:
            self._loop.call_soon_threadsafe(self._tokens.put_nowait, (first_row + row, token_id))

        return asyncio.ensure_future(
            route.engine.generate(
                job.prompt_ids,
                job.params,
                n=n,
                adapter=route.adapter,
                on_token=on_token if fed else None,
            )
        )

    async def deltas(self, generation: asyncio.Future[Any]) -> AsyncIterator[tuple[int, str]]:
        """Each row's new text, `(row, text)`, as it is sampled, until `generation` is done
        and every token it fed is read."""
        getter: asyncio.Future[tuple[int, int]] | None = None
        try:
            while not (generation.done() and self._tokens.empty()):
                getter = asyncio.ensure_future(self._tokens.get())
                await asyncio.wait({getter, generation}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                row, token_id = getter.result()
                delta = self._releasable(row, self._texts[row].add(token_id))
                if delta:
                    self.sent[row] += delta
                    yield row, delta
        finally:  # the client may have gone
            if getter is not None:
                getter.cancel()

    def _releasable(self, row: int, new: str) -> str:
        """The text `row` may hand out now that `new` arrived (see the class)."""
        return new if self._watches is None else self._watches[row].feed(new)


__all__ = ["TextFeed", "event_stream", "failed_chunk", "named_event"]
