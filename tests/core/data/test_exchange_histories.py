"""Captured exchanges as conversations: grouping, translation, validation, storage, display,
and `art.tokenize`/`art.tensorize` on them.

The exchanges are built from JSON response bodies in each protocol's documented shape,
with our endpoint's four extension fields where the answer was sampled here.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

import art
from art.core.data.exchange_histories import fill_policy_versions, histories_of
from art.core.data.exchanges import (
    ChatCompletionsExchange,
    CompletionsExchange,
    MessagesExchange,
    ResponsesExchange,
    TrajectoryExchanges,
)
from art.core.data.tokenized import TokenFlag
from art.core.data.validation import check_trainable, coerce_groups
from art.core.store.model_store import ModelStore
from art.core.store.parquet import read_groups, read_trajectory_groups_parquet, write_groups
from art.pipeline._staleness import choice_versions
from art.runtime.trainer.tokenize import tokenize_trajectory
from art.viewer import locate, read_project

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
SYSTEM = {"role": "system", "content": "You are terse."}
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}


def ours(prompt: list[int], tokens: list[int], version: int | None = 0) -> dict[str, Any]:
    """Our endpoint's four fields for an answer sampled from `prompt`."""
    return {
        "prompt_token_ids": prompt,
        "token_ids": tokens,
        "token_logprobs": [-0.5] * len(tokens),
        "policy_version": version,
    }


def chat(
    messages: list[dict[str, Any]],
    answers: list[tuple[str, dict[str, Any] | None]],
    second: float,
    *,
    model: str = "agent",
    tools: list[dict[str, Any]] | None = None,
) -> ChatCompletionsExchange:
    request: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        request["tools"] = tools
    response = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
                "logprobs": None,
                **(extra or {}),
            }
            for i, (text, extra) in enumerate(answers)
        ],
    }
    return ChatCompletionsExchange.model_validate(
        {
            "start_time": T0 + timedelta(seconds=second),
            "end_time": T0 + timedelta(seconds=second + 0.5),
            "request": request,
            "response": response,
        }
    )


def captured(*exchanges: Any, reward: float = 0.0) -> art.Trajectory:
    found = TrajectoryExchanges()
    for exchange in exchanges:
        found.add(exchange)
    return art.Trajectory(exchanges=found, reward=reward)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def agent_loop() -> art.Trajectory:
    """Two turns of one conversation: the second prompt extends the first's ids."""
    first = chat([SYSTEM, user("Hi")], [("Hello.", ours([1, 2, 3], [4, 5]))], 0)
    history = [SYSTEM, user("Hi"), {"role": "assistant", "content": "Hello."}, user("Bye")]
    second = chat(history, [("Bye.", ours([1, 2, 3, 4, 5, 6, 7], [8, 9], 1))], 1)
    return captured(first, second, reward=1.0)


# --- grouping -----------------------------------------------------------------------------


def test_a_multi_turn_agent_loop_is_one_conversation_of_trained_choices() -> None:
    trajectory = agent_loop()
    [history] = histories_of(trajectory)
    items = history.messages_and_choices
    assert [type(item).__name__ for item in items] == ["dict", "dict", "Choice", "dict", "Choice"]
    assert trajectory.messages() == [
        SYSTEM,
        user("Hi"),
        {"role": "assistant", "content": "Hello."},
        user("Bye"),
        {"role": "assistant", "content": "Bye."},
    ]
    last = items[-1]
    assert isinstance(last, Choice)
    assert (last.model_extra or {})["token_ids"] == [8, 9]
    assert trajectory.history().messages() == trajectory.messages()

    # The trainer walks it as one sequence: the prompt delta is context.
    [sequence] = tokenize_trajectory(trajectory, None, group_index=0, trajectory_index=0)  # type: ignore[arg-type]
    assert sequence.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert sequence.trained == [False, False, False, True, True, False, False, True, True]
    assert all(sequence.exact)


