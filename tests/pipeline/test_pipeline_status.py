"""StatusReporter driven through ART's methods, as PipelineTrainer drives it: no model."""

from __future__ import annotations

from typing import Any

import pytest

import art
from art.pipeline_trainer import StatusReporter


def _group(*rewards: float) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=r)
        for r in rewards
    )


def _line(reporter: StatusReporter, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    reporter.log_if_due(force=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[pipeline]")]
    assert len(lines) == 1
    return lines[0]


def test_the_line_shows_the_counts_the_trainer_noted(capsys: pytest.CaptureFixture[str]) -> None:
    taken = [0]
    reporter = StatusReporter(
        get_scenario_offset=lambda: taken[0], total_scenarios=10, num_workers=4
    )
    reporter.start(initial_step=3)
    taken[0] = 5
    for _ in range(3):
        reporter.note_rollout_started()
    reporter.note_rollout_finished(errored=True)
    for _ in range(3):
        reporter.note_group_enqueued(_group(0.0, 1.0))
    reporter.note_group_dequeued(_group(0.0, 1.0))
    reporter.note_stale(2)
    reporter.note_zero_variance_discarded(1)
    reporter.note_training_start(2)
    reporter.note_val_started(3)

    line = _line(reporter, capsys)
    for shown in [
        "step=3",
        "rollouts=2/4",
        "queued=2 (4 rollouts)",
        "training=2",
        "trained=0",
        "dropped=2 stale, 1 no-var, 1 errored",
        "scenarios=5/10",
        "val_running=3",
    ]:
        assert shown in line
    assert "reward_ewa" not in line  # nothing trained yet

    reporter.note_training_end()
    reporter.note_training_batch([_group(0.0, 1.0), _group(1.0, 1.0)], step=4, step_seconds=2.0)
    reporter.note_val_finished(3, 0.5)
    line = _line(reporter, capsys)
    for shown in [
        "step=4",
        "training=0",
        "trained=1",  # the group whose rewards are all equal counts as no-var
        "dropped=2 stale, 2 no-var, 1 errored",
        "reward_ewa=0.750",
        "step_seconds_ewa=2.00",
        "reward_std_ewa=0.250",
        "val=0.500@3",
    ]:
        assert shown in line
    assert "val_running" not in line
    reporter.close()


def test_reward_and_seconds_averages_match_a_hand_computation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reporter = StatusReporter(get_scenario_offset=lambda: 0, status_ewa_alpha=0.2)
    reporter.start()
    # batch mean rewards 1.0, 0.0, 0.5 and seconds 10, 20, 30, weight 0.2 on the newest:
    # rewards 1.0 -> 0.2*0 + 0.8*1.0 = 0.8 -> 0.2*0.5 + 0.8*0.8 = 0.74
    # seconds 10 -> 0.2*20 + 0.8*10 = 12 -> 0.2*30 + 0.8*12 = 15.6
    for step, (rewards, seconds) in enumerate(
        [((1.0, 1.0), 10.0), ((0.0, 0.0), 20.0), ((0.0, 1.0), 30.0)], start=1
    ):
        reporter.note_training_batch([_group(*rewards)], step=step, step_seconds=seconds)
    snapshot = reporter.snapshot()
    assert snapshot.reward_ewa == pytest.approx(0.74)
    assert snapshot.step_seconds_ewa == pytest.approx(15.6)
    # group stds 0, 0, 0.5 -> 0 -> 0 -> 0.2*0.5 = 0.1
    assert snapshot.reward_std_ewa == pytest.approx(0.1)
    line = _line(reporter, capsys)
    assert "reward_ewa=0.740" in line
    assert "step_seconds_ewa=15.60" in line
    assert "step=3" in line
    reporter.close()


def test_a_line_is_printed_once_started_and_then_every_interval(
    capsys: pytest.CaptureFixture[str],
) -> None:
    reporter = StatusReporter(get_scenario_offset=lambda: 0, log_interval_seconds=3600)
    reporter.log_if_due(force=True)  # not started: nothing to show
    assert capsys.readouterr().out == ""
    reporter.start(initial_step=0)
    reporter.log_if_due()  # the first is due at once
    assert capsys.readouterr().out.count("[pipeline]") == 1
    reporter.log_if_due()  # the next only an hour later
    assert capsys.readouterr().out == ""
    reporter.flush()
    assert capsys.readouterr().out.count("[pipeline]") == 1
    reporter.close()


def test_the_arguments_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        StatusReporter(lambda: 0)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("arguments", "name"),
    [
        ({"log_interval_seconds": 0}, "log_interval_seconds"),
        ({"log_interval_seconds": -1.0}, "log_interval_seconds"),
        ({"status_ewa_alpha": 0.0}, "status_ewa_alpha"),
        ({"status_ewa_alpha": 1.5}, "status_ewa_alpha"),
        ({"total_scenarios": -1}, "total_scenarios"),
        ({"num_workers": 0}, "num_workers"),
        ({"get_scenario_offset": 3}, "get_scenario_offset"),
    ],
)
def test_an_invalid_argument_raises_a_config_error_naming_it(
    arguments: dict[str, Any], name: str
) -> None:
    with pytest.raises(art.ConfigError, match=name) as raised:
        StatusReporter(**{"get_scenario_offset": lambda: 0, **arguments})
    assert raised.value.field == name


def test_the_bounds_themselves_are_accepted() -> None:
    StatusReporter(
        get_scenario_offset=lambda: 0, status_ewa_alpha=1.0, total_scenarios=0, num_workers=1
    )
