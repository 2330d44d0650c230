"""Constrained decoding (llguidance) against unconstrained sampling, in one process.

Two measurements on the embedded default model's 49k-token vocabulary:
1. Mask time: `Grammars.allowed_tokens` (llguidance's bitmask for each row, unpacked to a
   boolean row of the vocabulary) per decode step and per row, replaying the tokens of a
   valid answer to a schema with the shape RULER sends (1 row, and 32 rows).
2. Throughput: completion tokens/s of our engine sampling `--rows` sequences of one
   prompt with and without the schema's grammar, rounds alternated so load drifts hit
   both alike. The ratio constrained / unconstrained is the number that matters.

    .venv/bin/python benchmarks/structured_output.py [--rows 16] [--max-tokens 96] [--rounds 3]
    .venv/bin/python benchmarks/structured_output.py --quick    # a smoke setting
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

# Set before the Hugging Face libraries are imported: they read these on import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


from support.machine import machine

from art.runtime import models
from art.runtime.chat_format import render_prompt, rendering_for
from art.runtime.engines.base import SamplingParams
from art.runtime.engines.structured import Grammars
from art.runtime.engines.transformers.engine import TransformersEngine
from art.runtime.service.model_service import _stop_token_ids  # the engine's own stop rule

# The shape of a RULER judgement: one object per trajectory, ids, explanations, scores.
SCHEMA = {
    "type": "object",
    "properties": {
        "scores": {
            "type": "array",
            "minItems": 4,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "trajectory_id": {"type": "string", "enum": ["1", "2", "3", "4"]},
                    "explanation": {"type": "string", "maxLength": 120},
                    "score": {"type": "number", "minimum": 0, "maximum": 1},
                },
                "required": ["trajectory_id", "explanation", "score"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scores"],
    "additionalProperties": False,
}
ANSWER = (
    '{"scores": [{"trajectory_id": "1", "explanation": "Correct and short.", "score": 0.9}, '
    '{"trajectory_id": "2", "explanation": "Wrong sum, confident tone.", "score": 0.1}, '
    '{"trajectory_id": "3", "explanation": "Right answer after a detour.", "score": 0.7}, '
    '{"trajectory_id": "4", "explanation": "No answer given.", "score": 0.0}]}'
)
PROMPT = (
    "Score four answers to 'What is 2 + 3?': (1) 5. (2) 6. (3) Two plus three is five. "
    "(4) I don't know. Reply with JSON: for each, trajectory_id, explanation, score 0..1."
)


def mask_times(grammars: Grammars, tokenizer: object, vocab: int, rows: int) -> list[float]:
    """Seconds per decode step of `allowed_tokens` for `rows` rows replaying ANSWER."""
    ids: list[int] = tokenizer(ANSWER, add_special_tokens=False).input_ids  # type: ignore[operator]
    grammar = grammars.json_schema(SCHEMA)
    matchers = [grammar.matcher() for _ in range(rows)]
    times = []
    for token in ids:
        start = time.perf_counter()
        grammars.allowed_tokens(matchers, vocab)
        times.append(time.perf_counter() - start)
        for matcher in matchers:
            assert matcher.consume_token(token), matcher.get_error()
    return times


async def throughput(
    engine: TransformersEngine, prompt_ids: list[int], params: SamplingParams, rows: int
) -> tuple[float, int]:
    start = time.perf_counter()
    samples = await engine.generate(prompt_ids, params, n=rows)
    tokens = sum(len(sample.token_ids) for sample in samples)
    return tokens / (time.perf_counter() - start), tokens


async def main(args: argparse.Namespace) -> None:
    resolved = models.resolve(models.DEFAULT_MODEL)
    model, tokenizer = models.load(resolved)
    vocab = model.get_output_embeddings().weight.shape[0]
    engine = TransformersEngine(
        model,
        tokenizer,
        max_num_seqs=max(32, args.rows),
        stop_token_ids=_stop_token_ids(model, tokenizer),
    )
    grammars = engine.grammars
    grammar = grammars.json_schema(SCHEMA)
    print(f"machine: {machine()}; dtype {model.dtype}; vocabulary {vocab}")

    print("\nmask time per decode step (allowed_tokens), median over the answer's tokens:")
    for rows in (1, 32):
        times = [
            t
            for _ in range(args.mask_repeats)
            for t in mask_times(grammars, tokenizer, vocab, rows)
        ]
        median = statistics.median(times) * 1000
        print(f"  {rows:>2} rows: {median:6.2f} ms/step  {median / rows:6.3f} ms/token")

    messages = [{"role": "user", "content": PROMPT}]
    text = render_prompt(tokenizer, messages, None, rendering_for(tokenizer))
    prompt_ids = tokenizer(text, add_special_tokens=False).input_ids
    plain = SamplingParams(max_tokens=args.max_tokens, temperature=1.0)
    constrained = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, grammar=grammar)
    await throughput(engine, prompt_ids, plain, 2)  # warm up
    results: dict[str, list[tuple[float, int]]] = {"unconstrained": [], "constrained": []}
    for _ in range(args.rounds):
        results["unconstrained"].append(await throughput(engine, prompt_ids, plain, args.rows))
        results["constrained"].append(await throughput(engine, prompt_ids, constrained, args.rows))
    print(f"\nthroughput, {args.rows} rows of one prompt, temperature 1, max {args.max_tokens}:")
    rates = {}
    for name, runs in results.items():
        rates[name] = statistics.median(rate for rate, _ in runs)
        tokens = statistics.mean(count for _, count in runs) / args.rows
        print(f"  {name:<14} {rates[name]:7.1f} tokens/s  ({tokens:.0f} tokens/row)")
    ratio = rates["constrained"] / rates["unconstrained"]
    print(f"  constrained / unconstrained: {ratio:.2f}x")
    engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=16, help="sequences sampled together")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each")
    parser.add_argument("--quick", action="store_true", help="2 rows, 8 tokens, 1 round")
    args = parser.parse_args()
    args.mask_repeats = 3  # replays of the answer per mask-time measurement
    if args.quick:
        args.rows, args.max_tokens, args.rounds, args.mask_repeats = 2, 8, 1, 1
    asyncio.run(main(args))