def test_a_walk_parses_the_exchanges_once_and_sees_an_exchange_added() -> None:
    trajectory = agent_loop()
    twin = agent_loop()
    checked = histories_of(trajectory)  # as check_trainable reads them
    again = histories_of(trajectory)  # as the tokenizer reads them, in this process
    assert [id(h) for h in again] == [id(h) for h in checked]  # built once
    assert trajectory == twin  # what was built is kept outside the model
    import pickle

    copied = pickle.loads(pickle.dumps(trajectory))  # the child service's copy
    assert [h.messages() for h in histories_of(copied)] == [h.messages() for h in checked]
    trajectory.exchanges.add(chat([user("New")], [("Hey.", ours([7], [8]))], 2))
    grown = histories_of(trajectory)
    assert len(grown) == 2
    assert grown[1].messages()[0] == user("New")


def test_parallel_calls_second_choices_and_sub_agents_are_conversations_of_their_own() -> None:
    first = chat([user("Plan")], [("Two steps.", ours([1, 2], [3]))], 0)
    done = [user("Plan"), {"role": "assistant", "content": "Two steps."}]
    step_a = chat([*done, user("Step A")], [("A done.", ours([1, 2, 3, 10], [11]))], 1)
    step_b = chat([*done, user("Step B")], [("B done.", ours([1, 2, 3, 20], [21]))], 1.1)
    helper = chat(
        [user("Summarize")],
        [("Short.", ours([50], [51])), ("Shorter.", ours([50], [52]))],
        2,
        model="agent",
    )
    trajectory = captured(first, step_a, step_b, helper)
    histories = histories_of(trajectory)
    assert [h.messages()[-1]["content"] for h in histories] == [
        "A done.",
        "B done.",
        "Short.",
        "Shorter.",
    ]
    # The first conversation is the main one; the parallel call holds the shared turn as
    # context only, so it is trained once.
    assert trajectory.messages()[-2:] == [
        user("Step A"),
        {"role": "assistant", "content": "A done."},
    ]
    parallel = histories[1].messages_and_choices
    assert [isinstance(item, Choice) for item in parallel] == [False, False, False, True]
    with pytest.raises(art.TrajectoryValidationError, match="4 conversations"):
        trajectory.history()
    with pytest.raises(art.TrajectoryValidationError, match="reconcile_text_equivalent"):
        trajectory.histories(reconcile_text_equivalent_tokenizations=True)


def test_a_call_that_does_not_extend_the_ids_starts_a_new_conversation() -> None:
    first = chat([user("Hi")], [("Hello", ours([1, 2], [3]))], 0)  # cut: no EOS
    again = [user("Hi"), {"role": "assistant", "content": "Hello"}, user("More")]
    second = chat(again, [("Sure.", ours([1, 2, 3, 99, 4], [5]))], 1)  # the template re-closed
    assert len(histories_of(captured(first, second))) == 1
    third = chat(again, [("Sure.", ours([1, 2, 7, 4], [5]))], 2)  # re-tokenized differently
    assert len(histories_of(captured(first, third))) == 2


def test_model_selects_exchanges_by_name_or_pattern() -> None:
    trajectory = captured(
        chat([user("Hi")], [("Hello.", ours([1], [2]))], 0, model="agent"),
        chat([user("Judge this")], [("8/10", None)], 1, model="judge-large"),
    )
    assert len(trajectory.histories()) == 2
    [judge] = trajectory.histories(model="judge-*")
    assert judge.messages()[-1] == {"role": "assistant", "content": "8/10"}
    with pytest.raises(art.TrajectoryValidationError, match="model"):
        trajectory.histories(model="nobody")


# --- context exchanges and validation ----------------------------------------------------


