"""The trajectory model: plain data that round-trips, and says clearly what is wrong."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
from helpers import WEATHER_TOOL, sampled_choice, tool_trajectory
from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion import Choice

import art
from art.core.metrics.batch_metrics import group_metrics
from art.core.store.parquet import read_groups, write_groups


def test_messages_turn_choices_into_assistant_messages_with_tool_calls() -> None:
    trajectory = tool_trajectory(1.0)
    messages = trajectory.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = messages[2]["tool_calls"][0]  # type: ignore[typeddict-item]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert messages[4]["content"] == "It is sunny in Paris."
    assert all(isinstance(m, dict) for m in messages)


def test_json_round_trip_is_lossless() -> None:
    trajectory = tool_trajectory(0.75)
    trajectory.additional_histories.append(
        art.History(messages_and_choices=[{"role": "user", "content": "sum"}, sampled_choice("ok")])
    )
    again = art.Trajectory.model_validate_json(trajectory.model_dump_json())
    assert again == trajectory
    assert isinstance(again.messages_and_choices[2], Choice)
    assert again.messages_and_choices[2].logprobs is not None
    assert isinstance(again.additional_histories[0].messages_and_choices[1], Choice)
    assert again.tools == [WEATHER_TOOL]


def test_choice_extra_fields_such_as_token_ids_survive_a_round_trip() -> None:
    choice = Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "a"},
            "token_ids": [11, 12],
        }
    )
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice])
    again = art.Trajectory.model_validate_json(trajectory.model_dump_json())
    assert (again.messages_and_choices[1].model_extra or {})["token_ids"] == [11, 12]  # type: ignore[union-attr]


def test_a_plain_chat_completion_message_is_kept_as_context() -> None:
    message = ChatCompletionMessage(role="assistant", content="hi")
    trajectory = art.Trajectory(messages_and_choices=[message])  # type: ignore[list-item]
    assert trajectory.messages_and_choices == [{"role": "assistant", "content": "hi"}]


def test_a_message_without_a_role_is_named_with_its_position() -> None:
    with pytest.raises(ValueError, match=r"messages_and_choices\.1[\s\S]*no 'role'"):
        art.Trajectory(messages_and_choices=[{"role": "user", "content": "a"}, {"content": "b"}])  # type: ignore[list-item]


def test_unknown_roles_and_tool_messages_without_ids_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown role 'robot'"):
        art.Trajectory(messages_and_choices=[{"role": "robot", "content": "x"}])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="tool_call_id"):
        art.Trajectory(messages_and_choices=[{"role": "tool", "content": "x"}])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards_are_rejected_on_assignment(bad: float) -> None:
    trajectory = art.Trajectory()
    with pytest.raises(ValueError, match="reward: must be finite"):
        trajectory.reward = bad
    assert trajectory.reward == 0.0


@pytest.mark.parametrize("bad", ["1.0", None, True, [1.0]])
def test_rewards_that_are_not_numbers_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="reward: must be a number"):
        art.Trajectory(reward=bad)  # type: ignore[arg-type]


def test_numpy_like_reals_are_accepted_as_rewards() -> None:
    from fractions import Fraction

    assert art.Trajectory(reward=Fraction(1, 4)).reward == 0.25  # type: ignore[arg-type]
    assert art.Trajectory(reward=1).reward == 1.0


def test_metadata_that_cannot_be_stored_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"metadata\['ids'\].*cannot be stored"):
        art.Trajectory(metadata={"ids": [1, 2]})  # type: ignore[dict-item]


def test_metrics_must_be_numbers() -> None:
    with pytest.raises(ValueError, match=r"metrics\['note'\]"):
        art.Trajectory(metrics={"note": "text"})  # type: ignore[dict-item]


def test_unknown_fields_are_an_error_not_ignored() -> None:
    with pytest.raises(ValueError, match="rewards"):
        art.Trajectory(rewards=1.0)  # type: ignore[call-arg]


def test_log_finish_and_track_duration_record_into_the_trajectory() -> None:
    trajectory = art.Trajectory()
    trajectory.log("step one")

    async def work() -> None:
        async with trajectory.track_duration("tool"):
            await asyncio.sleep(0.01)
        async with trajectory.track_duration("tool"):
            await asyncio.sleep(0.01)

    asyncio.run(work())
    assert trajectory.finish() is trajectory
    assert trajectory.logs == ["step one"]
    assert trajectory.metrics["tool_duration"] >= 0.02
    assert trajectory.metrics["duration"] >= trajectory.metrics["tool_duration"]


def test_a_group_records_exceptions_as_data_and_round_trips() -> None:
    try:
        raise KeyError("missing scenario")
    except KeyError as error:
        failure = error
    group = art.TrajectoryGroup(
        [tool_trajectory(1.0), failure, tool_trajectory(0.0)], metadata={"scenario": 3}
    )
    assert len(group) == 2
    assert [t.reward for t in group] == [1.0, 0.0]
    assert group.exceptions[0].type == "builtins.KeyError"
    assert "missing scenario" in group.exceptions[0].traceback
    again = art.TrajectoryGroup.model_validate_json(group.model_dump_json())
    assert again == group
    assert isinstance(again, art.TrajectoryGroup)


def test_a_group_of_awaitables_is_awaitable() -> None:
    async def rollout(reward: float) -> art.Trajectory:
        return art.Trajectory(reward=reward)

    async def main() -> art.TrajectoryGroup:
        return await art.TrajectoryGroup(rollout(r) for r in (0.0, 1.0))

    group = asyncio.run(main())
    assert isinstance(group, art.TrajectoryGroup)
    assert [t.reward for t in group] == [0.0, 1.0]


def test_a_group_keeps_its_own_metrics_and_logs_as_arts_does(tmp_path: Path) -> None:
    """ART 0.5.18's `TrajectoryGroup(..., metrics=, logs=)`: kept through awaiting, copies,
    JSON and Parquet, and logged as `group_<name>`, the mean over groups with trajectories."""

    async def rollout(reward: float) -> art.Trajectory:
        return art.Trajectory(reward=reward)

    async def main() -> art.TrajectoryGroup:
        return await art.TrajectoryGroup(
            (rollout(r) for r in (0.0, 1.0)), metrics={"difficulty": 2}, logs=["built"]
        )

    group = asyncio.run(main())
    assert group.metrics == {"difficulty": 2}
    group.log("judged")
    assert group.logs == ["built", "judged"]
    copied, deep = copy.copy(group), copy.deepcopy(group)
    copied.metrics["other"] = 1.0
    deep.logs.append("deep")
    assert group.metrics == {"difficulty": 2}
    assert group.logs == ["built", "judged"]

    again = art.TrajectoryGroup.model_validate_json(group.model_dump_json())
    assert again == group
    assert art.TrajectoryGroup.model_validate(group.model_dump()) == group

    failed_only = art.TrajectoryGroup([ValueError("x")], metrics={"difficulty": 100})
    second = art.TrajectoryGroup([art.Trajectory(reward=0.5)], metrics={"difficulty": 4.0})
    path = tmp_path / "0000.parquet"
    write_groups(path, [group, failed_only, second], split="val", step=0)
    assert read_groups(path) == [group, failed_only, second]
    row = group_metrics([group, failed_only, second])
    assert row["group_difficulty"] == 3.0  # (2 + 4) / 2: the group of exceptions is left out

    with pytest.raises(art.TrajectoryValidationError, match=r"metrics\['level'\]"):
        art.TrajectoryGroup([], metrics={"level": "hard"})  # type: ignore[dict-item]
    with pytest.raises(art.TrajectoryValidationError, match=r"logs\[0\]"):
        art.TrajectoryGroup([], logs=[3])  # type: ignore[list-item]


def test_a_group_of_something_else_names_the_item() -> None:
    with pytest.raises(ValueError, match=r"trajectories\[1\]: expected a Trajectory, got int"):
        art.TrajectoryGroup([art.Trajectory(), 5])  # type: ignore[list-item]


def test_train_config_is_validated_and_frozen() -> None:
    assert art.TrainConfig(learning_rate=1e-5).learning_rate == 1e-5
    with pytest.raises(ValueError, match="learning_rate"):
        art.TrainConfig(learning_rate=-1)
    with pytest.raises(ValueError, match="learnin_rate"):
        art.TrainConfig(learnin_rate=1e-5)  # type: ignore[call-arg]
    config = art.TrainConfig()
    with pytest.raises(ValueError, match="frozen"):
        config.beta = 0.1  # type: ignore[misc]


def test_internal_config_rejects_half_a_gpu_split() -> None:
    with pytest.raises(ValueError, match="set both"):
        art.dev.InternalModelConfig(trainer_gpu_ids=[0])
    with pytest.raises(ValueError, match="overlap"):
        art.dev.InternalModelConfig(trainer_gpu_ids=[0], inference_gpu_ids=[0])
    assert art.dev.InternalModelConfig(trainer_gpu_ids=[0], inference_gpu_ids=[1])
