"""Zero-label training: GRPO on the default model where RULER is the reward.

No answer key and no reward function: each group of rollouts is scored by an LLM judge
that compares them side by side (`ruler_score_group` as the gather's `after_each`); where
the judge gives equal scores, the shorter answer is preferred by at most 0.01 (`TIE_BREAK`).
By default the judge is the base model itself, served by the same LocalBackend under
its own name, so the run needs nothing but this machine; name any LiteLLM model with
`--judge` (e.g. `--judge openai/gpt-4.1-mini` with OPENAI_API_KEY set) for a real one.

    python examples/ruler_zero_label.py [--steps 2] [--judge MODEL] [--path .art] [--fresh]

A second start resumes the run from its last checkpoint; `--fresh` deletes it first.
"""

from __future__ import annotations

# --8<-- [start:imports]
import argparse
import asyncio
import random
import shutil
import time
from pathlib import Path
from typing import Any

import art
from art.local import LocalBackend
from art.rewards import ruler_score_group

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You answer questions in one short, correct sentence."
QUESTIONS = [
    "What colour is the sky on a clear day?",
    "How many legs does a spider have?",
    "What is the capital of France?",
    "Which planet is closest to the sun?",
    "What do bees make?",
    "How many days are in a week?",
    "What is frozen water called?",
    "Which animal is known as the king of the jungle?",
    "What is 3 times 4?",
    "In which season do leaves fall from trees?",
]
RUBRIC = """\
- A correct answer scores far higher than a wrong or evasive one.
- Among correct answers, a short direct sentence beats a rambling one.
- Answers that repeat themselves or drift off topic score lowest."""


# A judge as small as the default model scores a group's answers alike, and a group of
# equal rewards teaches GRPO nothing. The rubric's own label-free preference, the shorter
# answer, breaks such ties; at most 0.01, it leaves a real judge's ranking as it was.
TIE_BREAK = 0.01


def shortness(trajectory: art.Trajectory) -> float:
    """1 for an empty answer, falling to 0 at 200 characters."""
    answer = trajectory.messages()[-1].get("content") or ""
    return 1 - min(len(str(answer)), 200) / 200


async def rollout(model: art.TrainableModel, question: str) -> art.Trajectory:
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": question},
        ],
        metadata={"question": question},
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=trajectory.messages(),
        max_tokens=32,
        temperature=1.0,
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    return trajectory  # reward stays 0: RULER sets it


# --8<-- [end:imports]


def spread(groups: list[art.TrajectoryGroup]) -> int:
    """Groups whose rollouts the judge scored differently (before the tie-break)."""
    return sum(len({t.metrics["ruler_score"] for t in group}) > 1 for group in groups)


async def main(arguments: argparse.Namespace) -> None:
    started = time.monotonic()
    run_dir = Path(arguments.path) / "art-ruler" / "models" / "zero-label"
    if arguments.fresh and run_dir.exists():
        print(f"starting afresh (--fresh): removing the previous run in {run_dir}")
        shutil.rmtree(run_dir)
    backend = LocalBackend(path=arguments.path)
    model = art.TrainableModel(name="zero-label", project="art-ruler", base_model=BASE_MODEL)
    await model.register(backend)
    if await model.get_step():
        print(
            f"resuming the run in {run_dir} at step {await model.get_step()} (--fresh starts over)"
        )

    # --8<-- [start:judge]
    judge_model: str = arguments.judge or f"openai/{BASE_MODEL}"
    # Room for the judge's analysis, then an entry per rollout.
    judge_params: dict[str, Any] = {"max_tokens": 160 * arguments.group_size + 160}
    if arguments.judge is None:
        # The endpoint serves the untrained base model under its own name beside ours.
        judge_params |= {
            "base_url": model.inference_base_url,
            "api_key": model.inference_api_key,
            "temperature": 0.0,
        }
    print(f"judge: {judge_model}")

    async def score(group: art.TrajectoryGroup) -> art.TrajectoryGroup | None:
        judged = await ruler_score_group(
            group, judge_model, judge_params, RUBRIC, swallow_exceptions=True
        )
        for trajectory in judged or []:
            trajectory.reward += TIE_BREAK * shortness(trajectory)
        return judged

    failures = 0
    while (step := await model.get_step()) < arguments.steps:
        # Seeded by the step, so a resumed run draws the questions an unbroken one would.
        questions = random.Random(step).sample(QUESTIONS, arguments.groups)
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(rollout(model, q) for _ in range(arguments.group_size))
                for q in questions
            ),
            pbar_desc=f"step {step + 1}/{arguments.steps}",
            after_each=score,
        )
        # --8<-- [end:judge]
        if not groups:
            failures += 1
            if failures == 3:
                raise SystemExit("the judge could not score a group three times in a row")
            print(f"step {step + 1}: the judge could score no group; sampling again")
            continue
        failures = 0
        await model.train(groups, config=art.TrainConfig(learning_rate=arguments.learning_rate))
        rewards = [float(t.metrics["ruler_score"]) for g in groups for t in g]
        best = max((t for g in groups for t in g), key=lambda t: t.reward)
        print(
            f"step {step + 1}: {len(groups)} groups judged ({spread(groups)} told apart by "
            "the judge), "
            "mean RULER score "
            f"{sum(rewards) / len(rewards):.2f}; best answer {best.messages()[-1]['content']!r}"
        )
        print(f"  {best.logs[-1]}")

    print(f"trained to step {step} in {time.monotonic() - started:.0f}s; run stored in {run_dir}")
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--groups", type=int, default=2, help="questions per step")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per question")
    parser.add_argument(
        "--judge", default=None, help="a LiteLLM model name; default: the local base model"
    )
    parser.add_argument("--path", default=".art", help="where the run is stored")
    parser.add_argument(
        "--fresh", action="store_true", help="delete the previous run and start over"
    )
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    asyncio.run(main(parser.parse_args()))
