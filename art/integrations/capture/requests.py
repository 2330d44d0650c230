"""Capture through requests' own extension point, a transport adapter.

    session = art.capture_requests_session()  # or session.mount("http://", CaptureAdapter())
    with art.Trajectory() as t:
        session.post(f"{base_url}/chat/completions", json=body)  # into t.exchanges

`CaptureAdapter` is an `HTTPAdapter` (requests' documented subclassing point): it sends
as its parent does, and hands back a response whose body reads (`content`, `json()`,
`iter_content`, `iter_lines`, streamed or not) are seen by the capture. The body is
complete when read to its end or, for a stream, at its terminal event; a response closed
before either is logged in the trajectory, not recorded. Reading `response.raw` directly
goes around requests' reading, and around the capture. Nothing of requests is replaced.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal, overload

import requests
from requests.adapters import HTTPAdapter
from requests.utils import stream_decode_response_unicode

from ...core.capture import exchange_capture
from ...core.capture.exchange_capture import ExchangeCapture


class CaptureAdapter(HTTPAdapter):
    """An `HTTPAdapter` that records model calls sent inside a capture scope as exchanges."""

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        capture = exchange_capture.begin(request.method or "", request.url or "", request.body)
        if capture is None:
            return super().send(request, stream, timeout, verify, cert, proxies)
        with exchange_capture.sending():
            response = super().send(request, stream, timeout, verify, cert, proxies)
        capture.responded(response.status_code)  # requests reads the body decompressed
        return response if capture.done else _RecordedResponse.of(response, capture)


class _RecordedResponse(requests.Response):
    """A response whose body, as requests reads it, is also handed to a capture."""

    _art_capture: ExchangeCapture

    @classmethod
    def of(cls, response: requests.Response, capture: ExchangeCapture) -> _RecordedResponse:
        # The adapter built a plain Response; this one holds the same state.
        recorded = cls()
        recorded.__dict__.update(response.__dict__)
        recorded._art_capture = capture
        return recorded

    @overload
    def iter_content(
        self, chunk_size: int | None = 1, decode_unicode: Literal[False] = False
    ) -> Iterator[bytes]: ...

    @overload
    def iter_content(
        self, chunk_size: int | None = 1, *, decode_unicode: Literal[True]
    ) -> Iterator[str | bytes]: ...

    def iter_content(
        self, chunk_size: int | None = 1, decode_unicode: bool = False
    ) -> Iterator[str | bytes]:
        fresh = not self._content_consumed
        chunks: Iterator[bytes] = super().iter_content(chunk_size)
        if fresh:
            chunks = _seen(chunks, self._art_capture)
        if decode_unicode:
            return stream_decode_response_unicode(chunks, self)
        return iter(chunks)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._art_capture.cut()  # nothing once the body ended


def _seen(chunks: Iterator[bytes], capture: ExchangeCapture) -> Iterator[bytes]:
    complete = False
    try:
        for chunk in chunks:
            capture.feed(chunk)
            yield chunk
        complete = True
        capture.ended()
    finally:
        if not complete:
            capture.cut()


def capture_requests_session() -> requests.Session:
    """A `requests.Session` that records model calls made inside a capture scope.

    `CaptureAdapter` is mounted for http:// and https://: every POST to a Chat
    Completions, Completions, Responses or Messages path inside `with art.Trajectory()
    as t:` is added to `t.exchanges` once its 2xx body is read.
    """
    session = requests.Session()
    session.mount("http://", CaptureAdapter())
    session.mount("https://", CaptureAdapter())
    return session


__all__ = ["CaptureAdapter", "capture_requests_session"]
