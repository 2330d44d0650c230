"""The HTTP library of the installed OpenAI SDK, and the client `Model.openai_client` uses.

OpenAI's SDK 3 is built on httpx2, the fork of httpx with the same API; earlier SDKs on
httpx. SDK 3 takes an httpx client too, but httpx's connection pool (httpcore 1.0.9)
closes idle connections while more than `max_keepalive_connections` are open and rescans
every connection for every queued request: 256 concurrent chat completions to a server
answering in 0.2 s took 5.7-7.6 s a round through it, 1.3-1.5 s through httpx2's
(httpcore2, which fixed both; `benchmarks/RESULTS.md`, 2026-11-30). So the client is
built on the library the SDK is, and so is any transport a backend gives for it.
"""

from __future__ import annotations

from types import ModuleType

import httpx

# The OpenAI SDK's own pool limits, which an httpx client of our own would lower.
MAX_CONNECTIONS = 1000
MAX_KEEPALIVE_CONNECTIONS = 100


def openai_http() -> ModuleType:
    """httpx2 where the installed OpenAI SDK's client is built on it, else httpx."""
    import openai

    try:
        import httpx2
    except ImportError:
        return httpx
    return httpx2 if issubclass(openai.DefaultAsyncHttpxClient, httpx2.AsyncClient) else httpx


def pool_limits(http: ModuleType) -> httpx.Limits:
    """`http`'s `Limits` (httpx's or httpx2's) at the OpenAI SDK's own values."""
    limits: httpx.Limits = http.Limits(
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE_CONNECTIONS
    )
    return limits


__all__ = ["openai_http", "pool_limits"]
