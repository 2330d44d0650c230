"""ART 0.5.23's `rollout_executor=`: every rollout is launched through the executor, which
is told the worker target and the live workers, and whose capacity bounds the workers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import art
from art.distributed.rollout import LocalRolloutExecutor, RolloutExecutor
from art.local import LocalBackend
from art.pipeline_trainer import PipelineRuntimeConfig, PipelineTrainer

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEDICATED = art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])


class RecordingExecutor:
    """Runs rollouts here, as the local one does, and records what the trainer told it."""

    def __init__(self, max_workers: int | None) -> None:
        self.max_workers = max_workers
        self.targets: list[int] = []
        self.worker_sets: list[tuple[int, ...]] = []
        self.runs: list[tuple[int, str]] = []

    def set_target(self, target_workers: int) -> None:
        self.targets.append(target_workers)

    def set_workers(self, worker_ids: tuple[int, ...]) -> None:
        self.worker_sets.append(worker_ids)

    async def run(
        self,
        worker_id: int,
        rollout_fn: Callable[..., Awaitable[Any]],
        model: Any,
        scenario: Any,
        config: Any,
    ) -> Any:
        self.runs.append((worker_id, scenario["q"]))
        group = await rollout_fn(model, scenario, config)
        group.metadata["executor"] = "recording"  # the group the trainer gets is this one
        return group


def model(name: str, project: str = "pipeline") -> art.TrainableModel:
    return art.TrainableModel(
        name=name, project=project, base_model=BASE, _internal_config=DEDICATED
    )


async def rollout(model: art.TrainableModel, scenario: dict[str, Any], config: None) -> Any:
    async def sample() -> Any:
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=[{"role": "user", "content": scenario["q"]}],
            max_tokens=4,
        )
        return completion.choices[0]

    choices = await asyncio.gather(sample(), sample())
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": scenario["q"]}, choice],
            reward=float(i),
        )
        for i, choice in enumerate(choices)
    )


def test_the_local_executor_keeps_arts_contract() -> None:
    local = LocalRolloutExecutor()
    assert isinstance(local, RolloutExecutor)
    assert local.max_workers is None

    async def double(model: int, scenario: int, config: int) -> int:
        return model + scenario + config

    assert asyncio.run(local.run(0, double, 1, 2, 3)) == 6
    with pytest.raises(art.ConfigError, match="target_workers"):
        local.set_target(0)
    with pytest.raises(art.ConfigError) as raised:
        LocalRolloutExecutor(trajectory_capacity_records=8)
    assert raised.value.field == "trajectory_capacity_records"


def test_the_capacity_caps_the_default_and_refuses_a_count_asked_for(tmp_path: Path) -> None:
    backend = LocalBackend(path=tmp_path)

    def build(**kwargs: Any) -> PipelineTrainer[Any, None]:
        return PipelineTrainer(model("executor"), backend, rollout, [], None, **kwargs)

    executor = RecordingExecutor(max_workers=3)
    capped = build(rollout_executor=executor)  # 16 by default: lowered to the capacity
    assert capped.num_rollout_workers == 3
    assert capped.rollout_worker_capacity == 3
    for kwargs in [
        {"num_rollout_workers": 4},
        {"pipeline": PipelineRuntimeConfig(num_rollout_workers=4)},
    ]:
        with pytest.raises(art.ConfigError) as raised:
            build(rollout_executor=RecordingExecutor(max_workers=3), **kwargs)
        assert raised.value.field == "num_rollout_workers"
        assert "capacity 3" in raised.value.problem
    with pytest.raises(art.ConfigError) as raised:
        build(rollout_executor=object())
    assert raised.value.field == "rollout_executor"
    with pytest.raises(art.ConfigError, match="max_workers=0"):
        build(rollout_executor=RecordingExecutor(max_workers=0))


@pytest.mark.model
async def test_every_rollout_of_a_run_goes_through_the_executor(
    dedicated_backend: LocalBackend, unique_project: str
) -> None:
    trained = model("executor", unique_project)
    await trained.register(dedicated_backend)
    executor = RecordingExecutor(max_workers=2)
    scenarios = [{"q": f"What is {i} + 1?"} for i in range(3)]
    trainer = PipelineTrainer(
        trained,
        dedicated_backend,
        rollout,
        scenarios,
        None,
        min_batch_size=1,
        max_batch_size=1,
        rollout_executor=executor,
        learning_rate=1e-4,
        eval_at_start=False,
    )
    await trainer.train()

    assert executor.targets == [2]  # the default 16 workers, capped to its capacity
    assert sorted(q for _, q in executor.runs) == sorted(s["q"] for s in scenarios)
    assert {worker for worker, _ in executor.runs} <= {0, 1}
    assert executor.worker_sets[0] == (0, 1)  # both started at once
    assert await trained.get_step() >= 1
    logged = [
        group
        for step in range(await trained.get_step())
        for group in await logged_groups(dedicated_backend, trained, step)
    ]
    assert logged
    assert all(metadata.get("executor") == "recording" for metadata in logged)


async def logged_groups(
    backend: LocalBackend, model: art.TrainableModel, step: int
) -> list[dict[str, Any]]:
    import json

    import pyarrow.parquet as pq

    path = (
        Path(backend.path)
        / model.project
        / "models"
        / model.name
        / "trajectories"
        / "train"
        / f"{step:04d}.parquet"
    )
    if not path.exists():
        return []
    rows = pq.read_table(path, columns=["group_metadata"]).to_pylist()
    return [json.loads(row["group_metadata"]) for row in rows]
