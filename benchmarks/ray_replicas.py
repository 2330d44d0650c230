"""Rollout throughput of RayBackend with 1 and 2 inference replicas, beside LocalBackend.

The same closed loop for each: `--concurrency` rollouts at a time through the model's own
OpenAI client (`model.openai_client()`), each asking for `--max-tokens` tokens of an
open-ended prompt, counted as completion tokens per second over `--seconds` after
`--warmup-seconds`. The peer is the in-process LocalBackend (one transformers engine on
this machine); the ratio that matters is 2 replicas / 1 replica.

    python benchmarks/ray_replicas.py            # ~6 minutes on 2 cores
    python benchmarks/ray_replicas.py --quick    # a smoke setting, numbers not worth keeping

A local Ray cluster is started (`--cluster-cpus` logical CPUs); each replica reserves one
CPU, so Ray gives its process one OpenMP thread, while LocalBackend's engine uses torch's
default (all cores). On a 2-core machine two replicas can at best double one replica's
single thread, and share the cores with the driver's HTTP front and the other jobs.
On a busy machine run it with `OMP_NUM_THREADS=1`: LocalBackend's torch threads otherwise
spin against the other jobs (0 tokens/s in a 30 s window here, load average 3), and with
it every engine decodes on one thread, which makes the three rows equal work per engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

from support.machine import machine

import art
from art.backends.ray import RayBackend, RayConfig
from art.local import LocalBackend

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a rainbow forms.",
    "Describe your ideal weekend in detail.",
    "Give me a recipe for pancakes.",
    "Tell me about the history of the bicycle.",
    "Write a letter to a friend who moved away.",
    "Describe a walk through a forest in autumn.",
    "Explain why the sky is blue to a child.",
]


async def closed_loop(
    model: art.TrainableModel, concurrency: int, max_tokens: int, warmup: float, seconds: float
) -> float:
    """Completion tokens per second of requests finished inside the timed window."""
    client = model.openai_client()
    start = time.monotonic()
    window = (start + warmup, start + warmup + seconds)
    tokens = 0

    async def worker(offset: int) -> None:
        nonlocal tokens
        i = offset
        while time.monotonic() < window[1]:
            completion = await client.chat.completions.create(
                model=model.get_inference_name(),
                messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                max_tokens=max_tokens,
            )
            i += concurrency
            if window[0] <= time.monotonic() <= window[1] and completion.usage is not None:
                tokens += completion.usage.completion_tokens

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return tokens / seconds


async def measure(
    name: str, make: Callable[[str], Any], args: argparse.Namespace
) -> tuple[str, float]:
    with tempfile.TemporaryDirectory() as path:
        backend = make(path)
        model = art.TrainableModel(name="bench", project="ray", base_model=BASE)
        loaded = time.monotonic()
        await model.register(backend)
        print(f"{name}: registered in {time.monotonic() - loaded:.0f} s", flush=True)
        try:
            rate = await closed_loop(
                model, args.concurrency, args.max_tokens, args.warmup_seconds, args.seconds
            )
        finally:
            await backend.close()
    print(f"{name}: {rate:.1f} tokens/s", flush=True)
    return name, rate


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup-seconds", type=float, default=10.0)
    parser.add_argument("--cluster-cpus", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="3 s windows, 2 workers, 4 tokens")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.warmup_seconds, args.max_tokens = 3.0, 0.0, 4
        args.concurrency = 2
    import ray

    print(f"machine: {machine()}; ray {ray.__version__}")
    runs: list[tuple[str, Callable[[str], Any]]] = [
        # Measured before the cluster starts, so Ray's own processes are not beside it.
        ("LocalBackend (in process)", lambda path: LocalBackend(path=path, in_process=True)),
        *(
            (
                f"RayBackend, {n} replica{'s' if n > 1 else ''}",
                lambda path, n=n: RayBackend(
                    config=RayConfig(replicas=n, trainer_workers=1), path=path
                ),
            )
            for n in (1, 2)
        ),
    ]
    results: dict[str, float] = {}
    for name, make in runs:
        if name.startswith("RayBackend") and not ray.is_initialized():
            ray.init(num_cpus=args.cluster_cpus, include_dashboard=False, log_to_driver=False)
        key, rate = await measure(name, make, args)
        results[key] = rate
    ray.shutdown()
    one, two = results["RayBackend, 1 replica"], results["RayBackend, 2 replicas"]
    local = results["LocalBackend (in process)"]
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")
    print(f"| rollouts (concurrency {args.concurrency}, max_tokens {args.max_tokens}) | tokens/s |")
    print("|---|---:|")
    for name, rate in results.items():
        print(f"| {name} | {rate:.1f} |")
    # A window in which no request finished (a busy machine, a short --quick window) has no rate.
    print(f"| **2 replicas / 1 replica** | **{_ratio(two, one)}** |")
    print(f"| 2 replicas / LocalBackend | {_ratio(two, local)} |")


def _ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}x" if denominator else "n/a (no tokens in its window)"


if __name__ == "__main__":
    asyncio.run(main())
