"""The two inference engines side by side, in one run: vLLM, transformers, plain `generate`.

For each engine, a fresh LocalBackend (model service in its own process, as users run it)
serves the default model, and the same measurements run through its OpenAI endpoint:

1. rollout throughput, completion tokens/s with 1 request at a time and with
   `--concurrency` requests in a closed loop (the prompts and settings of
   `local_backend.py`), beside Hugging Face `model.generate` on one static left-padded
   batch of the same width, the strongest plain-transformers peer;
2. GRPO steps of the demo's arithmetic task (P prompts x G rollouts through the endpoint,
   then `model.train`), seconds per step and the part spent sampling.

    python benchmarks/engines.py            # ~15 minutes on 2 cores
    python benchmarks/engines.py --quick    # a smoke setting

vLLM comes from `.venv-vllm` (`make venv-vllm`) or `ART_VLLM_PYTHON`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import local_backend as bench  # this folder's whole-backend benchmark: figures, helpers
import torch

import art
from art.local import LocalBackend
from art.runtime import models


async def measure_engine(engine: str, args: Any, demo: ModuleType) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"art-engines-{engine}-") as path:
        backend = LocalBackend(path=path)
        try:
            print(f"[{engine}] loading the model service ...", flush=True)
            model = art.TrainableModel(
                name="bench",
                project="engines",
                base_model=args.base_model,
                _internal_config=art.dev.InternalModelConfig(engine=engine),  # type: ignore[arg-type]
            )
            await model.register(backend)
            service_pid = backend._service._process.pid  # type: ignore[union-attr]
            history = Path(path) / "engines" / "models" / "bench" / "history.jsonl"
            results: dict[str, Any] = {}
            print(f"[{engine}] rollout throughput @1 ...", flush=True)
            results["@1"] = await bench.ours_throughput(model, args, 1)
            print(f"[{engine}] rollout throughput @{args.concurrency} ...", flush=True)
            results["@c"] = await bench.ours_throughput(model, args, args.concurrency)
            print(f"[{engine}] GRPO steps ...", flush=True)
            results["grpo"] = await bench.ours_grpo(model, args, demo, service_pid, history)
            return results
        finally:
            await backend.close()


def generate_peer(args: Any) -> Any:
    hf_model, tokenizer, prompt_ids = bench.generate_peer_inputs(args)
    torch.manual_seed(args.seed)
    print(f"[generate] HF generate, one batch of {args.concurrency} ...", flush=True)
    return bench.generate_throughput(hf_model, tokenizer, prompt_ids, args, args.concurrency)


async def run(args: Any) -> None:
    load = os.getloadavg()[0]
    demo = bench.demo_module()
    results = {
        engine: await measure_engine(engine, args, demo) for engine in ("vllm", "transformers")
    }
    peer = generate_peer(args)
    c = args.concurrency
    print()
    print(f"machine: {bench.machine()}; load average {load:.1f} before the run")
    print(
        f"model:   {args.base_model}, dtype {str(models.torch_dtype('auto')).removeprefix('torch.')}"
    )
    print(
        f"rollouts: temperature 1.0, max_tokens {args.max_tokens}, {args.seconds:g}s measured "
        f"after {args.warmup_seconds:g}s warmup; the engines serve the trainable model (LoRA)"
    )
    print(f"  {'':<36} {'tokens/s':>9} {'requests':>9} {'tokens/request':>15}")
    rows = [
        ("vLLM engine @1", results["vllm"]["@1"]),
        (f"vLLM engine @{c}", results["vllm"]["@c"]),
        ("transformers engine @1", results["transformers"]["@1"]),
        (f"transformers engine @{c}", results["transformers"]["@c"]),
        (f"HF generate, static batch of {c}", peer),
    ]
    for name, result in rows:
        print(
            f"  {name:<36} {result.tokens_per_s:>9.1f} {result.requests:>9d} "
            f"{result.mean_tokens:>15.1f}"
        )
    for engine in ("vllm", "transformers"):
        ratio = results[engine]["@c"].tokens_per_s / peer.tokens_per_s
        print(f"  {engine} @{c} / generate batch @{c}: {ratio:.2f}x")
    print(
        f"GRPO: {args.prompts} prompts x {args.generations} rollouts, max "
        f"{args.max_completion_tokens} tokens, {args.warmup_steps} warmup + {args.steps} timed steps"
    )
    print(f"  {'':<14} {'s/step':>8} {'sampling s':>11} {'tokens/rollout':>15} {'reward':>7}")
    for engine in ("vllm", "transformers"):
        times = results[engine]["grpo"]
        print(
            f"  {engine:<14} {times.mean:>8.2f} {statistics.fmean(times.generate_seconds):>11.2f} "
            f"{times.mean_completion_tokens:>15.1f} {times.mean_reward:>7.2f}"
        )
    ratio = results["vllm"]["grpo"].mean / results["transformers"]["grpo"].mean
    print(f"  vllm / transformers seconds per step: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parsed = parser.parse_args()
    args = bench.QUICK if parsed.quick else replace(bench.BenchArgs(), seconds=20.0, steps=2)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
