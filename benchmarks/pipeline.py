"""PipelineTrainer against the synchronous loop: the same steps and rollouts, wall time.

The task is `examples/demo.py`'s (small additions, the bare number pays 1.0), with an
environment that takes real time: after the model answers, the rollout waits
`--tool-seconds` (a sleep standing for a tool call) before it is scored. The demo's reward
loses up to 0.01 for length (`shaped_reward`), so the rollouts of a group rarely tie:
PipelineTrainer drops groups whose rewards are all equal (ART's rule) and would sample
more groups per step than the sync loop, which trains them (to no effect) instead.

- **sync**: the loop users write first, on a shared LocalBackend (all cores for each
  phase): gather `--groups` groups of `--group-size` rollouts, `model.train`, repeat.
  The engine idles while a step trains; the trainer idles while rollouts (and their
  tool waits) run.
- **pipeline**: `art.PipelineTrainer` on a LocalBackend in dedicated mode on the CPU
  (`trainer_gpu_ids=[]`, `inference_gpu_ids=[]`: a serving copy of the weights, half the
  cores each), `min_batch_size = max_batch_size = --groups`, so every step trains the same
  number of groups as the sync loop; `max_steps_off_policy` = `--off-policy`;
  `num_rollout_workers` = `--workers` (default `--groups`: one batch in flight).

Both train `--steps` steps from the same fresh adapter with the same learning rate.
Printed: the machine, each run's wall time, the ratio, rollouts sampled and trained, and
each run's reward per step (the curve must still rise under the pipeline).

    python benchmarks/pipeline.py                # ~10 minutes on 2 cores
    python benchmarks/pipeline.py --quick        # a smoke setting: 2 steps x 1 group x 2
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

from support.demo import demo_module
from support.machine import machine

import art
from art.local import LocalBackend
from art.pipeline_trainer import PipelineTrainer

BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


DEMO = demo_module()


@dataclass
class Run:
    name: str
    seconds: float = 0.0
    rollouts_sampled: int = 0
    rollouts_trained: int = 0
    rewards: list[float] = field(default_factory=list)  # mean train reward per step


@dataclass(frozen=True)
class Settings:
    steps: int
    groups: int
    group_size: int
    tool_seconds: float
    off_policy: int
    workers: int
    learning_rate: float
    seed: int


def question_stream(seed: int) -> Any:
    rng = random.Random(seed)
    while True:
        yield (rng.randint(1, 20), rng.randint(1, 20))


async def rollout(
    model: art.TrainableModel, question: tuple[int, int], settings: Settings, run: Run
) -> art.Trajectory:
    a, b = question
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": DEMO.SYSTEM},
            {"role": "user", "content": f"What is {a} + {b}?"},
        ]
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=20
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    await asyncio.sleep(settings.tool_seconds)  # the environment: a tool call takes time
    trajectory.reward = shaped_reward(choice.message.content or "", a + b)
    run.rollouts_sampled += 1
    return trajectory


def shaped_reward(answer: str, expected: int) -> float:
    """The demo's reward, minus up to 0.01 for length (a tie-breaker, not the task)."""
    return float(DEMO.reward(answer, expected)) - 0.01 * min(len(answer), 100) / 100


async def fresh_model(path: Path, name: str, dedicated: bool) -> tuple[Any, Any]:
    backend = LocalBackend(path=path, in_process=True)
    config = (
        art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])
        if dedicated
        else art.dev.InternalModelConfig()
    )
    model = art.TrainableModel(
        name=name, project="bench-pipeline", base_model=BASE_MODEL, _internal_config=config
    )
    await model.register(backend)
    return backend, model


async def run_sync(path: Path, settings: Settings) -> Run:
    run = Run("sync loop (shared backend)")
    backend, model = await fresh_model(path, "sync", dedicated=False)
    questions = question_stream(settings.seed)
    started = time.perf_counter()
    for _ in range(settings.steps):
        batch = list(itertools.islice(questions, settings.groups))
        groups = await art.gather_trajectory_groups(
            (
                art.TrajectoryGroup(
                    rollout(model, q, settings, run) for _ in range(settings.group_size)
                )
                for q in batch
            ),
            pbar_desc="sync gather",
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=settings.learning_rate))
        rewards = [t.reward for group in groups for t in group.trajectories]
        run.rollouts_trained += len(rewards)
        run.rewards.append(statistics.fmean(rewards))
    run.seconds = time.perf_counter() - started
    await backend.close()
    return run