def test_answers_from_another_server_are_context_and_named_in_the_logs() -> None:
    sampled = chat([user("Hi")], [("Hello.", ours([1], [2]))], 0)
    judged = chat([user("Rate: Hello.")], [("8/10", None)], 1, model="gpt-judge")
    trajectory = captured(sampled, judged, reward=1.0)
    group = art.TrajectoryGroup([trajectory, captured(sampled, reward=0.0)])
    check_trainable([group], allow_without_logprobs=True)
    assert len(trajectory.logs) == 1
    assert "exchange 1 (chat_completions, model 'gpt-judge'" in trajectory.logs[0]
    assert "untrained context" in trajectory.logs[0]
    check_trainable([group], allow_without_logprobs=False)
    assert len(trajectory.logs) == 1  # noted once

    judge_history = histories_of(trajectory)[1].messages_and_choices
    assert not any(isinstance(item, Choice) for item in judge_history)
    # Even where plain assistant turns may train, another server's answer does not.
    sequences = tokenize_trajectory(
        trajectory,
        None,  # type: ignore[arg-type]  # nothing is rendered
        group_index=0,
        trajectory_index=0,
        allow_training_without_logprobs=True,
    )
    assert [s.token_ids for s in sequences] == [[1, 2]]


def test_a_step_of_context_only_exchanges_is_refused_naming_the_fix() -> None:
    hosted = captured(chat([user("Hi")], [("Hello.", None)], 0, model="gpt-4o"), reward=1.0)
    group = art.TrajectoryGroup([hosted, hosted.model_copy(deep=True)])
    with pytest.raises(art.TrajectoryValidationError) as refused:
        check_trainable([group], allow_without_logprobs=True)
    message = str(refused.value)
    assert "trajectory_groups" in message
    assert "endpoint" in message
    assert "with art.Trajectory() as t:" in message


def test_a_trajectory_with_exchanges_and_hand_built_fields_is_refused_by_field() -> None:
    found = agent_loop().exchanges
    with pytest.raises(ValueError, match="messages_and_choices"):
        art.Trajectory(exchanges=found, messages_and_choices=[user("Hi")])
    with pytest.raises(ValueError, match="tools"):
        art.Trajectory(exchanges=found, tools=[])
    trajectory = art.Trajectory(exchanges=found)
    with pytest.raises(ValueError, match="additional_histories"):
        trajectory.additional_histories = [art.History(messages_and_choices=[user("x")])]
    # Filled the other way round, as a capture scope does: caught before logging.
    built = art.Trajectory(messages_and_choices=[user("Hi")])
    group = art.TrajectoryGroup([built])
    built.exchanges.add(found.chat_completions[0])
    with pytest.raises(art.TrajectoryValidationError, match=r"trajectories\[0\]\.messages_and"):
        coerce_groups([group], "trajectory_groups")
    # A request no conversation can be read from is named before anything is logged.
    unreadable = captured(chat([{"role": "user"}], [("?", ours([1], [2]))], 0))
    with pytest.raises(art.TrajectoryValidationError, match=r"trajectories\[0\]\.exchanges"):
        coerce_groups([art.TrajectoryGroup([unreadable])], "trajectory_groups")


def test_policy_versions_come_from_the_exchanges() -> None:
    trajectory = agent_loop()
    assert choice_versions(trajectory) == [0, 1]
    trajectory.final_policy_version = 5  # set by the rollout: kept
    fill_policy_versions(trajectory)
    assert (trajectory.initial_policy_version, trajectory.final_policy_version) == (0, 5)


# --- the other protocols -------------------------------------------------------------------


