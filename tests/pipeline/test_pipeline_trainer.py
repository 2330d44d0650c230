"""PipelineTrainer on the real default model, served by a LocalBackend in dedicated mode.

One backend (in this process, dedicated mode on the CPU: a serving copy of the weights
beside the trained one) serves the module; each test trains its own model on it. Runs
end when their scenarios run out, so every group a run produced is either trained or
dropped, and the counts are exact.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import pytest_asyncio
from helpers import assert_trained_the_groups_told_apart

import art
from art.local import LocalBackend
from art.pipeline_trainer import PipelineTrainer, keep_recent_and_top, make_group_rollout_fn
from art.runtime.engines.start import check_supported

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEDICATED = art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])


@pytest.fixture(scope="module")
def backend_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pipeline") / ".art"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def backend(backend_path: Path) -> AsyncIterator[LocalBackend]:
    backend = LocalBackend(path=backend_path, in_process=True)
    yield backend
    await backend.close()


async def dedicated_model(backend: LocalBackend, name: str) -> art.TrainableModel:
    model = art.TrainableModel(
        name=name, project="pipeline", base_model=BASE, _internal_config=DEDICATED
    )
    await model.register(backend)
    return model


async def sample(model: art.TrainableModel, question: str) -> Any:
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=[{"role": "user", "content": question}],
        max_tokens=4,
    )
    return completion.choices[0]


async def rollout(model: art.TrainableModel, scenario: dict[str, Any], config: None) -> Any:
    """Two rollouts; rewards 0 and 1 (variance), or both 0.5 for a `flat` scenario.

    A `slow` scenario's environment takes until the policy has moved one step past the
    one that sampled it, so with max_steps_off_policy=0 its group is always stale.
    """
    choices = await asyncio.gather(*(sample(model, scenario["q"]) for _ in range(2)))
    if scenario.get("slow"):
        sampled = min(choice.policy_version for choice in choices)
        # The step lives in the backend's files: no event to wait on, so poll it.
        while await model.get_step() <= sampled:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    trajectories = [
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": scenario["q"]}, choice],
            reward=0.5 if scenario.get("flat") else float(i),
        )
        for i, choice in enumerate(choices)
    ]
    return art.TrajectoryGroup(trajectories)


def scenario(i: int, **flags: bool) -> dict[str, Any]:
    return {"q": f"What is {i} + {i}?", "metadata": {"scenario_id": str(i)}, **flags}


def trained_trajectories(store_dir: Path) -> list[tuple[int, dict[str, Any]]]:
    """(step the file was trained at, trajectory) for every trajectory logged to train.

    Each trajectory gets its group's `scenario_id` (PipelineTrainer copies a scenario's
    metadata onto its group) under `scenario_id`.
    """
    found = []
    for path in sorted((store_dir / "trajectories" / "train").glob("*.parquet")):
        step = int(path.stem)
        table = pq.read_table(path, columns=["trajectory", "group_metadata"]).to_pylist()
        for row in table:
            if row["trajectory"] is not None:
                trajectory = json.loads(row["trajectory"])
                trajectory["scenario_id"] = json.loads(row["group_metadata"])["scenario_id"]
                found.append((step, trajectory))
    return found


def history(store_dir: Path) -> list[dict[str, Any]]:
    lines = (store_dir / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def store_dir(backend_path: Path, model: art.TrainableModel) -> Path:
    return backend_path / model.project / "models" / model.name


# --- refused configurations (no model loaded) ------------------------------------------


async def test_a_shared_backend_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    shared = art.TrainableModel(name="shared", project="pipeline", base_model=BASE)
    with pytest.raises(art.ConfigError) as raised:
        PipelineTrainer(shared, LocalBackend(path=tmp_path), rollout, [], None)
    assert raised.value.field == "backend"
    assert "dedicated mode" in str(raised.value)
    assert "trainer_gpu_ids=[], inference_gpu_ids=[]" in str(raised.value)


async def test_arguments_this_version_cannot_honour_are_refused_by_name(tmp_path: Path) -> None:
    model = art.TrainableModel(
        name="refusals", project="pipeline", base_model=BASE, _internal_config=DEDICATED
    )
    backend = LocalBackend(path=tmp_path)
    for kwargs, field in [
        ({"loss_fn": "dro"}, "loss_fn"),
        ({"adam_params": {"lr": 1}}, "adam_params"),
        ({"kl_penalty_step_lag": 0}, "kl_penalty_step_lag"),  # ART's: at least 1
        ({"save_checkpoint": False}, "save_checkpoint"),
        ({"max_batch_size": 1, "min_batch_size": 2}, "max_batch_size"),
        ({"max_steps_off_policy": -1}, "max_steps_off_policy"),
        ({"rollout_executor": object()}, "rollout_executor"),
        ({"packed_sequence_length": 8}, "packed_sequence_length"),  # ART's; at least 16
    ]:
        with pytest.raises(art.ConfigError) as raised:
            PipelineTrainer(model, backend, rollout, [], None, **kwargs)
        assert raised.value.field == field
    with pytest.raises(art.ConfigError, match="backend"):
        PipelineTrainer(model, object(), rollout, [], None)
    # ART's packed_sequence_length reaches every step's config (its effect on a step:
    # test_train_memory.py).
    packed = PipelineTrainer(model, backend, rollout, [], None, packed_sequence_length=512)
    assert packed.dev_config.packed_sequence_length == 512


def test_dedicated_mode_on_the_cpu_takes_empty_gpu_lists_and_refuses_gpu_ids() -> None:
    check_supported(DEDICATED, "transformers")
    gpus = art.dev.InternalModelConfig(trainer_gpu_ids=[0], inference_gpu_ids=[1])
    with pytest.raises(art.ConfigError) as raised:
        check_supported(gpus, "transformers")
    assert raised.value.field == "_internal_config.trainer_gpu_ids"
    assert "trainer_gpu_ids=[]" in raised.value.fix
    with pytest.raises(art.ConfigError, match="trainer_gpu_ids"):
        check_supported(DEDICATED, "vllm")


# --- runs on the default model ---------------------------------------------------------


async def test_stale_groups_are_dropped_and_no_trained_trajectory_exceeds_the_bound(
    backend: LocalBackend, backend_path: Path
) -> None:
    model = await dedicated_model(backend, "stale")
    scenarios = [scenario(0, slow=True), *(scenario(i) for i in range(1, 6))]
    trainer = PipelineTrainer(
        model,
        backend,
        rollout,
        scenarios,
        None,
        num_rollout_workers=2,
        min_batch_size=1,
        max_batch_size=1,
        max_steps_off_policy=0,
        learning_rate=1e-4,
    )
    await trainer.train()

    assert trainer.groups_dropped_stale >= 1  # the slow group, at least
    trained = trained_trajectories(store_dir(backend_path, model))
    assert trained
    for step, trajectory in trained:
        assert trajectory["initial_policy_version"] is not None
        assert step - trajectory["initial_policy_version"] <= 0
    assert "0" not in {t["scenario_id"] for _, t in trained}  # the slow one
    rows = [r for r in history(store_dir(backend_path, model)) if "train/staleness_max" in r]
    assert rows
    assert all(r["train/staleness_max"] <= 0 for r in rows)
    assert all("train/groups_dropped_stale" in r for r in rows)


async def test_no_variance_groups_are_dropped_and_staleness_stays_within_one_step(
    backend: LocalBackend, backend_path: Path
) -> None:
    model = await dedicated_model(backend, "flat")
    scenarios = [scenario(0, flat=True), scenario(1, flat=True), *map(scenario, range(2, 9))]
    evaluated: list[tuple[int, int]] = []

    async def eval_fn(model: art.TrainableModel, step: int, config: None) -> list[art.Trajectory]:
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(step),
            messages=[{"role": "user", "content": "What is 2 + 2?"}],
            max_tokens=4,
        )
        choice = completion.choices[0]
        evaluated.append((step, choice.policy_version))
        return [art.Trajectory(messages_and_choices=[choice], reward=1.0)]

    trainer = PipelineTrainer(
        model,
        backend,
        rollout,
        scenarios,
        None,
        eval_fn,
        eval_every_n_steps=1,
        num_rollout_workers=3,
        min_batch_size=1,
        max_batch_size=2,
        max_steps_off_policy=1,
        learning_rate=1e-4,
    )
    await trainer.train()

    assert trainer.groups_dropped_no_variance == 2
    directory = store_dir(backend_path, model)
    trained = trained_trajectories(directory)
    assert {t["scenario_id"] for _, t in trained} <= {str(i) for i in range(2, 9)}
    for step, trajectory in trained:
        assert 0 <= step - trajectory["initial_policy_version"] <= 1
    state = json.loads((directory / "pipeline_state.json").read_text())
    assert state["groups_dropped_no_variance"] == 2
    assert state["scenario_offset"] == len(scenarios)
    assert state["training_step"] == await model.get_step() > 0
    # eval_fn ran at the start and after every step, on that step's checkpoint.
    final = await model.get_step()
    assert sorted(evaluated) == [(step, step) for step in range(final + 1)]
    val_steps = [r["step"] for r in history(directory) if "val/reward" in r]
    assert sorted(val_steps) == list(range(final + 1))


async def test_rollouts_cost_as_train_and_evals_as_eval_as_in_art(
    backend: LocalBackend, backend_path: Path
) -> None:
    from art.metrics import track_api_cost

    usage: dict[str, object] = {"usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}

    @track_api_cost(source="tools/search", provider="openai", model_name="openai/gpt-4.1")
    async def search() -> dict[str, object]:  # $2.00 at gpt-4.1's $2 per million inputs
        return usage

    async def costly_rollout(
        model: art.TrainableModel, scenario: dict[str, Any], config: None
    ) -> Any:
        await search()
        return await rollout(model, scenario, config)

    async def eval_fn(model: art.TrainableModel, step: int, config: None) -> list[art.Trajectory]:
        await search()
        return [
            art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=1.0)
        ]

    model = await dedicated_model(backend, "costs")
    scenarios = [scenario(i) for i in range(3)]
    trainer = PipelineTrainer(
        model,
        backend,
        costly_rollout,
        scenarios,
        None,
        eval_fn,
        eval_every_n_steps=1,
        num_rollout_workers=3,
        min_batch_size=1,
        max_batch_size=3,
        learning_rate=1e-4,
    )
    await trainer.train()

    rows = history(store_dir(backend_path, model))
    evals = [r for r in rows if "val/reward" in r]
    # Every rollout finished before the last step trained, so each cost is in a train row.
    train_costs = sum(r.get("costs/train/tools/search", 0.0) for r in rows)
    eval_costs = sum(r.get("costs/eval/tools/search", 0.0) for r in rows)
    assert train_costs == pytest.approx(2.0 * len(scenarios))
    assert evals
    assert eval_costs == pytest.approx(2.0 * len(evals))
    assert not any("costs/eval/tools/search" in r for r in rows if "val/reward" not in r)
    assert max(r.get("costs/cum/all", 0.0) for r in rows) == pytest.approx(train_costs + eval_costs)


async def test_checkpoint_retention_keeps_the_recent_the_best_and_the_needed(
    backend: LocalBackend, backend_path: Path
) -> None:
    """keep_recent_and_top(recent=1, top=1) on val/reward, a pass after every step: the
    best step (2) and the newest survive; early steps, evaluated long since, are deleted."""
    model = await dedicated_model(backend, "retention")

    async def eval_fn(model: art.TrainableModel, step: int, config: None) -> list[art.Trajectory]:
        choice = await sample(model, "What is 2 + 2?")
        return [art.Trajectory(messages_and_choices=[choice], reward=1.0 if step == 2 else 0.1)]

    trainer = PipelineTrainer(
        model,
        backend,
        rollout,
        list(map(scenario, range(6))),
        None,
        eval_fn,
        eval_every_n_steps=1,
        num_rollout_workers=1,
        min_batch_size=1,
        max_batch_size=1,
        max_steps_off_policy=0,
        learning_rate=1e-4,
        checkpoint_retention_strategy=keep_recent_and_top(recent=1, top=1),
    )
    await trainer.train()
    final = await model.get_step()
    assert final == 6
    kept = sorted(int(p.name) for p in (store_dir(backend_path, model) / "checkpoints").iterdir())
    assert {2, final} <= set(kept), kept
    assert not {0, 1} & set(kept), kept
    # A deleted step is no longer served; a kept one is.
    assert (
        await model.openai_client().chat.completions.create(
            model=model.get_inference_name(2),
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
        )
    ).choices
    with pytest.raises(Exception, match="checkpoint"):
        await model.openai_client().chat.completions.create(
            model=model.get_inference_name(1),
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
        )


def test_keep_recent_and_top_ranks_by_the_metric_and_refuses_negative_counts() -> None:
    from datetime import UTC, datetime

    from art.pipeline_trainer import CheckpointInfo, CheckpointRetentionContext

    def info(step: int, **metrics: float) -> CheckpointInfo:
        return CheckpointInfo(
            step=step, path=f"/c/{step}", created_at=datetime.now(UTC), metrics=metrics
        )

    context = CheckpointRetentionContext(
        current_step=9,
        checkpoints=[
            info(1, **{"val/reward": 0.9}),
            info(3, **{"val/reward": 0.9}),
            info(4),
            info(5, **{"val/reward": 0.2}),
            info(6),
        ],
    )
    assert set(keep_recent_and_top(recent=2, top=1)(context)) == {5, 6, 3}  # a tie: the later step
    assert set(keep_recent_and_top(recent=0, top=0)(context)) == set()
    assert set(keep_recent_and_top(recent=9, top=0)(context)) == {1, 3, 4, 5, 6}
    with pytest.raises(art.ArtValueError, match="recent"):
        keep_recent_and_top(recent=-1)
    with pytest.raises(art.ConfigError, match="checkpoint_retention_interval"):
        PipelineTrainer(
            art.TrainableModel(name="r", project="p", base_model=BASE, _internal_config=DEDICATED),
            LocalBackend(path="/tmp/never-written"),
            rollout,
            [],
            None,
            checkpoint_retention_interval=0,
        )


async def test_a_request_in_flight_keeps_its_adapter_across_a_checkpoint_switch(
    backend: LocalBackend,
) -> None:
    model = await dedicated_model(backend, "inflight")
    client = model.openai_client()
    groups = [
        art.TrajectoryGroup(
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": "Say hi"}, choice],
                reward=float(i),
            )
            for i, choice in enumerate(
                await asyncio.gather(sample(model, "Say hi"), sample(model, "Say hi"))
            )
        )
    ]
    request = {
        "messages": [{"role": "user", "content": "Write a long story about a cat."}],
        "max_tokens": 24,
        "seed": 7,
    }
    stream = await client.chat.completions.create(
        model=model.get_inference_name(), stream=True, **request
    )
    chunks = [await anext(aiter(stream))]  # the request is in flight
    training = asyncio.create_task(model.train(groups, config=art.TrainConfig(learning_rate=1e-2)))
    chunks += [chunk async for chunk in stream]
    await training
    final = next(c.choices[0] for c in reversed(chunks) if c.choices and c.choices[0].finish_reason)
    assert await model.get_step() == 1
    assert getattr(final, "policy_version") == 0  # noqa: B009

    replay_0 = await client.chat.completions.create(model=model.get_inference_name(0), **request)
    latest = await client.chat.completions.create(model=model.get_inference_name(), **request)
    assert getattr(replay_0.choices[0], "policy_version") == 0  # noqa: B009
    assert getattr(latest.choices[0], "policy_version") == 1  # noqa: B009
    in_flight_ids = getattr(final, "token_ids")  # noqa: B009
    assert getattr(replay_0.choices[0], "token_ids") == in_flight_ids  # noqa: B009
    assert getattr(latest.choices[0], "token_logprobs") != getattr(  # noqa: B009
        replay_0.choices[0], "token_logprobs"
    )


_KILLED_RUN = """
import asyncio, itertools, sys
import art
from art.local import LocalBackend
from art.pipeline_trainer import PipelineTrainer
sys.path[:0] = [{tests!r}, {here!r}]  # helpers, and this module
from test_pipeline_trainer import DEDICATED, rollout, scenario

