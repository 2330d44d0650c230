"""Rollout throughput on a CUDA GPU: our engine against Hugging Face `generate`, one run.

R rows x T new tokens from a randomly initialised model of Llama-3.2-1B's shape (bf16,
SmolLM2's vocabulary and tokenizer), temperature 1 over the whole vocabulary, no stop
token, the same chat prompts (of different lengths) on every side:

- generate: `model.generate` on one left-padded batch of all R prompts (`do_sample=True,
  top_k=0`, `min_new_tokens` = `max_new_tokens`), transformers' dynamic cache;
- engine: our transformers engine as a GPU user's LocalBackend builds it (the sampling
  copy, lean decode steps replayed from CUDA graphs), R concurrent `generate` requests;
- endpoint (`--endpoint`): `LocalBackend(in_process=True)` serving the same model saved to
  disk, R concurrent chat completions through its OpenAI endpoint (rows may stop early at
  an end-of-turn token: tokens/s counts the tokens each returned).

Then where a decode step's time goes, at R rows: milliseconds per step of the graphed
static step, the same with the fused attention kernel a CPU's step uses (its first GPU
run: a failure is printed), the step run eagerly, and transformers' forward pass with our
cache.

Each of ours runs once to warm up (graph captures, cuBLAS's heuristics) and once measured;
`generate` is warmed up on a small batch first.

    python benchmarks/sampler_cuda.py                   # 64 and 256 rows, 128 tokens
    python benchmarks/sampler_cuda.py --endpoint        # and through LocalBackend
    python benchmarks/sampler_cuda.py --quick           # a smoke setting: 8 rows, 16 tokens
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import copy
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.machine import machine
from train_memory_cuda import random_model

from art.runtime.engines.base import SamplingParams
from art.runtime.engines.structured import Grammars
from art.runtime.engines.transformers import kv_cache
from art.runtime.engines.transformers.batch import BatchDecoder
from art.runtime.engines.transformers.decode_graphs import StaticDecoder
from art.runtime.engines.transformers.engine import TransformersEngine
from art.runtime.engines.transformers.lean_decode import LeanDecoder
from art.runtime.engines.transformers.merged import MergedCopy
from art.runtime.engines.transformers.prefix_cache import PrefixCache
from art.runtime.engines.transformers.rows import Request, RowStepper

TOPICS = ["the sea", "a city at night", "mountains", "a library", "rain", "trains", "bread"]


def messages(row: int) -> list[dict[str, str]]:
    topic = TOPICS[row % len(TOPICS)]
    return [{"role": "user", "content": f"Task {row}: write {1 + row % 5} lines about {topic}."}]


def prompts(tokenizer: Any, rows: int) -> list[list[int]]:
    return [
        list(
            tokenizer.apply_chat_template(
                messages(row), add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        for row in range(rows)
    ]


def seconds(work: Any) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    work()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def with_generate(model: Any, tokenizer: Any, ids: list[list[int]], tokens: int) -> float:
    """Tokens/s of `model.generate` on one left-padded batch of `ids`."""
    longest = max(len(p) for p in ids)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (longest - len(p)) + p for p in ids], device="cuda")
    attention = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in ids], device="cuda")
    out: list[Any] = []

    def run() -> None:
        with torch.inference_mode():
            out.append(
                model.generate(
                    input_ids=input_ids,
                    attention_mask=attention,
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=tokens,
                    min_new_tokens=tokens,
                    pad_token_id=pad,
                )
            )

    elapsed = seconds(run)
    new = out[0].shape[1] - longest
    assert new == tokens, new
    return len(ids) * tokens / elapsed


def with_engine(engine: TransformersEngine, ids: list[list[int]], tokens: int) -> float:
    """Tokens/s of `len(ids)` concurrent requests to `engine`."""

    async def run() -> int:
        params = SamplingParams(max_tokens=tokens, temperature=1.0)
        answers = await asyncio.gather(*(engine.generate(p, params) for p in ids))
        return sum(len(sample.token_ids) for samples in answers for sample in samples)

    started = time.perf_counter()
    produced = asyncio.run(run())
    elapsed = time.perf_counter() - started
    assert produced == len(ids) * tokens, produced
    return produced / elapsed


def step_milliseconds(
    model: Any,
    lean: LeanDecoder,
    fused: LeanDecoder,
    tokenizer: Any,
    ids: list[list[int]],
    steps: int,
) -> dict[str, float | str]:
    """Milliseconds per decode step at len(ids) rows: the engine's whole step (sampling,
    the rows' bookkeeping, the graphed model step), the graphed model step alone, the same
    run eagerly, transformers' forward pass, and the graphed step with the fused attention
    kernel a CPU's step uses (`fused`; never run on a GPU before: a failure is printed,
    not raised)."""
    timings: dict[str, float | str] = {
        "engine step": _engine_step(model, lean, tokenizer, ids, steps),
        "graphed static step": _time_steps(
            model, StaticDecoder(lean, graphs=True).step, ids, steps
        ),
    }
    eager = StaticDecoder(lean, graphs=False).step
    timings["eager static step"] = _time_steps(model, eager, ids, steps)
    timings["transformers forward"] = _time_steps(model, None, ids, steps)
    # Last: a capture that fails may leave the device unusable for what would follow.
    try:
        graphed_fused = StaticDecoder(fused, graphs=True).step
        timings["graphed static step, fused attention"] = _time_steps(
            model, graphed_fused, ids, steps
        )
    except Exception as error:  # a kernel that cannot be captured is a finding, not a stop
        timings["graphed static step, fused attention"] = f"failed ({type(error).__name__})"
    return timings


def _engine_step(
    model: Any, lean: LeanDecoder, tokenizer: Any, ids: list[list[int]], steps: int
) -> float:
    stepper = RowStepper(tokenizer, set(), Grammars(tokenizer, set()))
    decoder = BatchDecoder(stepper, 0, PrefixCache(), StaticDecoder(lean, graphs=True))
    decoder.model = model
    params = SamplingParams(max_tokens=steps + 10)
    requests = [Request(p, params, 1, None, None, concurrent.futures.Future()) for p in ids]
    with torch.inference_mode():
        batch = decoder.prefill(requests, model.device)
        assert batch is not None
        for _ in range(3):
            batch = decoder.step(batch)

        def many() -> None:
            nonlocal batch
            for _ in range(steps):
                assert batch is not None
                batch = decoder.step(batch)

        return seconds(many) / steps * 1e3


def _time_steps(model: Any, step: Any, ids: list[list[int]], steps: int) -> float:
    rows, longest = len(ids), max(len(p) for p in ids)
    input_ids = torch.randint(100, 1000, (rows, longest), device="cuda")
    tokens = torch.randint(100, 1000, (rows,), device="cuda")
    cache = kv_cache.new_cache()
    mask = torch.ones_like(input_ids)
    position = torch.full((rows, 1), longest, device="cuda")

    def one() -> None:
        nonlocal mask, position
        mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
        if step is None:
            model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=position,
                past_key_values=cache,
            )
        else:
            step(tokens, position, mask, cache)
        position = position + 1

    with torch.inference_mode():
        model(input_ids=input_ids, attention_mask=mask, past_key_values=cache)
        for _ in range(3):
            one()

        def many() -> None:
            for _ in range(steps):
                one()

        return seconds(many) / steps * 1e3


async def with_endpoint(directory: Path, rows: int, tokens: int) -> float:
    """Tokens/s of `rows` concurrent chat completions through LocalBackend's endpoint."""
    import art
    from art.local import LocalBackend

    backend = LocalBackend(path=directory / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="sampler-cuda",
            project="bench",
            base_model=str(directory / "model"),
            _internal_config=art.dev.InternalModelConfig(
                engine="transformers", engine_args=art.dev.EngineArgs(max_num_seqs=max(rows, 64))
            ),
        )
        await model.register(backend)
        client = model.openai_client()

        async def one(row: int) -> int:
            completion = await client.chat.completions.create(
                model=model.get_inference_name(),
                messages=messages(row),  # type: ignore[arg-type]
                max_tokens=tokens,
                temperature=1.0,
            )
            assert completion.usage is not None
            return completion.usage.completion_tokens

        await asyncio.gather(*(one(row) for row in range(rows)))  # warm-up
        started = time.perf_counter()
        produced = sum(await asyncio.gather(*(one(row) for row in range(rows))))
        return produced / (time.perf_counter() - started)
    finally:
        await backend.close()


