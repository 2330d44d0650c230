"""Static-buffer decode steps (`decode_graphs.StaticDecoder`) give the lean step's logits.

On a CPU the static step runs without a CUDA graph (`graphs=False`): everything but the
capture is held here to transformers' own forward pass: rows padded to a bucket, the
new keys written at the cache's next position, the position room grown to a power of
two, left padding and finished rows masked. `test_cuda.py` runs the captured graphs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import warnings
from typing import Any

import pytest
import torch
from helpers import tiny_causal_lm, tokenizer_dir

from art.runtime.engines.base import SamplingParams
from art.runtime.engines.structured import Grammars
from art.runtime.engines.transformers import kv_cache
from art.runtime.engines.transformers.batch import BatchDecoder
from art.runtime.engines.transformers.decode_graphs import StaticDecoder, bucket, position_room
from art.runtime.engines.transformers.engine import TransformersEngine
from art.runtime.engines.transformers.lean_decode import LeanDecoder
from art.runtime.engines.transformers.merged import MergedCopy
from art.runtime.engines.transformers.prefix_cache import PrefixCache
from art.runtime.engines.transformers.rows import Request, RowStepper

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")


def test_buckets_and_position_room_are_powers_of_two() -> None:
    assert [bucket(rows) for rows in (1, 2, 3, 4, 5, 63, 64, 65)] == [1, 2, 4, 4, 8, 64, 64, 128]
    assert [position_room(n) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]


def check_static_steps(model: Any, decoder: StaticDecoder, steps: int, atol: float = 1e-4) -> None:
    """Three rows (left padding 0, 3 and 5) prefilled by transformers, then `steps` static
    steps; halfway the first row leaves, the last takes its place, and the 3 positions of
    padding neither remaining row attends to are trimmed off the cache (as `batch.keep`
    does), so the room that grows past 256 afterwards is reallocated from a trimmed cache.
    Each row's logits against the full forward pass."""
    device = model.device
    ids = torch.randint(1, 300, (3, 9), generator=torch.Generator().manual_seed(1)).to(device)
    attention = torch.ones(3, 9, dtype=torch.long, device=device)
    attention[1, :3] = 0
    attention[2, :5] = 0
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = kv_cache.new_cache()
    sequences = [ids[0].tolist(), ids[1, 3:].tolist(), ids[2, 5:].tolist()]
    rows = [0, 1, 2]
    with torch.inference_mode():
        model(
            input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache
        )
        next_position = positions[:, -1:] + 1
        for step in range(steps):
            if step == steps // 2:  # the first row leaves: the last takes its place
                kv_cache.keep_rows(cache, [2, 1])
                rows = [2, 1]
                keep = torch.tensor([2, 1], device=device)
                attention, next_position = attention[keep], next_position[keep]
                kv_cache.trim_left(cache, 3)
                attention = attention[:, 3:]
            tokens = torch.tensor([(11 + 7 * step + 13 * row) % 300 for row in rows], device=device)
            attention = torch.cat([attention, attention.new_ones(len(rows), 1)], dim=1)
            logits = decoder.step(tokens, next_position, attention, cache)
            next_position = next_position + 1
            # Padding rows write finite keys and values into the spare rows: a joining row
            # could take those rows, its padding masked, and 0 x NaN is NaN.
            for layer in cache.layers:
                assert isinstance(layer, kv_cache.GrowingLayer)
                assert all(bool(buffer.isfinite().all()) for buffer in layer.buffers()), step
            for place, row in enumerate(rows):
                sequences[row].append(int(tokens[place]))
            # Against the full pass at the first steps, around the row leaving and the room
            # growing past 256 (the 9-token prompt's position 256), and every 13th step: a
            # wrong write into the cache would show at every step after it.
            near = (0, 1, 2, steps // 2 - 1, steps // 2, steps // 2 + 1, steps - 1)
            if step not in near and step % 13 and abs(step + 9 - 256) > 2:
                continue
            for place, row in enumerate(rows):
                full = model(torch.tensor([sequences[row]], device=device)).logits[0, -1].float()
                assert torch.allclose(logits[place], full, atol=atol), (
                    step,
                    row,
                    (logits[place] - full).abs().max(),
                )


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_static_steps_give_transformers_logits(model_type: str) -> None:
    """3 rows run at a bucket of 4 (a padding row) in 256 positions of room, then 2 at 2;
    past 256 positions the room grows to 512."""
    model = tiny_causal_lm(model_type, max_positions=512)
    lean = LeanDecoder.of(model)
    assert lean is not None
    decoder = StaticDecoder(lean, graphs=False)
    check_static_steps(model, decoder, steps=260)
    # One static step per bucket and room: 4 rows at 256, 2 at 256, 2 at 512.
    assert decoder.steps_kept == 3


def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir())


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.cuda
@needs_cuda
def test_graphed_steps_on_cuda_give_transformers_logits(model_type: str) -> None:
    """The same steps as on the CPU, each bucket's step captured once and replayed."""
    model = tiny_causal_lm(model_type, device="cuda", max_positions=512)
    lean = LeanDecoder.of(model)
    assert lean is not None
    decoder = StaticDecoder(lean, graphs=True)
    check_static_steps(model, decoder, steps=260, atol=1e-3)
    assert decoder.captured == 3


