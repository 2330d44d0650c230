"""Capture through aiohttp's own extension point, its `TraceConfig`.

    async with aiohttp.ClientSession(trace_configs=[art.capture_trace_config()]) as session:
        with art.Trajectory() as t:
            async with session.post(f"{base_url}/chat/completions", json=body) as answer:
                ...  # read it as usual; t.exchanges.chat_completions gets the call

The trace's signals say when a request starts, each piece of its body as it is sent, and
when the response's headers arrive. aiohttp signals response body pieces only for
`read()`, so at that last signal the response's `content` reader (an object of this one
response) is wrapped to see every read: the body is complete when the reader reaches its
end (or, with identity encoding, its Content-Length), or, for a stream, when its
terminal event arrives. Nothing of aiohttp is replaced; sessions without the trace
config are never touched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast, overload

import aiohttp

from ...core.capture import exchange_capture
from ...core.capture.exchange_capture import ExchangeCapture
from ...core.data.exchanges import utc_now


class _Pending:
    """A request that may be recorded: where, and its body as sent so far."""

    def __init__(self, found: tuple[Any, exchange_capture.ExchangeProtocol], path: str) -> None:
        self.trajectory, self.protocol = found
        self.path = path
        self.start_time = utc_now()
        self.body = bytearray()


_SLOT = "art_exchange"  # our attribute on aiohttp's per-request trace context


async def _on_request_start(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestStartParams,
) -> None:
    found = exchange_capture.target(params.method, str(params.url))
    setattr(context, _SLOT, None if found is None else _Pending(found, params.url.path))


async def _on_request_chunk_sent(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    pending = getattr(context, _SLOT, None)
    if isinstance(pending, _Pending):
        pending.body.extend(bytes(params.chunk))


async def _on_request_redirect(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestRedirectParams,
) -> None:
    pending = getattr(context, _SLOT, None)
    if isinstance(pending, _Pending):
        pending.body.clear()  # a redirected POST sends its body again


async def _on_request_end(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestEndParams,
) -> None:
    pending = getattr(context, _SLOT, None)
    setattr(context, _SLOT, None)
    if not isinstance(pending, _Pending):
        return
    request = exchange_capture.request_json(pending.body)
    if request is None:
        return  # not a JSON model call
    capture = ExchangeCapture(
        pending.trajectory, pending.protocol, request, pending.path, start_time=pending.start_time
    )
    response = params.response
    capture.responded(response.status)  # aiohttp hands the reader decompressed bytes
    if capture.done:
        return
    length = response.content_length
    identity = response.headers.get("content-encoding", "identity").strip().lower() in (
        "",
        "identity",
    )
    # The reader belongs to this one response: wrapping it changes nothing anywhere else.
    response.content = cast(
        aiohttp.StreamReader,
        _RecordingReader(response.content, capture, length if identity else None),
    )


def capture_trace_config() -> aiohttp.TraceConfig:
    """An aiohttp trace config that records model calls made inside a capture scope.

    `aiohttp.ClientSession(trace_configs=[art.capture_trace_config()])`: every POST the
    session sends to a Chat Completions, Completions, Responses or Messages path inside
    `with art.Trajectory() as t:` is added to `t.exchanges` once its 2xx body is read.
    """
    config = aiohttp.TraceConfig()
    config.on_request_start.append(_on_request_start)
    config.on_request_chunk_sent.append(_on_request_chunk_sent)
    config.on_request_redirect.append(_on_request_redirect)
    config.on_request_end.append(_on_request_end)
    return config


class _RecordingReader:
    """A response's `StreamReader`, seen through: each read is handed to the capture."""

    def __init__(
        self, inner: aiohttp.StreamReader, capture: ExchangeCapture, length: int | None
    ) -> None:
        self._inner, self._capture, self._length = inner, capture, length
        self._received = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @overload
    def _seen(self, value: bytes) -> bytes: ...

    @overload
    def _seen(self, value: tuple[bytes, bool]) -> tuple[bytes, bool]: ...

    def _seen(self, value: bytes | tuple[bytes, bool]) -> bytes | tuple[bytes, bool]:
        chunk = value[0] if isinstance(value, tuple) else value
        self._received += len(chunk)
        self._capture.feed(chunk)
        if self._inner.at_eof() or (self._length is not None and self._received >= self._length):
            self._capture.ended()
        return value

    async def _guarded(self, read: Any) -> Any:
        try:
            return self._seen(await read)
        except BaseException:
            self._capture.cut("the response failed or was cancelled before its body ended")
            raise

    async def read(self, n: int = -1) -> bytes:
        return cast(bytes, await self._guarded(self._inner.read(n)))

    async def readany(self) -> bytes:
        return cast(bytes, await self._guarded(self._inner.readany()))

    async def readline(self) -> bytes:
        return cast(bytes, await self._guarded(self._inner.readline()))

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        return cast(bytes, await self._guarded(self._inner.readuntil(separator)))

    async def readexactly(self, n: int) -> bytes:
        return cast(bytes, await self._guarded(self._inner.readexactly(n)))

    async def readchunk(self) -> tuple[bytes, bool]:
        return cast(tuple[bytes, bool], await self._guarded(self._inner.readchunk()))

    def read_nowait(self, n: int = -1) -> bytes:
        return self._seen(self._inner.read_nowait(n))

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate(self._inner.__aiter__())

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._iterate(self._inner.iter_any())

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        return self._iterate(self._inner.iter_chunked(n))

    async def _iterate(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        complete = False
        try:
            async for chunk in chunks:
                yield self._seen(chunk)
            complete = True
            self._capture.ended()
        finally:
            if not complete:
                self._capture.cut()

    async def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        complete = False
        try:
            async for chunk in self._inner.iter_chunks():
                yield self._seen(chunk)
            complete = True
            self._capture.ended()
        finally:
            if not complete:
                self._capture.cut()


__all__ = ["capture_trace_config"]
