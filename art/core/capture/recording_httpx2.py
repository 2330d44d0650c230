"""The recording transports for httpx2, the fork of httpx that OpenAI's SDK 3 and
Anthropic's SDK 2 are built on.

Anthropic's SDK takes only an httpx2 client, and an httpx2 client only an httpx2
transport, so the transports of `recording` are given again on httpx2's base classes.
What they record, and how, is `recording`'s (`record`, `TappedStream`): httpx2 keeps httpx's
request, response and stream API, which those read.
"""

from __future__ import annotations

import httpx2

from .recording import AsyncTappedStream, ModelFilter, TappedStream, arecord, record


class _Stream(TappedStream, httpx2.SyncByteStream):
    """httpx2's."""


class _AsyncStream(AsyncTappedStream, httpx2.AsyncByteStream):
    """httpx2's."""


class Httpx2RecordingTransport(httpx2.BaseTransport):
    """`recording.RecordingTransport` for httpx2 clients (the sync `Anthropic`)."""

    def __init__(
        self, inner: httpx2.BaseTransport | None = None, *, accepts: ModelFilter | None = None
    ) -> None:
        self._inner = inner or httpx2.HTTPTransport()
        self._accepts = accepts

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        return record(request, self._accepts, self._inner.handle_request, _Stream)

    def close(self) -> None:
        self._inner.close()


class Httpx2RecordingAsyncTransport(httpx2.AsyncBaseTransport):
    """`recording.RecordingAsyncTransport` for httpx2 clients (`AsyncAnthropic`)."""

    def __init__(
        self,
        inner: httpx2.AsyncBaseTransport | None = None,
        *,
        accepts: ModelFilter | None = None,
    ) -> None:
        self._inner = inner or httpx2.AsyncHTTPTransport()
        self._accepts = accepts

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return await arecord(request, self._accepts, self._inner.handle_async_request, _AsyncStream)

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = ["Httpx2RecordingAsyncTransport", "Httpx2RecordingTransport"]
