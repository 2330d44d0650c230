"""A model's OpenAI client under hundreds of concurrent requests, against plain clients.

Rollouts run concurrently: 256 agents sampling at once send 256 chat completions at
once through `model.openai_client()`. This measures what the client itself costs, with no
model behind it: a server in a child process on 127.0.0.1 answers every chat completion
after `--delay` seconds (a stand-in for sampling, the same for every client), and each
client sends `--rounds` rounds of `--requests` concurrent requests. Measured in one run,
the clients in turns, round by round:

- ours: `art.Model(inference_base_url=...).openai_client()` (a recording transport on
  the OpenAI SDK's own HTTP library, httpx2 from SDK 3 on);
- the SDK's default: `AsyncOpenAI(base_url=...)` with its own client, the strongest plain
  peer (what a user who never calls `openai_client()` gets);
- the SDK over httpx: `AsyncOpenAI(http_client=httpx.AsyncClient(...))` at the same pool
  limits, what ours was built on before 2026-11-30.

A round's floor is `--delay`; the rest is the client's and the server's own work (the
server answers from a raw asyncio loop, so its share is small and the same for all).

    python benchmarks/client_pool.py              # 256 requests, 6 rounds each
    python benchmarks/client_pool.py --quick      # a smoke setting: 32 requests, 2 rounds
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from dataclasses import dataclass

import httpx
from openai import AsyncOpenAI
from support.machine import machine

import art
from art.core.openai_http import openai_http, pool_limits

ANSWER = json.dumps(
    {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
).encode()


@dataclass(frozen=True)
class Args:
    requests: int = 256  # concurrent requests per round
    rounds: int = 6  # rounds per client, taken in turns
    delay: float = 0.2  # seconds the server waits before each answer


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """HTTP/1.1 with keep-alive: every request on the connection answered after `delay`."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            await asyncio.sleep(delay)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _serve(delay: float, ports: multiprocessing.SimpleQueue[int]) -> None:
    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _answer(r, w, delay), "127.0.0.1", 0, backlog=4096
        )
        ports.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


def clients(base_url: str) -> dict[str, AsyncOpenAI]:
    http = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(limits=pool_limits(httpx)), timeout=120
    )
    return {
        "ours: model.openai_client()": art.Model(
            name="m", project="pool", inference_base_url=base_url, inference_api_key="k"
        ).openai_client(),
        "AsyncOpenAI(), the SDK's own client": AsyncOpenAI(base_url=base_url, api_key="k"),
        "AsyncOpenAI over httpx, same limits": AsyncOpenAI(
            base_url=base_url, api_key="k", http_client=http
        ),
    }


async def one_round(client: AsyncOpenAI, requests: int) -> float:
    started = time.perf_counter()
    await asyncio.gather(
        *(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"What is {i} + 2?"}]
            )
            for i in range(requests)
        )
    )
    return time.perf_counter() - started


async def run(args: Args, base_url: str) -> dict[str, list[float]]:
    named = clients(base_url)
    for client in named.values():  # each pool opened once, unmeasured
        await one_round(client, args.requests)
    seconds: dict[str, list[float]] = {name: [] for name in named}
    for _ in range(args.rounds):
        for name, client in named.items():
            seconds[name].append(await one_round(client, args.requests))
    for client in named.values():
        await client.close()
    return seconds


def report(args: Args, seconds: dict[str, list[float]]) -> None:
    print(f"machine: {machine()}")
    http = openai_http()
    print(
        f"{args.requests} concurrent chat completions a round, {args.rounds} rounds each in "
        f"turns, server delay {args.delay:.2f} s; the OpenAI SDK's HTTP library: "
        f"{http.__name__} {http.__version__}"
    )
    print(f"{'client':<40} {'median s/round':>15} {'min':>7} {'max':>7}")
    for name, values in seconds.items():
        print(
            f"{name:<40} {statistics.median(values):>15.2f} {min(values):>7.2f} {max(values):>7.2f}"
        )
    ours, sdk, over_httpx = (statistics.median(values) for values in seconds.values())
    print(f"ours / the SDK's own client, seconds per round: {ours / sdk:.2f}x")
    print(f"ours / the SDK over httpx, seconds per round: {ours / over_httpx:.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=Args.requests)
    parser.add_argument("--rounds", type=int, default=Args.rounds)
    parser.add_argument("--delay", type=float, default=Args.delay)
    parser.add_argument("--quick", action="store_true", help="32 requests, 2 rounds")
    options = parser.parse_args(argv)
    for name in ("requests", "rounds"):
        if getattr(options, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if options.delay < 0:
        parser.error("--delay must be at least 0")
    args = Args(options.requests, options.rounds, options.delay)
    if options.quick:
        args = Args(requests=32, rounds=2, delay=0.05)
    ports: multiprocessing.SimpleQueue[int] = multiprocessing.get_context("spawn").SimpleQueue()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(args.delay, ports), daemon=True
    )
    server.start()
    try:
        seconds = asyncio.run(run(args, f"http://127.0.0.1:{ports.get()}/v1"))
    finally:
        server.kill()
    report(args, seconds)


if __name__ == "__main__":
    main()
