"""`art.metrics_taxonomy` and `art.MetricDefinition`, as ART 0.5.23 documents them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import art
import art.metrics_taxonomy as taxonomy

ART_NAMES = Path(__file__).resolve().parents[2] / "data" / "art_names"


def _group(*rewards: float, errors: int = 0, **metadata: art.MetadataValue) -> art.TrajectoryGroup:
    trajectories: list[art.Trajectory | BaseException] = [
        art.Trajectory(reward=reward) for reward in rewards
    ]
    trajectories += [RuntimeError("rollout failed") for _ in range(errors)]
    return art.TrajectoryGroup(trajectories, metadata=metadata)


@pytest.mark.parametrize("version", ["0.5.18", "0.5.23"])
def test_every_public_name_of_arts_module_is_here(version: str) -> None:
    modules = json.loads((ART_NAMES / f"{version}.json").read_text())["modules"]
    names = modules["art.metrics_taxonomy"]
    assert names, "ART's module has public names"
    assert sorted(set(names) - set(taxonomy.__all__)) == []
    for name in names:
        assert getattr(taxonomy, name) is not None, name
    assert art.metrics_taxonomy is taxonomy


def test_the_constants_are_arts_keys() -> None:
    assert taxonomy.TRAIN_GRADIENT_STEPS_KEY == "data/step_num_gradient_steps"
    assert taxonomy.SFT_METRIC_PREFIX == "sft"
    assert taxonomy.SFT_GRADIENT_STEP_KEY == "gradient_step"
    assert taxonomy.SFT_WANDB_GRADIENT_STEP_KEY == "sft/gradient_step"


def test_samples_are_averaged_per_key_over_the_samples_that_have_it() -> None:
    averaged = taxonomy.average_metric_samples(
        [{"loss/train": 1.0, "loss/grad_norm": 4}, {"loss/train": 3.0}, {"loss/train": 5.0}]
    )
    assert averaged == {"loss/train": 3.0, "loss/grad_norm": 4.0}
    assert isinstance(averaged["loss/grad_norm"], float)
    assert taxonomy.average_metric_samples([]) == {}


def test_the_gradient_step_count_is_kept_not_averaged_and_must_agree() -> None:
    key = taxonomy.TRAIN_GRADIENT_STEPS_KEY
    samples = [{key: 4.0, "loss/train": 1.0}, {key: 4.0, "loss/train": 2.0}]
    assert taxonomy.average_metric_samples(samples) == {key: 4.0, "loss/train": 1.5}
    with pytest.raises(ValueError, match="data/step_num_gradient_steps") as caught:
        taxonomy.average_metric_samples([{key: 4.0}, {key: 5.0}])
    assert isinstance(caught.value, art.ArtValueError)


def test_a_batch_summary_counts_groups_rollouts_and_trainable_groups() -> None:
    groups = [
        _group(1.0, 0.0, errors=1),  # trainable; three rollouts, one raised
        _group(0.5, 0.5),  # equal rewards: nothing to learn
        _group(1.0),  # one trajectory: nothing to compare it with
        _group(errors=2),  # only exceptions
        _group(0.0, 1e-13),  # equal within ART's tolerance
    ]
    summary = taxonomy.summarize_trajectory_groups(iter(groups))
    assert summary == taxonomy.TrajectoryBatchSummary(
        num_scenarios=5,
        num_trajectories=10,
        num_groups_submitted=5,
        num_groups_trainable=1,
        scenario_ids=[],
    )


def test_scenario_ids_come_from_group_then_trajectory_metadata_once_each() -> None:
    from_trajectory = art.TrajectoryGroup(
        [art.Trajectory(reward=0.0), art.Trajectory(reward=1.0, metadata={"scenario_id": 7})]
    )
    groups = [
        _group(1.0, scenario_id="b"),
        from_trajectory,
        _group(0.0, scenario_id="b"),
        _group(0.0),
        _group(0.0, scenario_id="a"),
    ]
    summary = taxonomy.summarize_trajectory_groups(groups)
    assert summary.scenario_ids == ["b", "7", "a"]
    assert summary.num_scenarios == 5  # ART counts groups, not distinct ids


def test_a_summary_becomes_arts_data_metrics() -> None:
    summary = taxonomy.summarize_trajectory_groups([_group(1.0, 0.0), _group(1.0, errors=1)])
    train = taxonomy.build_data_metrics_from_summary(summary, include_trainable_groups=True)
    assert train == {
        "data/step_num_scenarios": 2.0,
        "data/step_num_trajectories": 4.0,
        "data/step_num_groups_submitted": 2.0,
        "data/step_num_groups_trainable": 1.0,
    }
    val = taxonomy.build_training_summary_metrics(summary, include_trainable_groups=False)
    assert val == {k: v for k, v in train.items() if k != "data/step_num_groups_trainable"}


def test_metric_definition_is_arts_top_level_name_for_the_one_in_art_metrics() -> None:
    import art.metrics

    assert "MetricDefinition" in art.__all__
    assert art.MetricDefinition is art.metrics.MetricDefinition