def test_completions_responses_and_messages_answers_become_chat_choices() -> None:
    completions = CompletionsExchange.model_validate(
        {
            "start_time": T0,
            "end_time": T0,
            "request": {"model": "agent", "prompt": "2+2="},
            "response": {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": "agent",
                "choices": [
                    {"index": 0, "text": "4", "finish_reason": "stop", "logprobs": None}
                    | ours([7, 8], [9])
                ],
            },
        }
    )
    responses = ResponsesExchange.model_validate(
        {
            "start_time": T0 + timedelta(seconds=1),
            "end_time": T0 + timedelta(seconds=1),
            "request": {
                "model": "agent",
                "instructions": "Use tools.",
                "input": [
                    {"role": "user", "content": "Weather?"},
                    {
                        "type": "function_call",
                        "call_id": "c0",
                        "name": "weather",
                        "arguments": "{}",
                    },
                    {"type": "function_call_output", "call_id": "c0", "output": "sunny"},
                ],
                "tools": [{"type": "function", "name": "weather", "parameters": {}}],
            },
            "response": {
                "id": "resp-1",
                "object": "response",
                "created_at": 0,
                "model": "agent",
                "status": "completed",
                "output": [
                    {
                        "type": "message",
                        "id": "m1",
                        "role": "assistant",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": "It is sunny.", "annotations": []}
                        ],
                    }
                ],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                **ours([20, 21], [22]),
            },
        }
    )
    messages = MessagesExchange.model_validate(
        {
            "start_time": T0 + timedelta(seconds=2),
            "end_time": T0 + timedelta(seconds=2),
            "request": {
                "model": "agent",
                "max_tokens": 16,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Paris?"}]}],
                "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
            },
            "response": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "agent",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "tu1",
                        "name": "weather",
                        "input": {"city": "Paris"},
                    },
                ],
                "stop_reason": "tool_use",
                "stop_sequence": None,
                "usage": {"input_tokens": 3, "output_tokens": 4},
                **ours([30, 31], [32, 33]),
            },
        }
    )
    completion_h, responses_h, messages_h = histories_of(captured(completions, responses, messages))

    assert completion_h.messages() == [user("2+2="), {"role": "assistant", "content": "4"}]

    assert responses_h.messages()[:4] == [
        {"role": "system", "content": "Use tools."},
        user("Weather?"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"},
    ]
    answer = responses_h.messages_and_choices[-1]
    assert isinstance(answer, Choice)
    assert answer.message.content == "It is sunny."
    assert (answer.model_extra or {})["token_ids"] == [22]
    assert responses_h.tools == [
        {"type": "function", "function": {"name": "weather", "parameters": {}}}
    ]

    call = messages_h.messages_and_choices[-1]
    assert isinstance(call, Choice)
    assert call.finish_reason == "tool_calls"
    assert call.message.content == "Checking."
    assert call.message.tool_calls is not None
    assert call.message.tool_calls[0].function.name == "weather"  # type: ignore[union-attr]
    assert json.loads(call.message.tool_calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert messages_h.messages()[:2] == [{"role": "system", "content": "Be brief."}, user("Paris?")]


# --- storage and display -----------------------------------------------------------------


def test_the_parquet_log_keeps_exchange_trajectories_whole(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    judged = chat([user("Rate")], [("8/10", None)], 5, model="gpt-judge")
    groups = [art.TrajectoryGroup([agent_loop(), captured(judged)], metadata={"k": 1})]
    path = tmp_path / "0000.parquet"
    write_groups(path, groups, split="train", step=0)
    assert read_groups(path) == groups
    row = pq.read_table(path, columns=["messages"]).to_pylist()[0]
    assert [(m["role"], m["trainable"]) for m in row["messages"]] == [
        ("system", False),
        ("user", False),
        ("assistant", True),
        ("user", False),
        ("assistant", True),
    ]


def test_an_art_0_5_23_file_with_exchanges_reads_back(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    trajectory = agent_loop()
    data = trajectory.model_dump(mode="json")
    data |= {"tools": None, "additional_histories": []}  # as ART dumps a captured one
    rows = [
        {
            "format_version": 2,
            "group_index": 0,
            "trajectory_index": 0,
            "group_json": json.dumps({"exceptions": [], "metadata": {}, "metrics": {}, "logs": []}),
            "trajectory_json": json.dumps(data),
        }
    ]
    path = tmp_path / "art.parquet"
    schema = pa.schema(
        [
            ("format_version", pa.int16()),
            ("group_index", pa.int64()),
            ("trajectory_index", pa.int64()),
            ("group_json", pa.large_string()),
            ("trajectory_json", pa.large_string()),
        ],
        metadata={b"art.trajectory_parquet.version": b"2"},
    )
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    [group] = read_trajectory_groups_parquet(path)
    assert group.trajectories == [trajectory]


def test_the_viewer_shows_an_exchange_trajectorys_conversations(tmp_path: Path) -> None:
    helper = chat([user("Summarize")], [("Short.", ours([50], [51]))], 3)
    trajectory = captured(*agent_loop().exchanges.all(), helper, reward=1.0)
    ModelStore(tmp_path, "exchanges", "agent").write_trajectories(
        "train", 0, [art.TrajectoryGroup([trajectory])]
    )
    data = read_project(locate(tmp_path, "exchanges"))
    [shown] = data["models"][0]["splits"]["train"][0]["groups"][0]["trajectories"]
    assert [(m["role"], m["content"], m.get("trainable", False)) for m in shown["messages"]] == [
        ("system", "You are terse.", False),
        ("user", "Hi", False),
        ("assistant", "Hello.", True),
        ("user", "Bye", False),
        ("assistant", "Bye.", True),
    ]
    assert [m["content"] for m in shown["histories"][0]["messages"]] == ["Summarize", "Short."]


# --- art.tokenize and art.tensorize ------------------------------------------------------


async def test_tokenize_gives_the_sampled_ids_with_their_flags_and_tensorize_tensors() -> None:
    group = art.TrajectoryGroup([agent_loop()], metadata={"scenario": "bye"})
    [tokenized] = await art.tokenize([group])
    [one] = tokenized.trajectories
    assert one.tokens == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert one.model == "agent"
    sampled = TokenFlag.EXACT | TokenFlag.SAMPLED | TokenFlag.OUTPUT | TokenFlag.ASSISTANT
    assert (
        one.flags == [TokenFlag.EXACT] * 3 + [sampled] * 2 + [TokenFlag.EXACT] * 2 + [sampled] * 2
    )
    assert one.logprobs[3:5] == [-0.5, -0.5]
    assert one.reward == 1.0
    assert tokenized.metadata == {"scenario": "bye"}

    import torch

    [tensors] = await art.tensorize([agent_loop()])
    assert tensors.tokens.dtype == torch.int64
    assert tensors.tokens.tolist() == one.tokens
    assert tensors.flags.tolist() == [int(flag) for flag in one.flags]
    assert torch.isnan(tensors.logprobs[0])


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("multi_history", True),
        ("reconcile_text_equivalent_tokenizations", True),
        ("chat_template", "{{ messages }}"),
        ("chat_template_kwargs", {"enable_thinking": False}),
    ],
)
async def test_tokenize_refuses_what_it_does_not_build_by_name(argument: str, value: Any) -> None:
    with pytest.raises(art.TrajectoryValidationError, match=argument):
        await art.tokenize([agent_loop()], **{argument: value})
    with pytest.raises(art.TrajectoryValidationError, match=argument):  # tensorize's are its
        await art.tensorize([agent_loop()], **{argument: value})


async def test_tensorize_refuses_a_keyword_tokenize_does_not_take() -> None:
    with pytest.raises(TypeError, match="'multi_histories'"):
        await art.tensorize([agent_loop()], multi_histories=True)


async def test_tokenize_names_several_conversations_and_a_missing_tokenizer() -> None:
    first = chat([user("A")], [("a", ours([1], [2])), ("b", ours([1], [3]))], 0)
    with pytest.raises(art.TrajectoryValidationError, match=r"items\[0\].histories"):
        await art.tokenize([captured(first)])
    plain = art.Trajectory(
        messages_and_choices=[user("Hi"), {"role": "assistant", "content": "Yo"}]
    )
    with pytest.raises(art.TrajectoryValidationError, match="base_model"):
        await art.tokenize([plain])