async def run_pipeline(path: Path, settings: Settings) -> Run:
    run = Run(f"PipelineTrainer (dedicated, max_steps_off_policy={settings.off_policy})")
    backend, model = await fresh_model(path, "pipeline", dedicated=True)

    async def group_rollout(
        model: art.TrainableModel, question: tuple[int, int], config: Settings
    ) -> art.TrajectoryGroup:
        trajectories = await asyncio.gather(
            *(rollout(model, question, config, run) for _ in range(config.group_size))
        )
        return art.TrajectoryGroup(trajectories)

    trainer = PipelineTrainer(
        model,
        backend,
        group_rollout,
        question_stream(settings.seed),
        settings,
        # One batch in flight while a step trains: more workers only sample groups that
        # go stale before a step can take them.
        num_rollout_workers=settings.workers,
        min_batch_size=settings.groups,
        max_batch_size=settings.groups,
        max_steps=settings.steps,
        max_steps_off_policy=settings.off_policy,
        learning_rate=settings.learning_rate,
        log_interval_seconds=30,
    )
    started = time.perf_counter()
    await trainer.train()
    run.seconds = time.perf_counter() - started
    store = Path(backend.path) / model.project / "models" / model.name
    await backend.close()
    run.rewards, run.rollouts_trained = read_train_rewards(store)
    return run


def read_train_rewards(store: Path) -> tuple[list[float], int]:
    import json

    rewards, trained = [], 0
    for line in (store / "history.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "train/reward" in row:
            rewards.append(row["train/reward"])
            trained += int(row["data/step_num_trajectories"])
    return rewards, trained


def rises(rewards: list[float]) -> tuple[float, float]:
    third = max(1, len(rewards) // 3)
    return statistics.fmean(rewards[:third]), statistics.fmean(rewards[-third:])


def report(settings: Settings, runs: list[Run]) -> None:
    print()
    print(f"machine: {machine()}")
    print(
        f"work: {settings.steps} steps x {settings.groups} groups x {settings.group_size} "
        f"rollouts, tool wait {settings.tool_seconds:g} s per rollout, "
        f"learning_rate {settings.learning_rate:g}, pipeline workers {settings.workers}"
    )
    for run in runs:
        first, last = rises(run.rewards)
        curve = " ".join(f"{r:.2f}" for r in run.rewards)
        print(
            f"  {run.name:<50} {run.seconds:7.1f} s  sampled {run.rollouts_sampled:4d}  "
            f"trained {run.rollouts_trained:4d}  reward first third {first:.2f} -> "
            f"last third {last:.2f}"
        )
        print(f"    reward per step: {curve}")
    sync, pipeline = runs
    ratio = sync.seconds / pipeline.seconds
    print(f"  pipeline speed-up (sync seconds / pipeline seconds): {ratio:.2f}x")


async def main(settings: Settings) -> None:
    with tempfile.TemporaryDirectory(prefix="art-bench-pipeline-") as tmp:
        # The sync run first: dedicated mode sets torch's thread count for the process.
        sync = await run_sync(Path(tmp) / "sync", settings)
        pipeline = await run_pipeline(Path(tmp) / "pipeline", settings)
    report(settings, [sync, pipeline])


def parse() -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=4, help="groups (questions) per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group")
    parser.add_argument("--tool-seconds", type=float, default=3.0)
    parser.add_argument("--off-policy", type=int, default=1, help="max_steps_off_policy")
    parser.add_argument(
        "--workers", type=int, default=None, help="num_rollout_workers (default: --groups)"
    )
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="2 steps x 1 group x 2 rollouts, 0.2 s tool wait"
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.groups, args.group_size, args.tool_seconds = 2, 1, 2, 0.2
    return Settings(
        steps=args.steps,
        groups=args.groups,
        group_size=args.group_size,
        tool_seconds=args.tool_seconds,
        off_policy=args.off_policy,
        workers=args.workers or args.groups,
        learning_rate=args.learning_rate,
        seed=args.seed,
    )


if __name__ == "__main__":
    asyncio.run(main(parse()))
