"""The transport of a model's OpenAI client to the child process's endpoint, naming a
dead child.

A request in flight when the child died is answered 503 with the death's text in
OpenAI's error shape, which the OpenAI client raises as is. A request made while a new
child starts waits for it (up to `restart_wait` seconds); one made when it could not be
started is answered 503 saying why.

Built on the HTTP library the installed OpenAI SDK is (`core.openai_http`): httpx's
classes here, httpx2's twins in `service_transport_httpx2`, the logic shared.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import httpx

from ..core.openai_http import openai_http, pool_limits
from .process import ServiceProcess


def service_transport(service: ServiceProcess) -> Any:
    """The transport for `service`'s endpoint, on the OpenAI SDK's HTTP library."""
    if openai_http() is httpx:
        return ServiceTransport(service)
    from .service_transport_httpx2 import Httpx2ServiceTransport

    return Httpx2ServiceTransport(service)


class NamingDeath:
    """What the transport does, on httpx's or httpx2's base class (`http`)."""

    http: ModuleType  # httpx or httpx2, set by the class
    stream: type  # `StreamNamingDeath` on the same library

    def __init__(self, service: ServiceProcess, restart_wait: float = 300.0) -> None:
        self._service = service
        self._restart_wait = restart_wait
        self._inner = self.http.AsyncHTTPTransport(limits=pool_limits(self.http))

    async def handle_async_request(self, request: Any) -> Any:
        service = self._service
        deadline = time.monotonic() + self._restart_wait
        while (failure := service.failure()) is not None and time.monotonic() < deadline:
            if service.restart_failed():
                break
            await asyncio.sleep(0.1)
        deaths = service.deaths
        if failure is None:
            try:
                response = await self._inner.handle_async_request(request)
            except self.http.TransportError:
                failure = await _death_since(service, deaths)
                if failure is None:
                    raise
            else:
                events = response.headers.get("content-type", "").startswith("text/event-stream")
                response.stream = self.stream(response.stream, service, deaths, events)
                return response
        error = {"message": failure, "type": "server_error", "param": None, "code": "service_died"}
        return self.http.Response(503, json={"error": error}, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class StreamNamingDeath:
    """A response body that, cut off by the child's death, says so: a server-sent event
    stream ends on an event `{"error": {...}}` (what the OpenAI SDK raises as `APIError`,
    and what the endpoint sends when a generation fails), any other body raises
    `RemoteProtocolError` with the death's text. An event stream passes on whole events
    only (the endpoint's end in a blank line), so the error event never follows half of
    one."""

    http: ModuleType  # httpx or httpx2, set by the class

    def __init__(self, inner: Any, service: ServiceProcess, deaths: int, events: bool) -> None:
        self._inner, self._service, self._deaths = inner, service, deaths
        self._event_stream = events

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        try:
            async for part in self._inner:
                if not self._event_stream:
                    yield part
                    continue
                pending += part
                end = pending.rfind(b"\n\n") + 2  # the endpoint ends its events so
                if end >= 2:
                    yield pending[:end]
                    pending = pending[end:]
            if pending:
                yield pending
        except self.http.TransportError as error:
            failure = await _death_since(self._service, self._deaths)
            if failure is None:
                raise
            if not self._event_stream:
                raise self.http.RemoteProtocolError(failure) from error
            died = {
                "message": failure,
                "type": "server_error",
                "param": None,
                "code": "service_died",
            }
            yield f"data: {json.dumps({'error': died})}\n\n".encode()

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Stream(StreamNamingDeath, httpx.AsyncByteStream):
    http = httpx


class ServiceTransport(NamingDeath, httpx.AsyncBaseTransport):
    """httpx's (an OpenAI SDK before 3)."""

    http = httpx
    stream = _Stream


async def _death_since(service: ServiceProcess, deaths: int) -> str | None:
    """Why the child died since `service.deaths` was `deaths`, if it did; None if the
    connection broke with the child alive (waiting a moment for its exit to be seen)."""
    for _ in range(50):
        if service.deaths != deaths:
            return service.death()
        if service.failure() is not None:
            return service.failure()
        await asyncio.sleep(0.02)
    return None


__all__ = ["NamingDeath", "ServiceTransport", "StreamNamingDeath", "service_transport"]
