"""How often RULER ranks two rollouts the way a hand-given score does, beside a pointwise
judge, a random scorer and a length heuristic, on two task sets.

The groups are `support/ruler_groups.py`'s, written and scored by hand: the demo's
arithmetic (16 groups) and an agent with tools (12 groups: weather, order status,
currency), four rollouts each. Every pair of rollouts in a group whose hand scores differ
is one comparison: 1 if the scorer orders the pair the same way, 0.5 if it scores them
equal, 0 if it orders them the other way. The interval is a 95% bootstrap over groups.

Scorers, on the same pairs:
- RULER: one judge call per group (`art.rewards.ruler_score_group`, our prompt);
- pointwise: the same judge, each rollout alone, asked for a score from 0 to 1 under a
  JSON schema: the control that tells the judge's skill from RULER's way of asking;
- a random scorer (mean of 1000 draws, 0.5 expected) and "shorter is better".

Both judge scorers grade by RULER's default rubric, or with `--rubric task` by each task
set's own (`support/ruler_groups.py`: the task's preferences in words, no answers in them).

The judge: `--judge local` is `support/local_judge.py`'s Qwen2.5 Coder 1.5B on llama.cpp
(`make judge`); `--judge MODEL` any LiteLLM model (`--judge-base-url` for an
OpenAI-compatible endpoint); none, the default model on a LocalBackend in this process.

    python benchmarks/ruler_agreement.py --judge local [--rubric task] [--show]
    python benchmarks/ruler_agreement.py --quick    # a smoke setting: 1 group of 2 of each, offline
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from support import local_judge
from support.agreement import accuracy_and_interval, pairwise_agreement
from support.machine import machine
from support.ruler_groups import (
    ARITHMETIC_RUBRIC,
    TOOL_RUBRIC,
    ScoredGroup,
    arithmetic_groups,
    tool_groups,
)

import art
from art.ruler.judge import judge as ruler_judge
from art.ruler.prompt import DEFAULT_RUBRIC, render_message

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass
class Judged:
    """One scorer's scores for each group (None where the judge failed on it)."""

    scores: list[list[float] | None] = field(default_factory=list)
    seconds: float = 0.0
    completion_tokens: float = 0.0
    notes: list[str] = field(default_factory=list)  # the judge's explanations, for --show


async def ruler_scores(
    groups: Sequence[ScoredGroup],
    judge_model: str,
    params: dict[str, Any],
    concurrency: int,
    rubric: str,
) -> Judged:
    limit = asyncio.Semaphore(concurrency)
    judged = Judged()

    async def one(group: ScoredGroup) -> tuple[list[float] | None, float, str]:
        async with limit:
            try:
                done = await ruler_judge(
                    group.rollouts, judge_model, params, rubric,
                    tools=group.tools, cache=False, debug=False,
                )  # fmt: skip
            except art.JudgeError as error:
                return None, 0.0, f"judge failed: {error}"
        notes = "; ".join(f"{s.score:g} ({s.explanation})" for s in done.scores)
        return [s.score for s in done.scores], done.completion_tokens, notes

    started = time.monotonic()
    results = await asyncio.gather(*(one(group) for group in groups))
    judged.seconds = time.monotonic() - started
    for scores, tokens, notes in results:
        judged.scores.append(scores)
        judged.completion_tokens += tokens
        judged.notes.append(notes)
    return judged


_POINTWISE = """\
You grade one attempt by an AI agent at the task in its messages. Give it a score from 0 \
(fails the task) to 1 (does the task fully and directly), by this rubric:
{rubric}

Answer with JSON only: {{"explanation": ..., "score": ...}}."""

_POINTWISE_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "score",
        "schema": {
            "type": "object",
            "properties": {
                "explanation": {"type": "string", "maxLength": 120},
                # As RULER's: steps of 0.01 stop a small model writing digits without end.
                "score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
            },
            "required": ["explanation", "score"],
            "additionalProperties": False,
        },
    },
}


