"""Recording chat completions at the httpx level, where every OpenAI-compatible client meets.

The OpenAI SDK and langchain-openai both send through httpx. A response's byte stream
is wrapped so the body is kept as the client reads it (streamed or not), and the call is
recorded when the stream closes, into the recorder that was current when the request
was sent. Two ways in:

- `RecordingTransport` / `RecordingAsyncTransport`: httpx's own extension point, given
  to a client we build (`art.langgraph.init_chat_model` does).
- `patched_send()`: for clients the user built (zero-code capture) there is no extension
  point we can reach, so while a capture is active, and only then, `httpx.Client.send`
  and `httpx.AsyncClient.send` are replaced by versions that wrap chat-completion
  responses. The originals come back when the last capture ends; requests made outside a
  capture pass straight through.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from ._recorder import Recorder, current_recorder

_CLAIMED = "art.capture.recorded"  # request extension: a wrapper already records this call


def _chat_request(request: httpx.Request) -> dict[str, Any] | None:
    """The JSON body of a chat-completions request, or None for any other request."""
    if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
        return None
    try:
        body = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None
    return body


_Claim = tuple[Recorder, int, dict[str, Any]]


def _claim(request: httpx.Request) -> _Claim | None:
    """Recorder, call number and request body, if this request is to be recorded and is not yet."""
    recorder = current_recorder()
    if recorder is None or request.extensions.get(_CLAIMED):
        return None
    body = _chat_request(request)
    if body is None:
        return None
    request.extensions[_CLAIMED] = True
    return recorder, recorder.start(), body


def _on_body(
    response: httpx.Response, recorder: Recorder, order: int, body: dict[str, Any]
) -> Callable[[bytes], None]:
    def record(raw: bytes) -> None:
        if not response.is_success:
            return  # the client raises for it; nothing was sampled
        # The stream gives the bytes as sent; a fresh response decodes any gzip/br.
        decoded = httpx.Response(200, headers=response.headers, content=raw).read()
        recorder.add(order, body, decoded)

    return record


class _RecordingStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, on_body: Callable[[bytes], None]) -> None:
        self._inner, self._on_body = inner, on_body
        self._parts: list[bytes] = []
        self._complete = self._recorded = False

    def __iter__(self) -> Iterator[bytes]:
        for part in self._inner:
            self._parts.append(part)
            yield part
        self._complete = True

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            if self._complete and not self._recorded:  # a body cut short has no final chunk
                self._recorded = True
                self._on_body(b"".join(self._parts))


class _RecordingAsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, on_body: Callable[[bytes], None]) -> None:
        self._inner, self._on_body = inner, on_body
        self._parts: list[bytes] = []
        self._complete = self._recorded = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            self._parts.append(part)
            yield part
        self._complete = True

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._complete and not self._recorded:
                self._recorded = True
                self._on_body(b"".join(self._parts))


def _wrap(response: httpx.Response, claim: _Claim) -> httpx.Response:
    on_body = _on_body(response, *claim)
    if isinstance(response.stream, httpx.AsyncByteStream):
        response.stream = _RecordingAsyncStream(response.stream, on_body)
    else:
        response.stream = _RecordingStream(response.stream, on_body)
    return response


class RecordingTransport(httpx.BaseTransport):
    """An httpx transport that records the chat completions sent inside a rollout."""

    def __init__(self, inner: httpx.BaseTransport | None = None) -> None:
        self._inner = inner or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        claim = _claim(request)
        response = self._inner.handle_request(request)
        return response if claim is None else _wrap(response, claim)

    def close(self) -> None:
        self._inner.close()


class RecordingAsyncTransport(httpx.AsyncBaseTransport):
    """The async twin of `RecordingTransport`."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        claim = _claim(request)
        response = await self._inner.handle_async_request(request)
        return response if claim is None else _wrap(response, claim)

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- the send patch, active only while a capture is ------------------------------------

_ORIGINAL_SEND = httpx.Client.send
_ORIGINAL_ASYNC_SEND = httpx.AsyncClient.send
_patch_lock = threading.Lock()
_patch_users = 0


def _send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
    claim = _claim(request)
    if claim is None:
        return _ORIGINAL_SEND(self, request, **kwargs)
    stream = kwargs.pop("stream", False)
    response = _wrap(_ORIGINAL_SEND(self, request, stream=True, **kwargs), claim)
    if not stream:  # as httpx's own send: read the body now, close on failure
        try:
            response.read()
        except BaseException:
            response.close()
            raise
    return response


async def _async_send(
    self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
) -> httpx.Response:
    claim = _claim(request)
    if claim is None:
        return await _ORIGINAL_ASYNC_SEND(self, request, **kwargs)
    stream = kwargs.pop("stream", False)
    response = _wrap(await _ORIGINAL_ASYNC_SEND(self, request, stream=True, **kwargs), claim)
    if not stream:
        try:
            await response.aread()
        except BaseException:
            await response.aclose()
            raise
    return response


@contextmanager
def patched_send() -> Iterator[None]:
    """Record chat completions from any httpx client while inside this block."""
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            httpx.Client.send = _send  # type: ignore[method-assign]
            httpx.AsyncClient.send = _async_send  # type: ignore[method-assign]
        _patch_users += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                httpx.Client.send = _ORIGINAL_SEND  # type: ignore[method-assign]
                httpx.AsyncClient.send = _ORIGINAL_ASYNC_SEND  # type: ignore[method-assign]
