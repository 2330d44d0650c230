"""A soak of LocalBackend's endpoint: thousands of mixed requests, a third abandoned.

`--requests` (3,000) requests go to a LocalBackend serving the default model (its model
service in its child process, as users run it), `--clients` (16) at a time in a closed
loop, over the four protocols in turn: Chat Completions (some with a JSON grammar),
Completions, Responses and Anthropic Messages; half of them streamed, and `--cancel`
(30%) of all of them streams whose client hangs up after the first event. A run of
`--warmup` requests of the same mix comes first: memory that the first traffic allocates
once (arenas, compiled grammars, the prefix cache's first entries) is the start level,
not a leak.

It prints the service process's RSS and the engine's live rows and KV bytes (the
running batch's, and the prefix cache's, which is bounded) at the start, their peak under
traffic, and at the end, once traffic has stopped and the engine is idle. The peer is
the service itself before the soak: a leak shows as an end above the start. The run fails
(exit 1) when a request that was not abandoned failed, when rows or batch KV bytes are
left at the end, or when the end RSS is above the start by more than `--tolerance-mib`
(64 MiB: the variation of glibc's heap between idle moments, measured in RESULTS.md).

    python benchmarks/soak.py                 # 3,000 requests
    python benchmarks/soak.py --quick         # a smoke setting: 32 requests, 8 of warmup
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import httpx
from support.machine import machine

import art
from art.local import LocalBackend
from art.runtime.process import ServiceProcess

PROMPTS = [
    "Name a fruit.",
    "Say hello in French.",
    "What is two plus two?",
    "Write a very long story about a dragon.",
    "Give me a short greeting.",
    "List three animals.",
]
PROTOCOLS = ["chat", "completions", "responses", "messages"]


@dataclass(frozen=True)
class Call:
    protocol: str
    stream: bool
    cancel: bool  # a stream whose client hangs up after its first event
    grammar: bool  # a chat completion constrained to JSON
    prompt: str
    max_tokens: int


def calls(count: int, cancel: float, seed: int) -> list[Call]:
    """`count` calls over the protocols in turn; `cancel` of them abandoned streams, the
    other streams chosen so that half of all calls stream."""
    draw = random.Random(seed)
    made = []
    for index in range(count):
        abandoned = draw.random() < cancel
        stream = abandoned or draw.random() < (0.5 - cancel) / (1 - cancel)
        protocol = PROTOCOLS[index % len(PROTOCOLS)]
        made.append(
            Call(
                protocol=protocol,
                stream=stream,
                cancel=abandoned,
                grammar=protocol == "chat" and draw.random() < 0.25,
                prompt=draw.choice(PROMPTS),
                max_tokens=200 if abandoned else draw.randint(1, 24),
            )
        )
    return made


def request(call: Call, model: str) -> tuple[str, dict[str, Any]]:
    """The call's path and body, in its protocol's own shape."""
    user = [{"role": "user", "content": call.prompt}]
    if call.protocol == "chat":
        body: dict[str, Any] = {"model": model, "messages": user, "max_tokens": call.max_tokens}
        if call.grammar:
            body["response_format"] = {"type": "json_object"}
        return "/v1/chat/completions", {**body, "stream": call.stream}
    if call.protocol == "completions":
        body = {"model": model, "prompt": call.prompt, "max_tokens": call.max_tokens}
        return "/v1/completions", {**body, "stream": call.stream}
    if call.protocol == "responses":
        body = {"model": model, "input": call.prompt, "max_output_tokens": call.max_tokens}
        return "/v1/responses", {**body, "stream": call.stream, "store": False}
    body = {"model": model, "messages": user, "max_tokens": call.max_tokens}
    return "/v1/messages", {**body, "stream": call.stream}


async def send(http: httpx.AsyncClient, call: Call, model: str) -> str:
    """Make the call; returns "" if it went as it should, else what went wrong."""
    path, body = request(call, model)
    try:
        async with http.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                return f"{call.protocol}: {response.status_code} {(await response.aread())[:200]!r}"
            if call.cancel:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        return ""  # leaving the block closes the connection mid-stream
                return f"{call.protocol}: the stream ended before its first event"
            text = (await response.aread()).decode()
    except httpx.HTTPError as error:
        return f"{call.protocol}: {type(error).__name__}: {error}"
    if call.stream and (failed := error_event(text)):
        return f"{call.protocol}: an error event: {failed[:300]}"
    return ""


def error_event(text: str) -> str:
    """The first error event of a stream in any of the four protocols, or ""."""
    for block in text.split("\n\n"):
        lines = block.splitlines()
        if any(line in ("event: error", "event: response.failed") for line in lines):
            return block
        for line in lines:
            if line.startswith("data: {"):
                data = json.loads(line.removeprefix("data: "))
                if data.get("error") is not None or data.get("type") == "error":
                    return block
    return ""


async def traffic(
    url: str, key: str, model: str, work: list[Call], clients: int, sample: Any
) -> list[str]:
    """`work` sent by `clients` clients in a closed loop; `sample()` runs every 0.5 s."""
    headers = {
        "Authorization": f"Bearer {key}",
        "x-api-key": key,
        "anthropic-version": "2023-06-01",
    }
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients)
    failures: list[str] = []
    queue = iter(work)

    async def client(http: httpx.AsyncClient) -> None:
        for call in queue:
            if failure := await send(http, call, model):
                failures.append(failure)

    async def sampler() -> None:
        while True:
            sample()
            await asyncio.sleep(0.5)

    async with httpx.AsyncClient(
        base_url=url.removesuffix("/v1"), headers=headers, timeout=300, limits=limits
    ) as http:
        watching = asyncio.create_task(sampler())
        await asyncio.gather(*(client(http) for _ in range(clients)))
        watching.cancel()
    return failures


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


@dataclass
class Reading:
    rss: int
    rows: int
    kv: int  # the running batch's keys and values
    prefix: int  # the prefix cache's

    @classmethod
    def of(cls, service: ServiceProcess) -> Reading:
        state = service.engine_state()
        return cls(
            rss=rss_bytes(service.pid),
            rows=sum(engine["active_rows"] for engine in state),
            kv=sum(engine["kv_cache_bytes"] for engine in state),
            prefix=sum(engine["prefix_cache_bytes"] for engine in state),
        )


MIB = 2**20


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cancel", type=float, default=0.30, help="share of abandoned streams")
    parser.add_argument("--tolerance-mib", type=float, default=64.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="32 requests, 8 of warmup, 4 clients")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.warmup, args.clients = 32, 8, 4

    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as path:
        async with LocalBackend(path=path) as backend:
            model = art.TrainableModel(name="soak", project="bench", base_model=default_model())
            await model.register(backend)
            service = backend.service
            assert isinstance(service, ServiceProcess)
            url, key = str(model.inference_base_url), str(model.inference_api_key)
            work = calls(args.warmup + args.requests, args.cancel, args.seed)
            warmup, soak = work[: args.warmup], work[args.warmup :]
            mix = Counter(
                (c.protocol, "cancel" if c.cancel else "stream" if c.stream else "whole")
                for c in soak
            )
            print(
                f"{len(soak)} requests after {len(warmup)} of warmup, {args.clients} clients; "
                f"{sum(c.cancel for c in soak)} abandoned streams, "
                f"{sum(c.grammar for c in soak)} with a JSON grammar"
            )
            print("  mix: " + ", ".join(f"{p} {k} {n}" for (p, k), n in sorted(mix.items())))
            failures = await traffic(url, key, model.name, warmup, args.clients, lambda: None)
            start = await settled(service)
            peak = Reading(start.rss, start.rows, start.kv, start.prefix)

            def sample() -> None:
                now = Reading.of(service)
                peak.rss, peak.rows = max(peak.rss, now.rss), max(peak.rows, now.rows)
                peak.kv, peak.prefix = max(peak.kv, now.kv), max(peak.prefix, now.prefix)

            started = time.monotonic()
            failures += await traffic(url, key, model.name, soak, args.clients, sample)
            seconds = time.monotonic() - started
            end = await settled(service)

    print(
        f"{len(soak)} requests in {seconds:.1f} s ({len(soak) / seconds:.1f}/s), "
        f"{len(failures)} failed"
    )
    for failure in failures[:5]:
        print(f"  failure: {failure}")
    print("| | service RSS MiB | running rows | batch KV MiB | prefix cache MiB |")
    print("|---|---:|---:|---:|---:|")
    for label, reading in (
        ("start (after warmup, idle)", start),
        ("peak", peak),
        ("end (idle)", end),
    ):
        print(
            f"| {label} | {reading.rss / MIB:.1f} | {reading.rows} | {reading.kv / MIB:.1f} "
            f"| {reading.prefix / MIB:.1f} |"
        )
    grown = (end.rss - start.rss) / MIB
    print(
        f"end - start RSS: {grown:+.1f} MiB (tolerance {args.tolerance_mib:.0f} MiB); "
        f"end / start RSS: {end.rss / start.rss:.3f}x"
    )
    held = end.rows or end.kv
    print(f"rows and batch KV freed once idle: {'no' if held else 'yes'}")
    if args.quick:  # the first few hundred requests still fill bounded caches
        print("RSS not judged in --quick: its warmup is too short to reach the start level")
        back = True
    else:
        back = grown <= args.tolerance_mib
        print(f"RSS back to its start level: {'yes' if back else 'NO'}")
    if failures or held or not back:
        raise SystemExit(1)


async def settled(service: ServiceProcess) -> Reading:
    """A reading once the engine has no rows (up to 60 s) and a second has passed."""
    for _ in range(300):
        reading = await asyncio.to_thread(Reading.of, service)
        if reading.rows == 0 and reading.kv == 0:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    return await asyncio.to_thread(Reading.of, service)


def default_model() -> str:
    from art.runtime.models import DEFAULT_MODEL

    return DEFAULT_MODEL


if __name__ == "__main__":
    asyncio.run(main())
