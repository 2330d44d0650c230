"""ART's `art.metrics`: `MetricsBuilder` (roll-ups, running totals, contexts) and the
model's builder, whose costs reach `history.jsonl` under ART's `costs/...` names."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import art
from art.core.store.model_store import ModelStore
from art.metrics import (
    PIPELINE_RL_DASHBOARD_DEFAULT_METRICS,
    PIPELINE_RL_METRIC_DEFINITIONS,
    PIPELINE_RL_SCORE_METRICS,
    MetricsBuilder,
    is_builder_managed_metric,
    is_cumulative_metric_key,
    to_cumulative_metric_key,
    track_api_cost,
)


def flush(builder: MetricsBuilder) -> dict[str, float]:
    return asyncio.run(builder.flush())


def test_costs_roll_up_to_parents_and_all_and_run_up_across_flushes() -> None:
    builder = MetricsBuilder("train")
    builder.add_cost("train/judge/ruler", 0.5)
    builder.add_cost("train/judge/ruler", 0.25)  # repeated adds sum
    builder.add_cost("train/gpu", 1.0)
    builder.add_cost("eval/judge/ruler", 2.0)
    first = flush(builder)
    assert first == {
        "costs/train/judge/ruler": 0.75,
        "costs/train/gpu": 1.0,
        "costs/eval/judge/ruler": 2.0,
        "costs/train/judge": 0.75,
        "costs/train": 1.75,
        "costs/eval/judge": 2.0,
        "costs/eval": 2.0,
        "costs/all": 3.75,
        "costs/cum/train/judge/ruler": 0.75,
        "costs/cum/train/gpu": 1.0,
        "costs/cum/eval/judge/ruler": 2.0,
        "costs/cum/train/judge": 0.75,
        "costs/cum/train": 1.75,
        "costs/cum/eval/judge": 2.0,
        "costs/cum/eval": 2.0,
        "costs/cum/all": 3.75,
    }
    builder.add_cost("train/gpu", 1.0)
    second = flush(builder)
    assert second["costs/all"] == 1.0
    assert second["costs/cum/all"] == 4.75
    assert second["costs/cum/train/gpu"] == 2.0
    assert "costs/eval" not in second
    assert flush(builder) == {}, "a flush empties the step"


def test_keys_are_checked_before_they_are_added() -> None:
    builder = MetricsBuilder("train")
    builder.add_cost("train/judge", 1.0)
    with pytest.raises(ValueError, match="one inside the other"):
        builder.add_cost("train/judge/ruler", 1.0)
    with pytest.raises(ValueError, match="running-total"):
        builder.add_metric("costs/cum/x", 1.0)
    with pytest.raises(ValueError, match="no section"):
        builder.add_metric("loss", 1.0)
    with pytest.raises(ValueError, match="cost_context"):
        MetricsBuilder("")
    assert flush(builder) == {
        "costs/train/judge": 1.0,
        "costs/train": 1.0,
        "costs/all": 1.0,
        "costs/cum/train/judge": 1.0,
        "costs/cum/train": 1.0,
        "costs/cum/all": 1.0,
    }


def test_data_and_timing_give_running_totals_scenarios_and_throughput() -> None:
    builder = MetricsBuilder("train")
    builder.add_data(step_num_scenarios=2, step_rollout_tokens=300, scenario_ids=["a", "b"])
    builder.add_user_timing(step_wall_s=4.0, step_rollout_s=3.0)
    with builder.measure("time/step_eval_s"):
        pass
    first = flush(builder)
    assert first["data/step_rollout_tokens"] == 300.0
    assert first["data/cum/rollout_tokens"] == 300.0
    assert first["time/cum/wall_s"] == 4.0
    assert first["time/step_eval_s"] >= 0.0
    assert first["data/cum/num_unique_scenarios"] == 2.0
    assert first["throughput/avg_rollout_tok_per_s"] == pytest.approx(100.0)
    # ART 0.5.18's names of the same values.
    builder.add_data(step_actor_tokens=100, scenario_ids=["b", "c"])
    builder.add_user_timing(step_actor_s=1.0)
    builder.add_idle_times(step_trainer_idle_s=2.0, step_actor_idle_s=0.5)
    second = flush(builder)
    assert second["data/cum/rollout_tokens"] == 400.0
    assert second["data/cum/num_unique_scenarios"] == 3.0
    assert second["throughput/avg_rollout_tok_per_s"] == pytest.approx(100.0)
    assert second["time/step_rollout_idle_s"] == 0.5
    assert second["time/cum/trainer_idle_s"] == 2.0
    with pytest.raises(ValueError, match="step_actor_tokens"):
        builder.add_data(step_rollout_tokens=1, step_actor_tokens=1)


def test_contexts_share_running_totals_and_keep_their_own_pending_step() -> None:
    root = MetricsBuilder("train")
    evaluation = root.for_cost_context(" eval ")
    assert root.for_cost_context("train") is root
    evaluation.add_cost("eval/judge/ruler", 1.0)
    root.add_cost("train/judge/ruler", 2.0)
    assert set(flush(evaluation)) >= {"costs/eval", "costs/cum/all"}
    assert flush(evaluation) == {}
    train = flush(root)
    assert train["costs/all"] == 2.0
    assert train["costs/cum/all"] == 3.0, "the running total is shared"

    restored = MetricsBuilder("train")
    restored.load_state_dict(root.state_dict())
    restored.add_cost("train/gpu", 1.0)
    assert flush(restored)["costs/cum/all"] == 4.0


def test_the_active_builder_is_per_context_and_reset_after_the_block() -> None:
    with pytest.raises(LookupError):
        MetricsBuilder.get_active()
    builder = MetricsBuilder("train")
    with builder.activate_context() as active:
        assert MetricsBuilder.get_active() is active is builder
    with pytest.raises(LookupError):
        MetricsBuilder.get_active()


def test_key_helpers_and_pipeline_definitions_are_arts() -> None:
    assert to_cumulative_metric_key("time/step_wall_s") == "time/cum/wall_s"
    assert to_cumulative_metric_key("costs/train/gpu") == "costs/cum/train/gpu"
    assert is_cumulative_metric_key("data/cum/x")
    assert not is_cumulative_metric_key("data/x")
    with pytest.raises(ValueError, match="already a running total"):
        to_cumulative_metric_key("data/cum/x")
    assert is_builder_managed_metric("costs/gpu")
    assert is_builder_managed_metric("data/step_x")
    assert not is_builder_managed_metric("train/reward")
    keys = [d.key for d in PIPELINE_RL_METRIC_DEFINITIONS]
    assert len(keys) == len(set(keys)) == 40
    assert PIPELINE_RL_SCORE_METRICS[0] == PIPELINE_RL_DASHBOARD_DEFAULT_METRICS[0]
    assert "objective/score" in PIPELINE_RL_SCORE_METRICS
    assert "vllm/prefix_cache_hit_rate" in PIPELINE_RL_DASHBOARD_DEFAULT_METRICS
    assert callable(track_api_cost)


async def test_the_models_costs_reach_its_history_under_arts_names(tmp_path: Path) -> None:
    from art.local import LocalBackend

    backend = LocalBackend(path=str(tmp_path))
    model = art.Model(name="agent", project="costs")
    await model.register(backend)
    assert model.metrics_builder("train") is model.metrics_builder().for_cost_context("train")

    usage: dict[str, object] = {"usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0}}

    @track_api_cost(source="tools/search", provider="openai", model_name="openai/gpt-4.1")
    async def search() -> dict[str, object]:
        return usage

    token = model.activate_metrics_context("train")
    try:
        await search()
    finally:
        token.var.reset(token)
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "hi"}],
        reward=1.0,
        metrics={"costs/train/tools/calc": 0.5, "turns": 2},
    )
    group = art.TrajectoryGroup([trajectory, trajectory.model_copy(deep=True)])
    await model.log([group], split="train", metrics={"costs/train/gpu": 0.25, "extra": 1.0})

    with model.metrics_builder("eval").activate_context():
        await search()
    await model.log(metrics={"score": 1.0}, split="val")

    rows = ModelStore(tmp_path, "costs", "agent").read_history()
    train, val = rows
    assert train["costs/train/tools/search"] == pytest.approx(2.0)
    assert train["costs/train/tools/calc"] == pytest.approx(1.0), "summed, not averaged"
    assert train["costs/train/gpu"] == 0.25
    assert train["costs/train"] == pytest.approx(3.25)
    assert train["costs/all"] == pytest.approx(3.25)
    assert train["train/turns"] == 2
    assert train["train/extra"] == 1.0
    assert not any(key.startswith("train/costs") for key in train)
    assert val["costs/eval/tools/search"] == pytest.approx(2.0)
    assert val["costs/all"] == pytest.approx(2.0)
    assert val["costs/cum/all"] == pytest.approx(5.25)
    assert val["val/score"] == 1.0
    await backend.close()


async def test_running_totals_continue_from_the_models_state_json(tmp_path: Path) -> None:
    """A second `Model` object (what a new process builds) over a second backend on the
    same path: its builder shares nothing in memory with the first, so the totals it
    continues come from `state.json`."""
    from art.local import LocalBackend
    from art.model import METRICS_BUILDER_STATE_KEY

    store = ModelStore(tmp_path, "costs", "agent")
    first = art.Model(name="agent", project="costs")
    await first.register(LocalBackend(path=str(tmp_path)))
    first.metrics_builder().add_cost("train/gpu", 1.5)
    first.metrics_builder().add_data(scenario_ids=["a", "b"])
    await first.log(metrics={"score": 1.0}, split="train")
    saved = json.loads(store.state_json.read_text())[METRICS_BUILDER_STATE_KEY]
    assert saved["cum_state"]["costs/cum/all"] == 1.5
    assert saved["unique_scenario_ids"] == ["a", "b"]

    second = art.Model(name="agent", project="costs")
    second.metrics_builder().add_cost("train/gpu", 0.25)  # pending before register: kept
    await second.register(LocalBackend(path=str(tmp_path)))
    second.metrics_builder().add_data(scenario_ids=["b", "c"])
    await second.log(metrics={"score": 1.0}, split="train")
    row = store.read_history()[-1]
    assert row["costs/train/gpu"] == 0.25, "the step's own cost"
    assert row["costs/cum/all"] == pytest.approx(1.75), "continued from the first run"
    assert row["data/cum/num_unique_scenarios"] == 3
    saved = json.loads(store.state_json.read_text())[METRICS_BUILDER_STATE_KEY]
    assert saved["cum_state"]["costs/cum/all"] == pytest.approx(1.75)

    other = art.Model(name="agent", project="other")  # another model starts at 0
    await other.register(LocalBackend(path=str(tmp_path)))
    other.metrics_builder().add_cost("train/gpu", 1.0)
    await other.log(metrics={"score": 1.0}, split="train")
    assert ModelStore(tmp_path, "other", "agent").read_history()[-1]["costs/cum/all"] == 1.0


async def test_an_unregistered_models_totals_continue_under_its_base_path(tmp_path: Path) -> None:
    for expected in (1.0, 2.0):
        model = art.Model(name="judge", project="costs", base_path=str(tmp_path))
        model.metrics_builder("eval").add_cost("eval/judge", 1.0)
        await model.log(metrics={"score": 1.0}, split="val")
        row = ModelStore(tmp_path, "costs", "judge").read_history()[-1]
        assert row["costs/cum/all"] == expected


async def test_log_with_empty_metrics_flushes_the_builder_as_arts_does(tmp_path: Path) -> None:
    model = art.Model(name="judge", project="costs", base_path=str(tmp_path))
    store = ModelStore(tmp_path, "costs", "judge")
    await model.log(metrics={}, split="val")  # nothing held: no row
    assert store.read_history() == []
    model.metrics_builder("eval").add_cost("eval/judge", 0.5)
    await model.log(trajectories=None, split="val", metrics={})
    (row,) = store.read_history()
    assert row["costs/eval/judge"] == 0.5
    assert row["costs/cum/all"] == 0.5
    await model.log(metrics={}, split="val")  # flushed: nothing is left to log twice
    assert len(store.read_history()) == 1
    with pytest.raises(art.ConfigError, match="trajectories"):
        await model.log(split="val")  # neither trajectories nor metrics= given


def test_a_model_with_pending_costs_pickles_and_copies() -> None:
    import pickle

    model = art.Model(name="agent", project="costs")
    model.metrics_builder().add_cost("train/gpu", 1.0)
    for copied in (pickle.loads(pickle.dumps(model)), model.model_copy(deep=True)):
        assert flush(copied.metrics_builder())["costs/all"] == 1.0
    assert flush(model.metrics_builder())["costs/all"] == 1.0, "the original keeps its own"
