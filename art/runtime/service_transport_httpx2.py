"""`service_transport`'s transport on httpx2's base classes, for the OpenAI SDK 3 (built
on httpx2, whose client takes only its own transports): the same logic, httpx2's names."""

from __future__ import annotations

import httpx2

from .service_transport import NamingDeath, StreamNamingDeath


class _Stream(StreamNamingDeath, httpx2.AsyncByteStream):
    http = httpx2


class Httpx2ServiceTransport(NamingDeath, httpx2.AsyncBaseTransport):
    """httpx2's."""

    http = httpx2
    stream = _Stream


__all__ = ["Httpx2ServiceTransport"]
