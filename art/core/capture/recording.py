"""Recording chat completions through httpx's own extension point, its transports.

A client made by `model.openai_client()` (or `art.langgraph.init_chat_model`) sends
through a `RecordingAsyncTransport`. While a rollout is being recorded (a `CallSink` is
current in its context: `art.capture_auto_trajectory`, `art.langgraph.wrap_rollout`),
each chat-completions request to the model the transport was made for is numbered as it
is sent, the response body is kept as the client reads it (streamed or not), and the
call is handed to the sink when the body is complete. Requests for any other model, and
any request made outside a recording, pass straight through. Nothing of httpx is
replaced: other clients in the process (a judge's, LiteLLM's) are never touched.

Inside an ART 0.5.23 capture scope (`with art.Trajectory() as t:`, see
`core/capture_scope.py`), every POST these transports send to a Chat Completions,
Completions, Responses or Messages path, whatever the host or model, is also recorded as
an exchange into the innermost scope's trajectory (`core/exchange_capture.py`): once,
when its 2xx body is complete or its stream's terminal event arrives.

Where a tracing service is on (Langfuse, see `core/observe.py`), each chat completion
sent through these transports is also traced, inside the current rollout's trace.
"""

from __future__ import annotations

import json
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import httpx

from ..data import observe
from ..data.observe import ChatTrace
from . import exchange_capture
from .exchange_capture import ExchangeCapture

_CLAIMED = "art.recording.claimed"  # request extension: an outer transport records this call
_TRACED = "art.recording.traced"  # request extension: an outer transport traces this call
_EXCHANGE = "art.recording.exchange"  # request extension: an outer transport captures this call


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


class ServedModel(Protocol):
    """What `served_as` reads of a model (ART's `Model` has both)."""

    name: str

    def get_inference_name(self, step: int | None = None) -> str: ...


def served_as(model: ServedModel) -> ModelFilter:
    """A filter accepting the `model` values that reach `model`: its inference name and its
    plain name, read at each request (registration may change them), and their checkpoints
    (`name@step`, or the W&B Training API's `name:step3`)."""

    def accepts(requested: str) -> bool:
        names = (model.get_inference_name(), model.name)
        return any(requested == n or requested.startswith((f"{n}@", f"{n}:step")) for n in names)

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


def _exchange(request: httpx.Request) -> ExchangeCapture | None:
    """A capture of this call into the current capture scope, if it is a model call."""
    if request.extensions.get(_EXCHANGE):
        return None
    try:
        body = request.content
    except RuntimeError:  # RequestNotRead (httpx's or httpx2's): a streamed upload, not JSON
        return None
    capture = exchange_capture.begin(request.method, str(request.url), body)
    if capture is not None:
        request.extensions[_EXCHANGE] = True
    return capture


def _responded(response: httpx.Response, capture: ExchangeCapture | None) -> ExchangeCapture | None:
    """Tell `capture` the status; None where the body need not be watched (not 2xx)."""
    if capture is None:
        return None
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    compressed = encoding not in ("", "identity")
    # A compressed stream's terminal event cannot be seen in its bytes: it ends at its end.
    capture.responded(response.status_code, scan=not compressed)
    if compressed:
        capture.decode = lambda raw: _decoded(response, raw)
    return None if capture.done else capture


class Tap:
    """Keeps the bytes of a response body as the client reads them; hands them on at close.

    `on_body` is called with the whole body if the client read it to the end; `on_cut`
    if the response was closed first (a cancelled or disconnected request). An exchange
    capture is fed each piece as it is read, so it can end at a stream's terminal event.
    """

    def __init__(
        self,
        on_body: list[Callable[[bytes], None]],
        on_cut: list[Callable[[], None]],
        exchange: ExchangeCapture | None = None,
    ) -> None:
        self._on_body, self._on_cut, self._exchange = on_body, on_cut, exchange
        self._parts: list[bytes] = []
        self._complete = self._finished = False

    def part(self, chunk: bytes) -> None:
        if self._on_body:
            self._parts.append(chunk)
        if self._exchange is not None:
            self._exchange.feed(chunk)

    def ended(self) -> None:
        self._complete = True
        if self._exchange is not None:
            self._exchange.ended()

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        if not self._complete:  # a body cut short has no final chunk: nothing to record
            if self._exchange is not None:
                self._exchange.cut()
            for cut in self._on_cut:
                cut()
            return
        raw = b"".join(self._parts)
        for on_body in self._on_body:
            on_body(raw)


def _tap(
    response: httpx.Response,
    claim: _Claim | None,
    trace: ChatTrace | None,
    exchange: ExchangeCapture | None,
) -> Tap | None:
    """What watches this response's body: the capture's claim, a trace, an exchange capture,
    any of them or none."""
    on_body: list[Callable[[bytes], None]] = []
    on_cut: list[Callable[[], None]] = []
    if claim is not None:
        on_body.append(_on_body(response, claim))
    if trace is not None:
        on_body.append(lambda raw: trace.finish(response.status_code, _decoded(response, raw)))
        on_cut.append(lambda: trace.fail("the response was closed before its body ended"))
    return Tap(on_body, on_cut, exchange) if on_body or exchange is not None else None


