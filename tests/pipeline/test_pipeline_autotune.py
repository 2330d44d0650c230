"""art.pipeline_tuner: the tuner's decisions from measured windows, and a real tuned run.

The decision tests feed `PipelineAutotuner` the per-step measurements PipelineTrainer
reports (art.pipeline_tuner.autotune.STEP_METRICS) and check the action it takes; the
run test trains the real default model with `autotune=` and checks the worker count moved.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_pipeline_trainer import (  # the module's fixtures and rollout
    backend,  # noqa: F401
    backend_path,  # noqa: F401
    dedicated_model,
    rollout,
    scenario,
    store_dir,
)

import art
from art.local import LocalBackend
from art.pipeline_trainer import PipelineTrainer
from art.pipeline_tuner import PipelineAutotuneConfig, PipelineMetric, PipelineTuneSettings
from art.pipeline_tuner.attachment import PipelineAutotunerAttachment
from art.pipeline_tuner.autotune import (
    PipelineAutotuner,
    build_initial_settings,
    freshness_worker_limit,
)
from art.pipeline_tuner.config import UNMEASURED_FIELDS
from art.pipeline_tuner.store import PipelineTunerProfileStore
from art.pipeline_tuner.worker_controller import RolloutWorkerController

SETTINGS = PipelineTuneSettings(
    num_rollout_workers=8,
    min_batch_size=8,
    max_batch_size=8,
    queue_maxsize=8,
    target_groups_per_step=8,
)


def tuner(**config: float | int | str) -> PipelineAutotuner:
    return PipelineAutotuner(
        config=PipelineAutotuneConfig(mode="online", warmup_ignore_steps=0, **config),
        settings=SETTINGS,
        model_name="m",
        backend_name="LocalBackend",
        packed_sequence_length=0,
        target_packed_sequences=1,
        inference_gpu_count=1,
        policy_age_limit_steps=4.0,
    )


def feed(
    t: PipelineAutotuner,
    step: int,
    *,
    wall: float = 10.0,
    collect: float = 5.0,
    put_wait: float = 0.0,
    stale: int = 0,
) -> object:
    values = {
        "time/step_wall_s": wall,
        "time/step_collect_batch_s": collect,
        "time/step_rollout_s": 20.0,
        "queue/put_wait_s": put_wait,
        "data/step_num_groups_trainable": 8.0,
        "discarded/step/stale_groups": float(stale),
        "discarded/step/zero_variance_groups": 0.0,
        "objective/score": 0.5,
    }
    decision = None
    for name, value in values.items():
        decision = t.on_metric(PipelineMetric(name=name, value=value, t_s=step * wall, step=step))
    return decision


def test_an_underfed_trainer_adds_workers_after_sustained_evidence() -> None:
    t = tuner(window_steps=1, worker_load_change_windows=2)
    first = feed(t, 1, collect=5.0)  # half of every step waits for rollouts
    assert first is not None
    assert first.action == "hold"
    assert "awaits sustained evidence (1/2)" in first.reason
    second = feed(t, 2, collect=5.0)
    assert second is not None
    assert second.action == "increase_workers"
    assert second.updated.num_rollout_workers == 10  # + max(worker_step, 10% of 8)
    assert t.settings.num_rollout_workers == 10


def test_a_busy_trainer_never_adds_workers_and_raises_the_min_batch_instead() -> None:
    t = tuner(window_steps=1, worker_load_change_windows=1)
    t.settings = SETTINGS.model_copy(update={"min_batch_size": 4})
    decision = feed(t, 1, collect=0.1)  # 1% waiting: the trainer is fed
    assert decision is not None
    assert decision.action == "raise_min_batch_size"
    assert decision.updated.num_rollout_workers == 8
    assert decision.updated.min_batch_size == 5


def test_a_stale_backlog_raises_the_min_batch_then_removes_workers() -> None:
    t = tuner(window_steps=1, worker_load_change_windows=1)
    t.settings = SETTINGS.model_copy(update={"min_batch_size": 7})
    first = feed(t, 1, stale=4)  # 4 of 12 groups dropped stale: over stale_high_frac
    assert first is not None
    assert first.action == "raise_min_batch_size"
    second = feed(t, 2, stale=4)  # min batch is at max: now workers go
    assert second is not None
    assert second.action == "decrease_workers"
    assert second.updated.num_rollout_workers == 6


def test_queue_backpressure_holds_the_workers() -> None:
    t = tuner(window_steps=1, worker_load_change_windows=1)
    decision = feed(t, 1, collect=1.0, put_wait=20.0)  # half of rollout time waits for room
    assert decision is not None
    assert decision.updated.num_rollout_workers == 8
    assert decision.reason == "completed-group queue backpressure is active"


def test_inference_pressure_from_gauge_samples_stops_worker_growth() -> None:
    t = tuner(window_steps=1, worker_load_change_windows=1)
    for second in range(11):  # 4 requests running, 4 waiting for capacity: ratio 1.0
        t.on_vllm_pressure_sample(t_s=float(second), running=4.0, waiting_capacity=4.0)
    decision = feed(t, 1, collect=5.0)
    assert decision is not None
    assert decision.state == "inference_over_train_under"
    assert decision.stats is not None
    assert decision.stats.vllm_pressure == pytest.approx(1.0)
    assert decision.updated.num_rollout_workers == 8


def test_warmup_and_window_steps_delay_the_first_decision() -> None:
    t = PipelineAutotuner(
        config=PipelineAutotuneConfig(mode="online", warmup_ignore_steps=2, window_steps=2),
        settings=SETTINGS,
        model_name=None,
        backend_name=None,
        packed_sequence_length=0,
        target_packed_sequences=1,
        inference_gpu_count=1,
        policy_age_limit_steps=4.0,
    )
    assert [feed(t, step) is not None for step in range(1, 6)] == [
        False,
        False,
        False,
        True,
        False,
    ]


def test_initial_settings_and_the_freshness_limit() -> None:
    config = PipelineAutotuneConfig(mode="online")
    settings = build_initial_settings(
        config=config,
        inference_gpu_count=2,
        target_packed_sequences=1,
        policy_age_limit_steps=4.0,
        rollout_worker_capacity=None,
    )
    # 8 model calls per device x 2; batches of 8 groups; the queue holds one batch.
    assert (settings.num_rollout_workers, settings.max_batch_size, settings.queue_maxsize) == (
        16,
        8,
        8,
    )
    # 4 steps x 8 groups of completed work, one batch queued: 24 / 0.75 = 32 workers.
    limit = freshness_worker_limit(
        target_groups_per_step=8,
        limit_steps_off_policy=4.0,
        running_reserve_fraction=0.75,
        worker_step=2,
    )
    assert limit == 32


def test_fields_without_a_measurement_here_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(art.ConfigError, match="Megatron"):
        PipelineAutotunerAttachment(PipelineAutotuneConfig(target_group_max_increase=2))
    assert "vllm_metric_interval_s" in UNMEASURED_FIELDS
    model = art.TrainableModel(
        name="tune-refusals",
        project="pipeline",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        _internal_config=art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[]),
    )
    local = LocalBackend(path=tmp_path)
    for kwargs, field in [
        ({"autotune": PipelineAutotuneConfig(mode="online", packing_trials=64)}, "packing_trials"),
        ({"autotune": PipelineAutotuneConfig(mode="online"), "num_rollout_workers": 3}, None),
        ({"autotune": {"mode": "online"}}, None),
    ]:
        with pytest.raises(art.ConfigError) as raised:
            PipelineTrainer(model, local, rollout, [], None, **kwargs)  # type: ignore[arg-type]
        expected = f"autotune.{field}" if field else ("num_rollout_workers", "autotune")
        assert raised.value.field in (expected if isinstance(expected, tuple) else (expected,))


@pytest.mark.model
async def test_a_tuned_run_grows_its_workers_and_saves_its_profile(
    backend: LocalBackend,  # noqa: F811
    backend_path: Path,  # noqa: F811
) -> None:
    model = await dedicated_model(backend, "tuned")
    autotune = PipelineAutotuneConfig(
        mode="online",
        window_steps=1,
        warmup_ignore_steps=0,
        worker_step=1,
        worker_load_change_windows=1,
        initial_model_calls_per_inference_gpu=1,
        initial_min_groups_per_packed_sequence=1,
        initial_max_groups_per_packed_sequence=1,
    )
    trainer = PipelineTrainer(
        model,
        backend,
        rollout,
        [scenario(i) for i in range(4)],
        None,
        autotune=autotune,
        max_steps=2,
        learning_rate=1e-4,
        eval_at_start=False,
    )
    await trainer.train()

    profile = json.loads(
        (store_dir(backend_path, model) / "pipeline_tuner" / "latest.json").read_text()
    )
    first = profile["decisions"][0]
    assert first["previous"]["num_rollout_workers"] == 1  # 1 call x 1 CPU engine
    # The first batch waits for the first rollouts: the trainer is underfed by construction.
    assert first["stats"]["trainer_underfeed_score"] > autotune.trainer_load_under_score
    assert first["action"] == "increase_workers"
    assert first["updated"]["num_rollout_workers"] == 2
    assert trainer._workers.peak_workers == 2  # the second worker really ran
    assert trainer._workers.started_workers >= 2
    store = PipelineTunerProfileStore.for_model(model)
    assert store.load(None).settings.num_rollout_workers >= 2


async def test_the_worker_controller_retires_surplus_workers_after_their_rollout() -> None:
    import asyncio

    class Host:
        def __init__(self) -> None:
            self.stop_requested = asyncio.Event()
            self.finished: list[int] = []
            self.controller: RolloutWorkerController

        async def run_rollout_worker(self, worker_id: int) -> None:
            while self.controller.worker_allowed(worker_id):  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # one "rollout"
            self.finished.append(worker_id)

        def rollout_worker_ended(self, task: asyncio.Task[None]) -> None:
            pass

    host = Host()
    host.controller = RolloutWorkerController(host, 3)
    runner = asyncio.create_task(host.controller.run())
    while host.controller.live_workers < 3:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    host.controller.set_target(1)
    while len(host.finished) < 2:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    assert sorted(host.finished) == [1, 2]  # the newest two retired, worker 0 runs on
    host.controller.set_target(2)
    while host.controller.live_workers < 2:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    assert host.controller.started_workers == 4  # a fresh id, never a reused one
    host.stop_requested.set()
    await runner