def _requests(tokenizer: Any, count: int) -> list[Request]:
    """`count` requests of different prompt lengths and settings: greedy, seeded, nucleus,
    top logprobs, plain."""
    settings = [
        SamplingParams(max_tokens=64),
        SamplingParams(max_tokens=64, temperature=0),
        SamplingParams(max_tokens=64, seed=7),
        SamplingParams(max_tokens=64, top_p=0.9),
        SamplingParams(max_tokens=64, temperature=0.7, top_logprobs=3),
    ]
    return [
        Request(
            [(5 + 3 * i + j) % 300 for j in range(4 + i % 7)],
            settings[i % len(settings)],
            1,
            None,
            None,
            concurrent.futures.Future(),
        )
        for i in range(count)
    ]


def _is_sync(warning: warnings.WarningMessage) -> bool:
    # The message torch's sync debug mode gives each synchronising operation.
    return "called a synchronizing CUDA operation" in str(warning.message)


@pytest.mark.cuda
@needs_cuda
def test_a_decode_step_on_cuda_makes_one_device_to_host_transfer() -> None:
    """16 rows of mixed settings: after the first steps (which capture), each step waits
    for the device once, for the one transfer of its tokens and logprobs."""
    model = tiny_causal_lm("llama", device="cuda", max_positions=512)
    lean = LeanDecoder.of(model)
    assert lean is not None
    tokenizer = _tokenizer()
    stepper = RowStepper(tokenizer, set(), Grammars(tokenizer, set()))
    decoder = BatchDecoder(stepper, 0, PrefixCache(), StaticDecoder(lean, graphs=True))
    decoder.model = model
    with torch.inference_mode():
        batch = decoder.prefill(_requests(tokenizer, 16), model.device)
        assert batch is not None
        for _ in range(3):
            batch = decoder.step(batch)
        places: list[list[str]] = []  # where each step waited for the device
        for _ in range(10):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    batch = decoder.step(batch)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            places.append([f"{w.filename}:{w.lineno}" for w in caught if _is_sync(w)])
    assert len(batch.rows) == 16
    if [len(found) for found in places] != [1] * 10:
        pytest.fail(f"where each step waited for the device: {places}")


@pytest.mark.cuda
@needs_cuda
def test_the_engine_on_cuda_serves_the_full_passes_logprobs_through_graphs() -> None:
    """Requests joining and leaving a running batch (different prompts, lengths, `n`): each
    sampled token's logprob is the trainer's full forward pass's."""
    model = tiny_causal_lm("llama", device="cuda", max_positions=512)
    tokenizer = _tokenizer()
    plain = copy.deepcopy(model)
    engine = TransformersEngine(
        model, tokenizer, max_num_seqs=16, stop_token_ids=set(), merged=MergedCopy(model, plain)
    )
    requests = _requests(tokenizer, 10)

    async def run() -> list[Any]:
        return await asyncio.gather(
            *(
                engine.generate(
                    r.prompt_ids,
                    SamplingParams(max_tokens=8 + 5 * i, temperature=1.0),
                    n=1 + i % 2,
                )
                for i, r in enumerate(requests)
            )
        )

    try:
        answers = asyncio.run(run())
    finally:
        engine.close()
    assert engine.decode_graphs_captured > 0
    for i, (request, samples) in enumerate(zip(requests, answers, strict=True)):
        assert len(samples) == 1 + i % 2
        for sample in samples:
            assert len(sample.token_ids) == 8 + 5 * i
            ids = torch.tensor([request.prompt_ids + sample.token_ids], device="cuda")
            with torch.no_grad():
                logits = model(ids).logits[0, len(request.prompt_ids) - 1 : -1].float()
            full = torch.log_softmax(logits, -1).gather(1, ids[0, len(request.prompt_ids) :, None])
            served = torch.tensor(sample.logprobs, device="cuda")
            assert torch.allclose(served, full.squeeze(1), atol=1e-3), (served - full).abs().max()
