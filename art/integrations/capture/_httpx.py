"""Recording chat completions at the httpx level, where every OpenAI-compatible client meets.

The OpenAI SDK and langchain-openai both send through httpx. A response's byte stream
is wrapped so the body is kept as the client reads it (streamed or not), and the call is
recorded when the stream closes, into the recorder that was current when the request
was sent. Two ways in:

- `RecordingTransport` / `RecordingAsyncTransport`: httpx's own extension point, given
  to a client we build (`art.langgraph.init_chat_model` does).
- `patched_send()`: for clients the user built (zero-code capture) there is no extension
  point we can reach, so while a capture is active, and only then, the `send` methods
  of httpx's clients (and of httpx2's, which the OpenAI SDK uses by default) are replaced
  by versions that wrap chat-completion responses. The originals come back when the last capture ends; requests made outside a
  capture pass straight through.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
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
    except (RuntimeError, ValueError):  # a body not read yet (RequestNotRead), or not JSON
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
        decoded = type(response)(200, headers=response.headers, content=raw).read()
        recorder.add(order, body, decoded)

    return record


class _Recording:
    """Keeps the bytes of a response body as the client reads them, and records on close."""

    def __init__(self, inner: Any, on_body: Callable[[bytes], None]) -> None:
        self._inner, self._on_body = inner, on_body
        self._parts: list[bytes] = []
        self._complete = self._recorded = False

    def _finish(self) -> None:
        if self._complete and not self._recorded:  # a body cut short has no final chunk
            self._recorded = True
            self._on_body(b"".join(self._parts))


class _RecordingSync(_Recording):
    def __iter__(self) -> Iterator[bytes]:
        for part in self._inner:
            self._parts.append(part)
            yield part
        self._complete = True

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._finish()


class _RecordingAsync(_Recording):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            self._parts.append(part)
            yield part
        self._complete = True

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._finish()


@functools.cache
def _stream_classes(library: ModuleType) -> tuple[type[_RecordingSync], type[_RecordingAsync]]:
    # httpx checks a response stream's base class, so the wrappers derive from the
    # library (httpx or its fork httpx2) the response came from.
    sync = type("RecordingStream", (_RecordingSync, library.SyncByteStream), {})
    async_ = type("RecordingAsyncStream", (_RecordingAsync, library.AsyncByteStream), {})
    return sync, async_


def _wrap(response: httpx.Response, claim: _Claim) -> httpx.Response:
    on_body = _on_body(response, *claim)
    library = importlib.import_module(type(response).__module__.partition(".")[0])
    sync, async_ = _stream_classes(library)
    if isinstance(response.stream, library.AsyncByteStream):
        response.stream = async_(response.stream, on_body)  # type: ignore[assignment]
    else:
        response.stream = sync(response.stream, on_body)  # type: ignore[assignment]
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


def _clients() -> list[type[Any]]:
    """The client classes to patch: httpx's, and those of httpx2 (the OpenAI SDK's own) if present."""
    classes: list[type[Any]] = [httpx.Client, httpx.AsyncClient]
    if importlib.util.find_spec("httpx2") is not None:
        httpx2 = importlib.import_module("httpx2")
        classes += [httpx2.Client, httpx2.AsyncClient]
    return classes


def _recording_send(original: Callable[..., Any]) -> Callable[..., Any]:
    def send(self: httpx.Client, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        claim = _claim(request)
        if claim is None:
            return original(self, request, **kwargs)  # type: ignore[no-any-return]
        stream = kwargs.pop("stream", False)
        response = _wrap(original(self, request, stream=True, **kwargs), claim)
        if not stream:  # as httpx's own send: read the body now, close on failure
            try:
                response.read()
            except BaseException:
                response.close()
                raise
        return response

    return send


def _recording_async_send(original: Callable[..., Any]) -> Callable[..., Any]:
    async def send(
        self: httpx.AsyncClient, request: httpx.Request, **kwargs: Any
    ) -> httpx.Response:
        claim = _claim(request)
        if claim is None:
            return await original(self, request, **kwargs)  # type: ignore[no-any-return]
        stream = kwargs.pop("stream", False)
        response = _wrap(await original(self, request, stream=True, **kwargs), claim)
        if not stream:
            try:
                await response.aread()
            except BaseException:
                await response.aclose()
                raise
        return response

    return send


_patch_lock = threading.Lock()
_patch_users = 0
_originals: dict[type[Any], Any] = {}


@contextmanager
def patched_send() -> Iterator[None]:
    """Record chat completions from any httpx client while inside this block."""
    global _patch_users
    with _patch_lock:
        if _patch_users == 0:
            for client in _clients():
                original = client.__dict__["send"]
                _originals[client] = original
                is_async = inspect.iscoroutinefunction(original)
                client.send = (_recording_async_send if is_async else _recording_send)(original)
        _patch_users += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                for client, original in _originals.items():
                    client.send = original
                _originals.clear()
