"""Train with `art.PipelineTrainer` on this CPU: rollouts go on while each step trains.

The demo's task (small additions; the bare correct number pays 1.0), with an
environment that takes time: each rollout waits `--tool-seconds` after the model answers,
as a tool call would. The model runs in dedicated mode on the CPU
(`trainer_gpu_ids=[]`, `inference_gpu_ids=[]`): the engine serves a copy of the weights
holding each published checkpoint while the trainer trains its own, so rollouts never
wait for a step. Each trajectory records the step that sampled it; groups sampled more
than `--off-policy` steps before the step they would train at are dropped, as are groups
whose rewards are all equal. Started again, the run resumes from its last checkpoint
and skips the questions already taken; `--fresh` starts over.

    python examples/pipeline.py [--steps 8] [--path .art] [--fresh]
"""

from __future__ import annotations

# --8<-- [start:imports]
import argparse
import asyncio
import json
import random
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import art
from art.local import LocalBackend

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = "You are a calculator. Reply with the number only."
# --8<-- [end:imports]


# --8<-- [start:rollout]
def questions(seed: int) -> Iterator[dict[str, int]]:
    """An endless stream of scenarios: PipelineTrainer takes them as workers free up."""
    rng = random.Random(seed)
    while True:
        yield {"a": rng.randint(1, 20), "b": rng.randint(1, 20)}


def reward(answer: str, expected: int) -> float:
    """1.0 for the bare correct number, 0.5 for the correct number among other text."""
    text = answer.strip().rstrip(".").strip()
    if text == str(expected):
        return 1.0
    return 0.5 if str(expected) in re.findall(r"-?\d+", text) else 0.0


async def rollout(
    model: art.TrainableModel, scenario: dict[str, int], tool_seconds: float
) -> art.Trajectory:
    a, b = scenario["a"], scenario["b"]
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ],
        metadata={"question": f"{a}+{b}"},
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=20
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)  # trained on
    await asyncio.sleep(tool_seconds)  # the environment's tool call
    trajectory.reward = reward(choice.message.content or "", a + b)
    return trajectory


# --8<-- [end:rollout]


async def main(args: argparse.Namespace) -> None:
    run_dir = Path(args.path) / "art-pipeline" / "models" / "arithmetic"
    if args.fresh and run_dir.exists():
        print(f"starting afresh (--fresh): removing the previous run in {run_dir}")
        shutil.rmtree(run_dir)
    # --8<-- [start:model]
    backend = LocalBackend(path=args.path)
    model = art.TrainableModel(
        name="arithmetic",
        project="art-pipeline",
        base_model=BASE_MODEL,
        _internal_config=art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[]),
    )
    await model.register(backend)
    # --8<-- [end:model]
    start = await model.get_step()
    if start >= args.steps:
        print(f"the run in {run_dir} is at step {start} already (--steps is the total)")
        await backend.close()
        return
    if start:
        print(f"resuming the run in {run_dir} at step {start} (--fresh starts over)")

    # --8<-- [start:trainer]
    async def group_rollout(
        model: art.TrainableModel, scenario: dict[str, int], config: argparse.Namespace
    ) -> art.TrajectoryGroup:
        trajectories = await asyncio.gather(
            *(rollout(model, scenario, config.tool_seconds) for _ in range(config.group_size))
        )
        return art.TrajectoryGroup(trajectories)

    trainer = art.PipelineTrainer(
        model,
        backend,
        group_rollout,
        questions(seed=0),
        args,
        num_rollout_workers=2 * args.groups,
        min_batch_size=args.groups,
        max_batch_size=args.groups,
        max_steps=args.steps - start,
        max_steps_off_policy=args.off_policy,
        learning_rate=args.learning_rate,
        log_interval_seconds=30,
    )
    await trainer.train()
    # --8<-- [end:trainer]
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/reward" in row:
            print(
                f"step {row['step'] + 1}: reward {row['train/reward']:.3f}, staleness "
                f"{row.get('train/staleness_mean', 0):.2f} (max "
                f"{row.get('train/staleness_max', 0):.0f}), dropped "
                f"{row['train/groups_dropped_stale']:.0f} stale / "
                f"{row['train/groups_dropped_no_variance']:.0f} without variance"
            )
    print(
        f"groups dropped over the run: {trainer.groups_dropped_stale} stale, "
        f"{trainer.groups_dropped_no_variance} without reward variance"
    )
    await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="total training steps")
    parser.add_argument("--path", default=".art", help="where the run is stored")
    parser.add_argument("--groups", type=int, default=4, help="questions per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per question")
    parser.add_argument("--tool-seconds", type=float, default=2.0)
    parser.add_argument("--off-policy", type=int, default=1, help="max_steps_off_policy")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--fresh", action="store_true", help="delete the run and start over")
    asyncio.run(main(parser.parse_args()))