def row_counts(text: str) -> list[int]:
    """`--rows`: comma-separated positive row counts."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"--rows takes positive counts like 64,256, not {text!r}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_counts, default=[64, 256], help="e.g. 64,256")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--endpoint", action="store_true", help="also through LocalBackend")
    parser.add_argument("--quick", action="store_true", help="8 rows, 16 tokens")
    parser.add_argument(
        "--tokenizer",
        default=os.environ.get("ART_TOKENIZER_DIR"),
        help="a tokenizer directory (default: $ART_TOKENIZER_DIR, else the default model's)",
    )
    args = parser.parse_args()
    if args.tokens < 1:
        parser.error(f"--tokens must be at least 1, got {args.tokens}")
    if args.quick:
        args.rows, args.tokens = [8], 16
    if not torch.cuda.is_available():
        sys.exit("sampler_cuda.py needs a CUDA GPU")
    from transformers import AutoTokenizer

    if args.tokenizer is None:
        from art.runtime import models

        args.tokenizer = str(models.default_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    torch.manual_seed(0)
    model = random_model(len(tokenizer)).eval().requires_grad_(False)
    print(
        f"machine: {machine()}; model: random, Llama-3.2-1B decoder shape, vocab "
        f"{len(tokenizer)}, bf16; {args.tokens} new tokens a row, temperature 1, no stop"
    )
    plain = copy.deepcopy(model)
    engine = TransformersEngine(
        model,
        tokenizer,
        max_num_seqs=max(args.rows),
        stop_token_ids=set(),
        merged=MergedCopy(model, plain),
    )
    lean = LeanDecoder.of(plain)  # for the step timings (fuses its own copy of the projections)
    fused = LeanDecoder.of(plain, attention="fused")
    assert lean is not None
    assert fused is not None
    with_generate(model, tokenizer, prompts(tokenizer, 4), 8)  # CUDA and cuBLAS warm up
    try:
        for rows in args.rows:
            ids = prompts(tokenizer, rows)
            hf = with_generate(model, tokenizer, ids, args.tokens)
            cold = with_engine(engine, ids, args.tokens)
            ours = with_engine(engine, ids, args.tokens)  # the prompts seen before
            print(
                f"{rows} rows: generate {hf:,.0f} tok/s; ours (engine) {ours:,.0f} tok/s "
                f"(first run, graphs captured: {cold:,.0f}); ours / generate {ours / hf:.2f}x "
                f"(first run {cold / hf:.2f}x); graphs captured so far "
                f"{engine.decode_graphs_captured}",
                flush=True,
            )
            parts = step_milliseconds(plain, lean, fused, tokenizer, ids, steps=20)
            print(
                f"{rows} rows, ms per decode step: "
                + "; ".join(
                    f"{name} {ms:.2f}" if isinstance(ms, float) else f"{name} {ms}"
                    for name, ms in parts.items()
                ),
                flush=True,
            )
    finally:
        engine.close()
    if args.endpoint:
        with tempfile.TemporaryDirectory(prefix="sampler-cuda-") as path:
            directory = Path(path)
            model.save_pretrained(directory / "model")
            tokenizer.save_pretrained(directory / "model")
            del model, plain, engine, lean
            torch.cuda.empty_cache()
            for rows in args.rows:
                rate = asyncio.run(with_endpoint(directory, rows, args.tokens))
                print(f"{rows} rows: ours (endpoint) {rate:,.0f} tok/s", flush=True)


if __name__ == "__main__":
    main()
