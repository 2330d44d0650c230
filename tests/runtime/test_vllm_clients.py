"""The vLLM engine's HTTP clients, one per event loop, without starting vLLM.

Each client talks to a real HTTP server on 127.0.0.1 that notes when a connection ends,
so closing is checked where it matters: the socket the server holds.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import httpx
import pytest
from helpers import JsonHandler

from art.runtime.engines.vllm.engine import _LoopClients


class _KeepAlive(JsonHandler):
    protocol_version = "HTTP/1.1"  # connections stay open between requests
    ended = threading.Event()

    def do_GET(self) -> None:
        self.send_json({"ok": True})

    def finish(self) -> None:
        super().finish()
        type(self).ended.set()  # the client closed its connection


@pytest.fixture
def server() -> Iterator[tuple[str, threading.Event]]:
    ended = threading.Event()
    handler = type("Handler", (_KeepAlive,), {"ended": ended})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", ended
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_later_event_loop_never_gets_an_earlier_loops_client() -> None:
    clients = _LoopClients(httpx.AsyncClient)

    async def client_of_this_loop() -> httpx.AsyncClient:
        client = clients.get()
        assert clients.get() is client
        return client

    given = []
    for _ in range(20):
        given.append(asyncio.run(client_of_this_loop()))
        # The collector frees the closed loop, as it would in a long run: CPython then
        # often gives the next loop the same id.
        gc.collect()
    assert len({id(client) for client in given}) == len(given)  # all kept alive: distinct
    clients.close()  # clients of closed loops: dropped, and close() does not raise


def test_close_inside_the_running_loop_closes_its_client(
    server: tuple[str, threading.Event],
) -> None:
    # A Ray replica's `close()` is a plain method run on the actor's event loop.
    url, ended = server
    clients = _LoopClients(lambda: httpx.AsyncClient(base_url=url))

    async def serve_then_close() -> None:
        client = clients.get()
        assert (await client.get("/")).json() == {"ok": True}
        assert not ended.is_set()  # the connection is kept open for the next request
        clients.close()  # the close runs as a task of this loop, once this one waits
        assert await asyncio.to_thread(ended.wait, 30)  # a deadline, not a timing
        assert client.is_closed

    asyncio.run(serve_then_close())


def test_close_of_a_stopped_loop_runs_on_that_loop(server: tuple[str, threading.Event]) -> None:
    url, ended = server
    clients = _LoopClients(lambda: httpx.AsyncClient(base_url=url))

    async def request() -> httpx.AsyncClient:
        client = clients.get()
        assert (await client.get("/")).json() == {"ok": True}
        return client

    loop = asyncio.new_event_loop()
    try:
        client = loop.run_until_complete(request())
        clients.close()
        assert client.is_closed
        assert ended.wait(30)  # a deadline, not a timing
    finally:
        loop.close()