@dataclass(frozen=True)
class _Watch:
    """What watches one call: the rollout's claim, a trace, an exchange capture (or none)."""

    claim: _Claim | None
    trace: ChatTrace | None
    exchange: ExchangeCapture | None

    @classmethod
    def of(cls, request: Any, accepts: ModelFilter | None) -> _Watch:
        """`request` is httpx's or httpx2's (the same API): see `recording_httpx2`."""
        return cls(_claim(request, accepts), _traced(request), _exchange(request))

    def sending(self) -> AbstractContextManager[object]:
        return exchange_capture.sending() if self.exchange is not None else nullcontext()

    def failed(self, error: BaseException) -> None:
        if self.trace is not None:
            self.trace.fail(f"the request failed: {error!r}")

    def tap(self, response: Any) -> Tap | None:
        return _tap(response, self.claim, self.trace, _responded(response, self.exchange))


R = TypeVar("R")  # httpx's or httpx2's Response


def record(
    request: Any,
    accepts: ModelFilter | None,
    send: Callable[[Any], R],
    wrap: Callable[[Any, Tap], object],
) -> R:
    """`send(request)`, its answer's body watched through `wrap` where anything records it.

    Shared by httpx's and httpx2's transports (`recording_httpx2`): the same API, their own
    classes.
    """
    watch = _Watch.of(request, accepts)
    try:
        with watch.sending():
            response = send(request)
    except BaseException as error:
        watch.failed(error)
        raise
    tap = watch.tap(response)
    if tap is not None:
        response.stream = wrap(response.stream, tap)  # type: ignore[attr-defined]
    return response


async def arecord(
    request: Any,
    accepts: ModelFilter | None,
    send: Callable[[Any], Awaitable[R]],
    wrap: Callable[[Any, Tap], object],
) -> R:
    """The async twin of `record`."""
    watch = _Watch.of(request, accepts)
    try:
        with watch.sending():
            response = await send(request)
    except BaseException as error:
        watch.failed(error)
        raise
    tap = watch.tap(response)
    if tap is not None:
        response.stream = wrap(response.stream, tap)  # type: ignore[attr-defined]
    return response


class TappedStream:
    """A response body whose parts are shown to a `Tap` as they pass (`tapped`).

    Mixed into httpx's `SyncByteStream` here and httpx2's in `recording_httpx2`: a
    response checks its stream's class, so each library gets a class of its own.
    """

    def __init__(self, inner: Iterable[bytes], tap: Tap) -> None:
        self._inner, self._tap = inner, tap

    def __iter__(self) -> Iterator[bytes]:
        yield from tapped(self._inner, self._tap)

    def close(self) -> None:
        close_tapped(self._inner, self._tap)


class AsyncTappedStream:
    """The async twin of `TappedStream`, mixed into each library's `AsyncByteStream`."""

    def __init__(self, inner: AsyncIterable[bytes], tap: Tap) -> None:
        self._inner, self._tap = inner, tap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in atapped(self._inner, self._tap):
            yield part

    async def aclose(self) -> None:
        await aclose_tapped(self._inner, self._tap)


class _RecordingStream(TappedStream, httpx.SyncByteStream):
    """httpx's."""


class _RecordingAsyncStream(AsyncTappedStream, httpx.AsyncByteStream):
    """httpx's."""


def tapped(inner: Iterable[bytes], tap: Tap) -> Iterator[bytes]:
    """`inner`'s parts, each shown to `tap` as it passes; `tap.ended()` after the last."""
    for part in inner:
        tap.part(part)
        yield part
    tap.ended()


async def atapped(inner: AsyncIterable[bytes], tap: Tap) -> AsyncIterator[bytes]:
    """`tapped` for an async body."""
    async for part in inner:
        tap.part(part)
        yield part
    tap.ended()


def close_tapped(inner: Any, tap: Tap) -> None:
    """Close the body `inner`; `tap` finishes (hands on what it kept) whatever happens."""
    try:
        inner.close()
    finally:
        tap.finish()


async def aclose_tapped(inner: Any, tap: Tap) -> None:
    """`close_tapped` for an async body."""
    try:
        await inner.aclose()
    finally:
        tap.finish()


class RecordingTransport(httpx.BaseTransport):
    """An httpx transport that records chat completions sent inside a recorded rollout,
    and the model calls sent inside a capture scope as exchanges.

    `accepts` limits the rollout recording to some `model` values (see `served_as`); None
    records every chat completion sent through it. A capture scope records every model
    call, whichever model it names, as ART's does.
    """

    def __init__(
        self, inner: httpx.BaseTransport | None = None, *, accepts: ModelFilter | None = None
    ) -> None:
        self._inner = inner or httpx.HTTPTransport()
        self._accepts = accepts

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return record(request, self._accepts, self._inner.handle_request, _RecordingStream)

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
        send = self._inner.handle_async_request
        return await arecord(request, self._accepts, send, _RecordingAsyncStream)

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