async def main():
    backend = LocalBackend(path={path!r}, in_process=True)
    model = art.TrainableModel(name="killed", project="pipeline",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct", _internal_config=DEDICATED)
    await model.register(backend)
    scenarios = (scenario(i) for i in itertools.count())
    await PipelineTrainer(model, backend, rollout, scenarios, None, num_rollout_workers=2,
        min_batch_size=1, max_batch_size=1, learning_rate=1e-4).train()

asyncio.run(main())
"""


async def test_a_killed_run_resumes_at_its_last_step(tmp_path: Path) -> None:
    path = tmp_path / ".art"
    directory = path / "pipeline" / "models" / "killed"
    script = _KILLED_RUN.format(
        tests=str(Path(__file__).parents[1]), here=str(Path(__file__).parent), path=str(path)
    )
    log = tmp_path / "killed.log"
    with log.open("wb") as output:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            textwrap.dedent(script),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            stdout=output,
            stderr=output,
        )
    try:
        while not (directory / "checkpoints" / "0002").is_dir():
            assert child.returncode is None, log.read_text()
            await asyncio.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)  # no clean shutdown: as a crash would leave it
        await child.wait()

    steps = sorted(int(p.name) for p in (directory / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == list(range(steps[-1] + 1))
    assert steps[-1] >= 2
    for step in steps:  # a crash loses no completed checkpoint
        assert (directory / "checkpoints" / f"{step:04d}" / "adapter_config.json").is_file()
    offset_before = json.loads((directory / "pipeline_state.json").read_text())["scenario_offset"]

    backend = LocalBackend(path=path, in_process=True)
    try:
        model = art.TrainableModel(
            name="killed", project="pipeline", base_model=BASE, _internal_config=DEDICATED
        )
        await model.register(backend)
        assert await model.get_step() == steps[-1]
        await PipelineTrainer(
            model,
            backend,
            make_group_rollout_fn(single_rollout, n=2),
            (scenario(i) for i in range(1000)),
            None,
            num_rollout_workers=1,
            min_batch_size=1,
            max_batch_size=1,
            max_steps=1,
        ).train()
        assert await model.get_step() == steps[-1] + 1
        resumed = [t for step, t in trained_trajectories(directory) if step == steps[-1]]
        assert resumed  # the new step trained where the killed run stopped
        # The scenarios the killed run had taken are skipped, not trained again.
        assert all(int(t["scenario_id"]) >= offset_before for t in resumed)
        rows = [r for r in history(directory) if "train/staleness_mean" in r]
        assert rows[-1]["step"] == steps[-1]
    finally:
        await backend.close()


async def single_rollout(model: art.TrainableModel, scenario: dict[str, Any], config: None) -> Any:
    choice = await sample(model, scenario["q"])
    return art.Trajectory(
        messages_and_choices=[{"role": "user", "content": scenario["q"]}, choice],
        reward=float(len(choice.message.content or "") % 3),
    )


def run_example(path: Path, *options: str) -> str:
    example = Path(__file__).parents[2] / "examples" / "pipeline.py"
    small = ["--groups", "1", "--group-size", "2", "--tool-seconds", "0"]
    result = subprocess.run(
        [sys.executable, str(example), "--path", str(path), *small, *options],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_pipeline_example_trains_then_resumes(tmp_path: Path) -> None:
    first = run_example(tmp_path, "--steps", "1")
    assert "step 1: reward" in first
    run = tmp_path / "art-pipeline" / "models" / "arithmetic"
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
    assert_trained_the_groups_told_apart(run)
    second = run_example(tmp_path, "--steps", "2")
    assert "resuming the run" in second
    assert "at step 1" in second
    assert (run / "checkpoints" / "0002" / "adapter_model.safetensors").is_file()
