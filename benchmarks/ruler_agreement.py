"""How often RULER ranks two rollouts the way a known-correct reward does.

The task is `examples/demo.py`'s arithmetic (its questions, system prompt and reward:
1.0 for the bare correct number, 0.5 for the correct number among other text, else 0).
Groups of rollouts are sampled from the default model, scored by RULER with the judge
named on the command line (default: the same base model on the same local endpoint),
and every pair of rollouts in a group whose true rewards differ counts as one
comparison: 1 if RULER orders the pair the same way, 0.5 if it scores them equal, 0 if
it orders them the other way. Peers on the same pairs: a random scorer (its mean over
1000 draws, 0.5 expected)
and "the shorter answer is better", a heuristic that suits this task.

    python benchmarks/ruler_agreement.py [--groups 16] [--group-size 4] [--judge MODEL]
    python benchmarks/ruler_agreement.py --quick    # a smoke setting: 1 group of 4, offline
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from support.demo import demo_module
from support.machine import machine

import art
from art.rewards import ruler_score_group

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def pairwise_agreement(true: Sequence[float], predicted: Sequence[float]) -> tuple[float, int]:
    """Credit summed over the pairs whose true rewards differ, and how many such pairs."""
    credit, pairs = 0.0, 0
    for i, j in itertools.combinations(range(len(true)), 2):
        if true[i] == true[j]:
            continue
        pairs += 1
        if predicted[i] == predicted[j]:
            credit += 0.5
        elif (predicted[i] > predicted[j]) == (true[i] > true[j]):
            credit += 1.0
    return credit, pairs


async def sample_group(
    model: art.TrainableModel, demo: ModuleType, question: tuple[int, int], size: int
) -> art.TrajectoryGroup:
    a, b = question
    messages: list[Any] = [
        {"role": "system", "content": demo.SYSTEM},
        {"role": "user", "content": f"What is {a} + {b}?"},
    ]
    completion = await model.openai_client().chat.completions.create(
        model=BASE_MODEL, messages=messages, max_tokens=20, temperature=1.0, n=size
    )
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[*messages, choice],
            reward=demo.reward(choice.message.content or "", a + b),
        )
        for choice in completion.choices
    )


async def main(arguments: argparse.Namespace) -> None:
    demo = demo_module()
    path = Path(tempfile.mkdtemp(prefix="ruler-agreement-"))
    backend = art.LocalBackend(path=str(path), in_process=True)
    model = art.TrainableModel(name="agreement", project="bench", base_model=BASE_MODEL)
    await model.register(backend)

    judge_model: str = arguments.judge or f"openai/{BASE_MODEL}"
    judge_params: dict[str, Any] = {"max_tokens": 160 * arguments.group_size}
    if arguments.judge is None:
        judge_params |= {
            "base_url": model.inference_base_url,
            "api_key": model.inference_api_key,
            "temperature": 0.0,
        }

    questions = demo.questions(seed=arguments.seed, count=arguments.groups)
    started = time.monotonic()
    groups = await asyncio.gather(
        *(sample_group(model, demo, q, arguments.group_size) for q in questions)
    )
    sampling_seconds = time.monotonic() - started

    limit = asyncio.Semaphore(arguments.concurrency)

    async def judge(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        async with limit:
            return await ruler_score_group(
                group, judge_model, judge_params, swallow_exceptions=True, cache=False
            )

    started = time.monotonic()
    judged = await asyncio.gather(*(judge(group) for group in groups))
    judging_seconds = time.monotonic() - started
    await backend.close()

    rng = random.Random(arguments.seed)
    scorers: dict[str, Callable[[art.TrajectoryGroup], list[float]]] = {
        "RULER": lambda g: [t.reward for t in g],
        "random scorer": lambda g: [rng.random() for _ in g],
        "shorter answer is better": lambda g: [
            -len(t.messages()[-1].get("content") or "") for t in g
        ],
    }
    kept = [(group, done) for group, done in zip(groups, judged, strict=True) if done]
    rows = []
    for name, scorer in scorers.items():
        credit, pairs = 0.0, 0
        for group, done in kept:
            true = [t.reward for t in group]
            predicted = scorer(done if name == "RULER" else group)
            c, p = pairwise_agreement(true, predicted)
            credit, pairs = credit + c, pairs + p
        rows.append((name, credit / pairs if pairs else float("nan"), pairs))
    # The random scorer's accuracy is its mean over many draws, not one noisy draw.
    draws = []
    for _ in range(1000):
        credit, pairs = 0.0, 0
        for group, _done in kept:
            c, p = pairwise_agreement([t.reward for t in group], scorers["random scorer"](group))
            credit, pairs = credit + c, pairs + p
        draws.append(credit / pairs if pairs else float("nan"))
    rows[1] = ("random scorer (mean of 1000 draws)", sum(draws) / len(draws), rows[1][2])

    tokens = sum(
        t.metrics.get("ruler_judge_completion_tokens", 0.0) for _, done in kept for t in done
    )
    print(f"\nmachine: {machine()}")
    print(
        f"judge: {judge_model}; {len(groups)} groups x {arguments.group_size} rollouts of "
        f"the demo's arithmetic task; {len(groups) - len(kept)} groups the judge failed on"
    )
    print(
        f"sampling {sampling_seconds:.0f}s; judging {judging_seconds:.0f}s "
        f"({judging_seconds / max(len(groups), 1):.1f}s per group, "
        f"{tokens / max(len(kept), 1):.0f} judge tokens per group)\n"
    )
    print("| scorer | pairwise ranking accuracy | pairs |")
    print("|---|---:|---:|")
    for name, accuracy, pairs in rows:
        print(f"| {name} | {accuracy:.3f} | {pairs} |")
    ruler_accuracy = rows[0][1]
    print(f"\nRULER / random scorer: {ruler_accuracy / rows[1][1]:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=16, help="groups (questions) to judge")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per group")
    parser.add_argument(
        "--judge", default=None, help="a LiteLLM model name; default: the local base model"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="judge calls at once")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="1 group of 4 rollouts, the local judge (offline)"
    )
    args = parser.parse_args()
    if args.quick:
        args.groups, args.group_size, args.concurrency, args.judge = 1, 4, 1, None
    asyncio.run(main(args))
