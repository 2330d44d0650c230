"""Recording chat completions through httpx's own extension point, its transports.

A client made by `model.openai_client()` (or `art.langgraph.init_chat_model`) sends
through a `RecordingAsyncTransport`. While a rollout is being recorded (a `CallSink` is
current in its context: `art.capture_auto_trajectory`, `art.langgraph.wrap_rollout`),
each chat-completions request to the model the transport was made for is numbered as it
is sent, the response body is kept as the client reads it (streamed or not), and the
call is handed to the sink when the body is complete. Requests for any other model, and
any request made outside a recording, pass straight through. Nothing of httpx is
replaced: other clients in the process (a judge's, LiteLLM's) are never touched.

Where a tracing service is on (Langfuse, see `core/observe.py`), each chat completion
sent through these transports is also traced, inside the current rollout's trace.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

import httpx

from . import observe
from .observe import ChatTrace

_CLAIMED = "art.recording.claimed"  # request extension: an outer transport records this call
_TRACED = "art.recording.traced"  # request extension: an outer transport traces this call


class CallSink(Protocol):
    """Where the chat completions of one rollout go (the capture's `Recorder`)."""

    def start(self) -> int:
        """Number a request as it is sent."""
        ...

    def add(self, order: int, request: dict[str, Any], body: bytes) -> None:
        """A finished call: its request JSON and its response body (JSON or SSE)."""
        ...


_sink: ContextVar[CallSink | None] = ContextVar("art_recording_sink", default=None)


def current_sink() -> CallSink | None:
    """The sink of the rollout this code runs in, if one is being recorded."""
    return _sink.get()


@contextmanager
def recording_into(sink: CallSink) -> Iterator[CallSink]:
    """Record the chat completions made in this context (and tasks started from it)."""
    token = _sink.set(sink)
    try:
        yield sink
    finally:
        _sink.reset(token)


ModelFilter = Callable[[str], bool]


def served_as(names: Callable[[], Iterable[str]]) -> ModelFilter:
    """A filter accepting each of `names()` and its checkpoints (`name@step`, or the W&B
    Training API's `name:step3`)."""

    def accepts(requested: str) -> bool:
        return any(requested == n or requested.startswith((f"{n}@", f"{n}:step")) for n in names())

    return accepts


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


_Claim = tuple[CallSink, int, dict[str, Any]]


def _claim(request: httpx.Request, accepts: ModelFilter | None) -> _Claim | None:
    sink = current_sink()
    if sink is None or request.extensions.get(_CLAIMED):
        return None
    body = _chat_request(request)
    if body is None:
        return None
    if accepts is not None and not accepts(str(body.get("model", ""))):
        return None  # another model on the same endpoint (a judge, the base): not trained
    request.extensions[_CLAIMED] = True
    return sink, sink.start(), body


def _decoded(response: httpx.Response, raw: bytes) -> bytes:
    # The stream gives the bytes as sent; a fresh response decodes any gzip/br.
    return httpx.Response(200, headers=response.headers, content=raw).read()


def _on_body(response: httpx.Response, claim: _Claim) -> Callable[[bytes], None]:
    sink, order, body = claim

    def record(raw: bytes) -> None:
        if not response.is_success:
            return  # the client raises for it; nothing was sampled
        sink.add(order, body, _decoded(response, raw))

    return record


def _traced(request: httpx.Request) -> ChatTrace | None:
    """A trace of this chat completion, where a tracing service is on (Langfuse)."""
    if not observe.langfuse_wanted() or request.extensions.get(_TRACED):
        return None  # the common case: no JSON parsed, nothing imported
    body = _chat_request(request)
    if body is None:
        return None
    request.extensions[_TRACED] = True
    return observe.chat_call(body)


class _Tap:
    """Keeps the bytes of a response body as the client reads them; hands them on at close.

    `on_body` is called with the whole body if the client read it to the end; `on_cut`
    if the response was closed first (a cancelled or disconnected request).
    """

    def __init__(
        self, on_body: list[Callable[[bytes], None]], on_cut: list[Callable[[], None]]
    ) -> None:
        self._on_body, self._on_cut = on_body, on_cut
        self._parts: list[bytes] = []
        self._complete = self._finished = False

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if not self._complete:  # a body cut short has no final chunk: nothing to record
            for cut in self._on_cut:
                cut()
            return
        raw = b"".join(self._parts)
        for on_body in self._on_body:
            on_body(raw)


def _tap(response: httpx.Response, claim: _Claim | None, trace: ChatTrace | None) -> _Tap | None:
    """What watches this response's body: the capture's claim, a trace, both or neither."""
    on_body: list[Callable[[bytes], None]] = []
    on_cut: list[Callable[[], None]] = []
    if claim is not None:
        on_body.append(_on_body(response, claim))
    if trace is not None:
        on_body.append(lambda raw: trace.finish(response.status_code, _decoded(response, raw)))
        on_cut.append(lambda: trace.fail("the response was closed before its body ended"))
    return _Tap(on_body, on_cut) if on_body else None


class _RecordingStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, tap: _Tap) -> None:
        self._inner, self._tap = inner, tap

    def __iter__(self) -> Iterator[bytes]:
        for part in self._inner:
            self._tap._parts.append(part)
            yield part
        self._tap._complete = True

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._tap.finish()


class _RecordingAsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, tap: _Tap) -> None:
        self._inner, self._tap = inner, tap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self._inner:
            self._tap._parts.append(part)
            yield part
        self._tap._complete = True

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._tap.finish()


class RecordingTransport(httpx.BaseTransport):
    """An httpx transport that records chat completions sent inside a recorded rollout.

    `accepts` limits recording to some `model` values (see `served_as`); None records
    every chat completion sent through it.
    """

    def __init__(
        self, inner: httpx.BaseTransport | None = None, *, accepts: ModelFilter | None = None
    ) -> None:
        self._inner = inner or httpx.HTTPTransport()
        self._accepts = accepts

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        claim = _claim(request, self._accepts)
        trace = _traced(request)
        try:
            response = self._inner.handle_request(request)
        except BaseException as error:
            if trace is not None:
                trace.fail(f"the request failed: {error!r}")
            raise
        tap = _tap(response, claim, trace)
        if tap is not None:
            assert isinstance(response.stream, httpx.SyncByteStream)
            response.stream = _RecordingStream(response.stream, tap)
        return response

    def close(self) -> None:
        self._inner.close()


class RecordingAsyncTransport(httpx.AsyncBaseTransport):
    """The async twin of `RecordingTransport`."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport | None = None, *, accepts: ModelFilter | None = None
    ) -> None:
        self._inner = inner or httpx.AsyncHTTPTransport()
        self._accepts = accepts

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        claim = _claim(request, self._accepts)
        trace = _traced(request)
        try:
            response = await self._inner.handle_async_request(request)
        except BaseException as error:
            if trace is not None:
                trace.fail(f"the request failed: {error!r}")
            raise
        tap = _tap(response, claim, trace)
        if tap is not None:
            assert isinstance(response.stream, httpx.AsyncByteStream)
            response.stream = _RecordingAsyncStream(response.stream, tap)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


__all__ = [
    "CallSink",
    "ModelFilter",
    "RecordingAsyncTransport",
    "RecordingTransport",
    "current_sink",
    "recording_into",
    "served_as",
]