async def pointwise_scores(
    groups: Sequence[ScoredGroup],
    judge_model: str,
    params: dict[str, Any],
    concurrency: int,
    rubric: str,
) -> Judged:
    """The control: the same judge asked about each rollout alone."""
    import litellm

    limit = asyncio.Semaphore(concurrency)
    judged = Judged()
    system = _POINTWISE.format(rubric=rubric)

    async def one(rollout: list[dict[str, Any]], tools: Any) -> tuple[float | None, float]:
        shown = "\n\n".join(render_message(m) for m in rollout)  # type: ignore[arg-type]
        if tools:
            names = ", ".join(t["function"]["name"] for t in tools)
            shown = f"<tools>{names}</tools>\n\n{shown}"
        async with limit:
            response = await litellm.acompletion(
                model=judge_model,
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": shown},
                ],
                response_format=_POINTWISE_SCHEMA,
                **(params | {"max_tokens": 160}),
            )
        tokens = float(getattr(response.usage, "completion_tokens", 0) or 0)
        content = response.choices[0].message.content
        try:
            score = float(json.loads(content)["score"])
        except (ValueError, KeyError, TypeError):
            print(f"  pointwise answer not read: {content!r}", flush=True)
            return None, tokens
        return score, tokens

    started = time.monotonic()
    for group in groups:
        results = await asyncio.gather(*(one(r, group.tools) for r in group.rollouts))
        scores = [s for s, _ in results]
        judged.scores.append(None if None in scores else [float(s) for s in scores])  # type: ignore[arg-type]
        judged.completion_tokens += sum(t for _, t in results)
        judged.notes.append(" ".join(f"{s}" for s in scores))
    judged.seconds = time.monotonic() - started
    return judged


def _length(rollout: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(m)) for m in rollout[2:])


