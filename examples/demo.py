"""`make demo`: train the embedded default model with GRPO on this machine's CPU.

The task: answer small additions with the number alone. SmolLM2-135M-Instruct knows
many of the sums but buries them in chatter; the reward pays 1.0 for the bare correct
number and 0.5 for the correct number inside other text, so GRPO has something to
learn from the first step. A reply ends at its first line break (the answer is one line):
without it the model learned to repeat "a + b = c" lines up to the token limit, which
paid no more and cost twice the tokens to sample and train. Held-out questions are
answered greedily before and after training, and a plot of reward per step is written
beside the run. A second start resumes the run from its last checkpoint; `--fresh`
deletes it and starts over.

    python examples/demo.py [--steps 24] [--path .art] [--fresh] [--engine vllm] [--held-out 32]

`--engine` (or `ART_ENGINE`) picks the inference engine: `transformers` (the CPU default)
or `vllm` (vLLM from `.venv-vllm`: `ART_ENGINE=vllm make demo` builds it first).
"""

from __future__ import annotations

# --8<-- [start:imports]
import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import time
from pathlib import Path

import art
from art.local import LocalBackend

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You are a calculator. Reply with the number only."


def questions(seed: int, count: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 20), rng.randint(1, 20)) for _ in range(count)]


# --8<-- [end:imports]


# --8<-- [start:rollout]
def reward(answer: str, expected: int) -> float:
    """1.0 for the bare correct number, 0.5 for the correct number among other text."""
    text = answer.strip().rstrip(".").strip()
    if text == str(expected):
        return 1.0
    return 0.5 if str(expected) in re.findall(r"-?\d+", text) else 0.0


async def rollout(
    model: art.TrainableModel, question: tuple[int, int], *, greedy: bool = False
) -> art.Trajectory:
    a, b = question
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ],
        metadata={"question": f"{a}+{b}"},
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=trajectory.messages(),
        max_tokens=12,
        temperature=0.0 if greedy else 1.0,
        stop=["\n"],
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    trajectory.reward = reward(choice.message.content or "", a + b)
    return trajectory


# --8<-- [end:rollout]


async def held_out_rewards(
    model: art.TrainableModel, held_out: list[tuple[int, int]], label: str
) -> list[float]:
    """Each held-out question's reward, answered greedily (logged as the run's val split)."""
    trajectories = await art.gather_trajectories(
        (rollout(model, q, greedy=True) for q in held_out), pbar_desc=f"held-out ({label})"
    )
    await model.log([art.TrajectoryGroup(trajectories)], split="val")
    return [t.reward for t in trajectories]


async def held_out_reward(
    model: art.TrainableModel, held_out: list[tuple[int, int]], label: str
) -> float:
    return statistics.fmean(await held_out_rewards(model, held_out, label))


def answers(rewards: list[float]) -> str:
    """How many answers hold the correct sum, and how many are that number alone: the
    reward pays the sum inside other text ("3 + 9 = 12") half, so a model that learned
    the sums but still writes them out gains less reward than it learned."""
    correct = sum(reward > 0 for reward in rewards)
    bare = sum(reward == 1.0 for reward in rewards)
    return f"{correct} of {len(rewards)} with the correct sum, {bare} of them the bare number"


def plot(history_path: Path, start: int, before: float, after: float, target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in history_path.read_text().splitlines()]
    train = [(row["step"], row["train/reward"]) for row in rows if "train/reward" in row]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(
        [s for s, _ in train], [r for _, r in train], marker="o", label="training reward (sampled)"
    )
    axes.scatter(
        [start, train[-1][0] + 1 if train else start],
        [before, after],
        color="tab:red",
        zorder=3,
        label="held-out reward (greedy)",
    )
    axes.set(
        xlabel="step", ylabel="reward", ylim=(0, 1), title="art demo: GRPO on SmolLM2-135M (CPU)"
    )
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(target, dpi=120)


async def main(
    steps: int,
    path: str,
    learning_rate: float,
    fresh: bool,
    engine: str | None,
    held_out_count: int = 32,
) -> None:
    started = time.monotonic()
    run_dir = Path(path) / "art-demo" / "models" / "arithmetic"
    if fresh and run_dir.exists():
        print(f"starting afresh (--fresh): removing the previous run in {run_dir}")
        shutil.rmtree(run_dir)
    backend = LocalBackend(path=path)
    model = art.TrainableModel(
        name="arithmetic",
        project="art-demo",
        base_model=BASE_MODEL,
        _internal_config=art.dev.InternalModelConfig(engine=engine),  # type: ignore[arg-type]
    )
    print(
        f"loading {BASE_MODEL} on the {engine or 'default'} engine "
        "(the first run converts the embedded GGUF, ~30 s)"
    )
    await model.register(backend)
    start = await model.get_step()
    if start:
        print(f"resuming the run in {run_dir} at step {start} (--fresh starts over)")

    held_out = questions(seed=1, count=held_out_count)
    train_questions = questions(seed=2, count=256)
    before_rewards = await held_out_rewards(model, held_out, "before")
    before = statistics.fmean(before_rewards)
    print(f"held-out reward before training: {before:.2f} ({answers(before_rewards)})")

    # --8<-- [start:loop]
    for step in range(start, steps):
        # Seeded by the step, so a resumed run draws the batches an unbroken one would.
        batch = random.Random(step).sample(train_questions, 8)
        groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, q) for _ in range(8)) for q in batch),
            pbar_desc=f"step {step + 1}/{steps}",
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=learning_rate))
        rewards = [t.reward for group in groups for t in group]
        print(f"step {step + 1}: reward {sum(rewards) / len(rewards):.2f}")
    # --8<-- [end:loop]

    # Greedy answers from unchanged weights are the same answers: no second evaluation.
    after_rewards = before_rewards
    if steps > start:
        after_rewards = await held_out_rewards(model, held_out, "after")
    after = statistics.fmean(after_rewards)
    target = run_dir / "reward.png"
    plot(run_dir / "history.jsonl", start, before, after, target)
    await backend.close()
    print(
        f"held-out reward: {before:.2f} before, {after:.2f} after training ({after - before:+.2f}); "
        f"{time.monotonic() - started:.0f}s in all. Plot: {target}"
    )
    print(f"held-out answers after training: {answers(after_rewards)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=24, help="training steps (8 questions x 8 rollouts each)"
    )
    parser.add_argument("--path", default=".art", help="where the run is stored")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument(
        "--held-out", type=int, default=32, help="held-out questions, answered before and after"
    )
    parser.add_argument(
        "--fresh", action="store_true", help="delete the previous run and start over"
    )
    parser.add_argument(
        "--engine",
        choices=["transformers", "vllm"],
        default=os.environ.get("ART_ENGINE") or None,
        help="inference engine (default: $ART_ENGINE, else vLLM on CUDA, else transformers)",
    )
    arguments = parser.parse_args()
    if arguments.held_out < 1:
        parser.error(f"--held-out must be at least 1, got {arguments.held_out}")
    asyncio.run(
        main(
            arguments.steps,
            arguments.path,
            arguments.learning_rate,
            arguments.fresh,
            arguments.engine,
            arguments.held_out,
        )
    )
