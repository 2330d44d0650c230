"""LocalBackend's endpoint under hostile load: many concurrent clients, some vanishing.

`--requests` (256) streaming chat completions are sent at once to the in-process
LocalBackend on 127.0.0.1. `--disconnect` (10%) of the clients ask for a long answer and
close their connection after its first text; the rest ask for `--max-tokens` tokens and
read to the end. It prints how many of the rest failed (must be 0), their latency p50/p99,
and the same for the rest sent alone (no vanishing clients), as the peer: the ratio says
what the abandoned requests cost the others once the engine drops their rows.

    python benchmarks/load.py                   # 256 requests, 10% disconnecting
    python benchmarks/load.py --requests 64     # a smaller run
    python benchmarks/load.py --quick           # a smoke setting: 8 requests, 2 vanishing

Loopback only; every request has a timeout, so a run is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import httpx
from support.machine import machine

import art
from art.local import LocalBackend

PROMPTS = [
    "Name a fruit.",
    "Say hello in French.",
    "What is two plus two?",
    "Name a color.",
    "Give me a short greeting.",
    "Name an animal.",
]


@dataclass
class Outcome:
    ok: bool
    seconds: float
    error: str = ""


async def complete(http: httpx.AsyncClient, model: str, index: int, max_tokens: int) -> Outcome:
    """One client that reads its stream to `[DONE]`."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPTS[index % len(PROMPTS)]}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    started = time.monotonic()
    try:
        async with http.stream("POST", "/chat/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode()[:200]
                return Outcome(False, time.monotonic() - started, f"{response.status_code} {text}")
            done = False
            async for line in response.aiter_lines():
                done = done or line == "data: [DONE]"
        return Outcome(done, time.monotonic() - started, "" if done else "no [DONE]")
    except httpx.HTTPError as error:
        return Outcome(False, time.monotonic() - started, f"{type(error).__name__}: {error}")


async def vanish(http: httpx.AsyncClient, model: str) -> None:
    """One client that asks for a long story and hangs up after its first text."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1000,
        "stream": True,
    }
    async with http.stream("POST", "/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if '"content": "' in line and '"content": ""' not in line:
                return  # closing the stream closes the connection


async def run(
    base_url: str, key: str, model: str, requests: int, vanishing: int, max_tokens: int
) -> list[Outcome]:
    limits = httpx.Limits(max_connections=requests + 8, max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=900, limits=limits
    ) as http:
        work = [complete(http, model, i, max_tokens) for i in range(requests - vanishing)]
        gone = [vanish(http, model) for _ in range(vanishing)]
        results = await asyncio.gather(*work, *gone, return_exceptions=True)
    outcomes = []
    for result in results[: requests - vanishing]:
        if isinstance(result, BaseException):
            outcomes.append(Outcome(False, 0.0, repr(result)))
        else:
            assert isinstance(result, Outcome)
            outcomes.append(result)
    return outcomes


def report(label: str, outcomes: list[Outcome], wall: float) -> tuple[float, float]:
    failed = [o for o in outcomes if not o.ok]
    latencies = sorted(o.seconds for o in outcomes if o.ok)
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else 0.0
    print(
        f"{label}: {len(outcomes)} reading clients, {len(failed)} failed, "
        f"p50 {p50:.1f} s, p99 {p99:.1f} s, wall {wall:.1f} s"
    )
    for outcome in failed[:5]:
        print(f"  failure: {outcome.error}")
    return p50, p99


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--disconnect", type=float, default=0.10, help="share of clients")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--no-peer", action="store_true", help="skip the run without vanishers")
    parser.add_argument("--quick", action="store_true", help="8 requests, 2 vanishing, 4 tokens")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.disconnect, args.max_tokens = 8, 0.25, 4
    vanishing = round(args.requests * args.disconnect)

    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as path:
        async with LocalBackend(path=path, in_process=True) as backend:
            model = art.TrainableModel(name="load", project="bench", base_model=art_default())
            await model.register(backend)
            url, key = str(model.inference_base_url), str(model.inference_api_key)
            print(f"{args.requests} concurrent streams, {vanishing} of them disconnect")
            peer = None
            if not args.no_peer:
                started = time.monotonic()
                alone = await run(
                    url, key, model.name, args.requests - vanishing, 0, args.max_tokens
                )
                peer = report("without vanishing clients", alone, time.monotonic() - started)
            started = time.monotonic()
            outcomes = await run(url, key, model.name, args.requests, vanishing, args.max_tokens)
            ours = report("with vanishing clients", outcomes, time.monotonic() - started)
            if peer is not None:
                print(f"p50 ratio (with / without): {ours[0] / peer[0]:.2f}x")
            if any(not o.ok for o in outcomes):
                raise SystemExit(1)


def art_default() -> str:
    from art.runtime.models import DEFAULT_MODEL

    return DEFAULT_MODEL


if __name__ == "__main__":
    asyncio.run(main())