@contextlib.asynccontextmanager
async def judge_endpoint(
    arguments: argparse.Namespace,
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The judge's LiteLLM name and parameters, served for as long as the block runs (the
    default model on a LocalBackend in this process where no judge is named)."""
    backend = None
    if arguments.judge is None:
        backend = art.LocalBackend(
            path=tempfile.mkdtemp(prefix="ruler-agreement-"), in_process=True
        )
    try:
        async with local_judge.judge_endpoint(
            arguments.judge,
            backend=backend,
            base_model=BASE_MODEL,
            local_model=arguments.local_model,
            base_url=arguments.judge_base_url,
            slots=arguments.concurrency,
        ) as endpoint:
            yield endpoint
    finally:
        if backend is not None:
            await backend.close()


async def main(arguments: argparse.Namespace) -> None:
    # Each task set's groups and the rubric they are graded by.
    made = {
        "arithmetic (the demo's task)": (
            arithmetic_groups(arguments.arithmetic_groups),
            ARITHMETIC_RUBRIC,
        ),
        "tool use (weather, orders, currency)": (tool_groups(arguments.tool_groups), TOOL_RUBRIC),
    }
    task_sets = {
        name: [group.first(arguments.rollouts) for group in groups]
        for name, (groups, _) in made.items()
        if groups
    }
    rubrics = {
        name: DEFAULT_RUBRIC if arguments.rubric == "default" else rubric
        for name, (_, rubric) in made.items()
    }
    print(f"machine: {machine()}", flush=True)
    async with judge_endpoint(arguments) as (judge_model, params):
        params["max_tokens"] = 160 * arguments.rollouts + 160  # the analysis, then entries
        print(f"judge: {judge_model}", flush=True)
        results: dict[str, dict[str, Judged]] = {}
        for name, groups in task_sets.items():
            rubric = rubrics[name]
            results[name] = {
                "RULER": await ruler_scores(
                    groups, judge_model, params, arguments.concurrency, rubric
                ),
                "pointwise (same judge)": await pointwise_scores(
                    groups, judge_model, params, arguments.concurrency, rubric
                ),
            }
            print(f"  {name}: judged", flush=True)

    for name, groups in task_sets.items():
        judged = results[name]
        rng = random.Random(arguments.seed)
        scorers: dict[str, Callable[[int, ScoredGroup], list[float] | None]] = {
            "RULER": lambda i, g, judged=judged: judged["RULER"].scores[i],
            "pointwise (same judge)": (
                lambda i, g, judged=judged: judged["pointwise (same judge)"].scores[i]
            ),
            "shorter is better": lambda i, g: [-_length(r) for r in g.rollouts],
        }
        print(
            f"\n### {name}: {len(groups)} groups of {arguments.rollouts}, hand-scored; "
            f"{arguments.rubric} rubric\n"
        )
        print("| scorer | pairwise accuracy | 95% interval | pairs | groups failed |")
        print("|---|---:|---:|---:|---:|")
        accuracy: dict[str, float] = {}
        for scorer_name, scorer in scorers.items():
            per_group = []
            failed = 0
            for index, group in enumerate(groups):
                predicted = scorer(index, group)
                if predicted is None:
                    failed += 1
                    continue
                per_group.append(pairwise_agreement(group.scores, predicted))
            value, low, high, pairs = accuracy_and_interval(per_group)
            accuracy[scorer_name] = value
            print(f"| {scorer_name} | {value:.3f} | {low:.2f}-{high:.2f} | {pairs} | {failed} |")
        draws = []
        for _ in range(1000):
            per_group = [
                pairwise_agreement(g.scores, [rng.random() for _ in g.rollouts]) for g in groups
            ]
            draws.append(sum(c for c, _ in per_group) / sum(p for _, p in per_group))
        random_mean = statistics.fmean(draws)
        print(f"| random scorer (mean of 1000 draws) | {random_mean:.3f} | | | |")
        for scorer_name in ("RULER", "pointwise (same judge)"):
            done = judged[scorer_name]
            print(
                f"\n{scorer_name}: {done.seconds / len(groups):.1f}s and "
                f"{done.completion_tokens / len(groups):.0f} judge tokens per group"
            )
        print(f"RULER / random scorer: {accuracy['RULER'] / random_mean:.2f}x")
        if arguments.show:
            for index, group in enumerate(groups):
                print(f"\n{group.task} #{index}: hand {group.scores}")
                for rollout in group.rollouts:
                    print(f"  - {json.dumps(rollout[-1].get('content'))[:90]}")
                print(f"  RULER: {judged['RULER'].notes[index]}")
                print(f"  pointwise: {judged['pointwise (same judge)'].notes[index]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arithmetic-groups", type=int, default=16)
    parser.add_argument("--tool-groups", type=int, default=12)
    parser.add_argument("--rollouts", type=int, default=4, help="rollouts per group, 2 to 4")
    parser.add_argument(
        "--judge",
        default=None,
        help="'local' (make judge), a LiteLLM model name, or none: the default model, in process",
    )
    parser.add_argument(
        "--local-model", choices=sorted(local_judge.MODELS), default=local_judge.DEFAULT
    )
    parser.add_argument("--judge-base-url", default=None, help="an OpenAI-compatible endpoint")
    parser.add_argument("--concurrency", type=int, default=1, help="judge calls at once")
    parser.add_argument(
        "--rubric",
        choices=["default", "task"],
        default="default",
        help="RULER's default rubric, or each task set's preferences in words (no answers)",
    )
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--show", action="store_true", help="print each group's judge answers")
    parser.add_argument(
        "--quick", action="store_true", help="1 group of 2 of each set, the default model judging"
    )
    args = parser.parse_args()
    if args.quick:
        args.arithmetic_groups, args.tool_groups, args.rollouts, args.judge = 1, 1, 2, None
    asyncio.run(main(args))
