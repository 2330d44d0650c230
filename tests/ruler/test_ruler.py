"""RULER: the judge prompt, the check of its answer, the cache, and real judges on 127.0.0.1."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import jsonschema
import pytest
import pytest_asyncio
from conftest import ScriptedChat
from helpers import WEATHER_TOOL, sampled_choice
from langchain_core.messages import AnyMessage
from langgraph.graph.message import add_messages

import art
from art.rewards import DEFAULT_RUBRIC, ruler, ruler_score_group
from art.ruler.answer import parse_scores
from art.ruler.cache import cache_key
from art.ruler.prompt import (
    judge_messages,
    longest_answer_chars,
    response_format,
    shared_prefix_length,
)

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
SYSTEM = {"role": "system", "content": "You are a calculator. Reply with the number only."}
QUESTION = {"role": "user", "content": "What is 7 + 5?"}
ANSWERS = ["12", "The answer is 12.", "13", "I like turtles."]


def group_of(answers: list[str], rewards: list[float] | None = None) -> art.TrajectoryGroup:
    rewards = rewards or [0.0] * len(answers)
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[SYSTEM, QUESTION, sampled_choice(text)],
            reward=reward,
        )
        for text, reward in zip(answers, rewards, strict=True)
    )


def answer(*entries: tuple[str, float]) -> str:
    return json.dumps(
        {
            "scores": [
                {
                    "trajectory_id": i,
                    "reply": f"reply {i}",
                    "explanation": f"judged {i}",
                    "score": s,
                }
                for i, s in entries
            ]
        }
    )


# --- the prompt ---------------------------------------------------------------------------


def test_the_shared_context_is_shown_once_and_each_remainder_under_its_id() -> None:
    lists = [t.messages() for t in group_of(ANSWERS[:3])]
    assert shared_prefix_length(lists) == 2
    system, user = judge_messages(lists, "Reward exact numbers.", tools=[WEATHER_TOOL])  # type: ignore[list-item]
    assert "Reward exact numbers." in system["content"]
    assert "1, 2, 3" in system["content"]
    text = user["content"]
    assert text.count("What is 7 + 5?") == 1
    assert text.index("<shared_context>") < text.index('<trajectory id="1">')
    for index, reply in enumerate(ANSWERS[:3], start=1):
        section = text.split(f'<trajectory id="{index}">')[1].split("</trajectory>")[0]
        assert section.strip() == f"[assistant]\n{reply}"
    assert "get_weather: Weather in a city" in text


def test_identical_trajectories_still_each_show_their_last_message() -> None:
    lists = [t.messages() for t in group_of(["12", "12"])]
    assert shared_prefix_length(lists) == 2
    text = judge_messages(lists, DEFAULT_RUBRIC)[1]["content"]
    assert text.count("[assistant]\n12") == 2


def test_tool_calls_and_results_are_shown_to_the_judge() -> None:
    from helpers import tool_trajectory

    lists = [tool_trajectory(1.0).messages(), tool_trajectory(0.0, city="Oslo").messages()]
    text = judge_messages(lists, DEFAULT_RUBRIC)[1]["content"]
    assert 'calls get_weather({"city": "Oslo"})' in text
    assert "[tool, result of call call_7]\nsunny, 21C" in text


def test_the_schema_admits_one_score_per_id_and_nothing_else() -> None:
    schema = response_format(3)["json_schema"]["schema"]
    analysed = {"analysis": "7 + 5 is 12."}
    good = analysed | json.loads(answer(("1", 1.0), ("2", 0.5), ("3", 0.0)))
    jsonschema.validate(good, schema)
    assert list(schema["properties"]) == ["analysis", "scores"], "the analysis comes first"
    entry = schema["properties"]["scores"]["prefixItems"][0]["properties"]
    assert list(entry) == ["trajectory_id", "reply", "explanation", "score"], (
        "each entry quotes its trajectory's reply before it explains and scores it"
    )
    for bad in [
        answer(("1", 0.9), ("2", 0.5)),  # too few
        answer(("1", 0.9), ("1", 0.5), ("3", 0.1)),  # a repeated id
        answer(("1", 0.9), ("2", 0.5), ("4", 0.1)),  # an unknown id
        answer(("1", 0.9), ("2", 1.5), ("3", 0.1)),  # a score above 1
        answer(("1", 0.9), ("2", 0.5), ("3", 0.1)).replace('"reply": "reply 2", ', ""),
    ]:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(analysed | json.loads(bad), schema)
    with pytest.raises(jsonschema.ValidationError, match="'analysis' is a required property"):
        jsonschema.validate(json.loads(answer(("1", 1.0), ("2", 0.5), ("3", 0.0))), schema)


@pytest.mark.parametrize("count", [2, 4])
def test_the_longest_answer_the_schema_admits_fits_the_budget_named_for_it(count: int) -> None:
    schema = response_format(count)["json_schema"]["schema"]
    entries = [
        {"trajectory_id": str(i), "reply": "2" * 120, "explanation": "2" * 120, "score": 0.99}
        for i in range(1, count + 1)
    ]
    longest = {"analysis": "2." * 150, "scores": entries}
    jsonschema.validate(longest, schema)
    assert len(json.dumps(longest)) <= longest_answer_chars(count)
    for where in (longest, entries[0]):  # one character more anywhere is not an answer
        key = "analysis" if where is longest else "explanation"
        where[key] += "2"
        with pytest.raises(jsonschema.ValidationError, match="is too long"):
            jsonschema.validate(longest, schema)
        where[key] = where[key][:-1]


# --- the check of the answer -------------------------------------------------------------


def test_scores_are_matched_by_id_not_by_position() -> None:
    scores = parse_scores(answer(("3", 0.1), ("1", 0.9), ("2", 0.5)), ["1", "2", "3"])
    assert [(s.trajectory_id, s.score) for s in scores] == [("1", 0.9), ("2", 0.5), ("3", 0.1)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (answer(("1", 0.9), ("2", 0.5)), "no score for trajectory id '3'"),
        (answer(("1", 0.9), ("1", 0.5), ("3", 0.1)), "more than one score for id '1'"),
        (answer(("1", 0.9), ("2", 0.5), ("3", 0.1), ("7", 1)), "unknown id '7'"),
        (answer(("1", 0.9), ("2", -0.5), ("3", 0.1)), "-0.5, outside 0..1"),
        (answer(("1", 0.9), ("2", 150), ("3", 0.1)), "'2' is 150.0, outside 0..1"),
        (answer(("1", 0.9), ("2", "high"), ("3", 0.1)), "not a number: 'high'"),
        (answer(("1", 0.9), ("2", 0.5), ("3", 0.1)).replace("}]", "}"), "not valid JSON"),
        ("Trajectory 1 is best (0.9), then 2 (0.5), then 3 (0.1).", "holds no JSON list"),
        ('{"ranking": []}', 'no "scores" list'),
        ("", "empty"),
    ],
)
def test_an_unusable_answer_says_what_is_wrong(content: str, message: str) -> None:
    with pytest.raises(art.JudgeError, match=message):
        parse_scores(content, ["1", "2", "3"])


def _entries(ids: list[object], scores: list[object]) -> list[dict[str, object]]:
    return [
        {"trajectory_id": i, "explanation": "why", "score": s}
        for i, s in zip(ids, scores, strict=True)
    ]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        # The JSON inside prose, or in a Markdown fence.
        ("Here you go: " + answer(("1", 0.9), ("2", 0.5), ("3", 0.1)) + " Hope it helps.",
         [0.9, 0.5, 0.1]),
        ("```json\n" + answer(("3", 0.1), ("1", 0.9), ("2", 0.5)) + "\n```", [0.9, 0.5, 0.1]),
        # A bare list of entries.
        (json.dumps(_entries(["1", "2", "3"], [0.2, 0.3, 0.4])), [0.2, 0.3, 0.4]),
        # Ids as "trajectory N", "#N" or numbers; ids counted from 0.
        (json.dumps({"scores": _entries(["Trajectory 2", "#1", 3], [0.5, 0.9, 0.1])}),
         [0.9, 0.5, 0.1]),
        (json.dumps({"scores": _entries(["0", "1", "2"], [0.9, 0.5, 0.1])}), [0.9, 0.5, 0.1]),
        # The same entry twice.
        (answer(("1", 0.9), ("2", 0.5), ("2", 0.5), ("3", 0.1)), [0.9, 0.5, 0.1]),
        # Scores as text, out of 10, out of 100.
        (json.dumps({"scores": _entries(["1", "2", "3"], ["0.9", "5/10", "10%"])}),
         [0.9, 0.5, 0.1]),
        (answer(("1", 9), ("2", 5), ("3", 1)), [0.9, 0.5, 0.1]),
        (answer(("1", 90), ("2", 50), ("3", 10)), [0.9, 0.5, 0.1]),
    ],
)  # fmt: skip
def test_an_answer_that_says_plainly_what_it_meant_is_read_as_meant(
    content: str, expected: list[float]
) -> None:
    scores = parse_scores(content, ["1", "2", "3"])
    assert [s.trajectory_id for s in scores] == ["1", "2", "3"]
    assert [s.score for s in scores] == pytest.approx(expected)


# --- the cache key -----------------------------------------------------------------------


def test_the_cache_key_is_stable_and_leaves_out_the_api_key() -> None:
    request: dict[str, Any] = {
        "model": "openai/judge",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.0,
        "api_key": "secret-1",
    }
    same = {key: request[key] for key in reversed(list(request))} | {"api_key": "secret-2"}
    assert cache_key(request) == cache_key(same)
    assert len(cache_key(request)) == 64
    assert cache_key(request) != cache_key(request | {"temperature": 1.0})
    assert cache_key(request) != cache_key(request | {"model": "openai/other"})
    assert cache_key(request) != cache_key(
        request | {"messages": [{"role": "user", "content": "hi!"}]}
    )


# --- a scripted judge: the error paths and the cache --------------------------------------


def cached_answers(directory: Path) -> list[Path]:
    return list(directory.glob("*.json"))


def scripted_params(server: ScriptedChat) -> dict[str, Any]:
    return {"api_base": server.url, "api_key": "test-key"}


async def test_a_group_is_rescored_by_id_and_a_second_call_hits_the_cache(
    scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    scripted_chat.answers.append(answer(("2", 0.4), ("1", 1.0), ("3", 0.0)))
    group = group_of(ANSWERS[:3], rewards=[0.25, 0.5, 0.75])
    group.metrics["hops"] = 2
    group.log("three answers")
    judged = await ruler_score_group(
        group, "openai/scripted-judge", scripted_params(scripted_chat), cache=tmp_path
    )
    assert judged is not None
    assert (judged.metrics, judged.logs) == ({"hops": 2}, ["three answers"])
    assert [t.reward for t in judged] == [1.0, 0.4, 0.0]
    assert [t.metrics["independent_reward"] for t in judged] == [0.25, 0.5, 0.75]
    assert [t.metrics["ruler_score"] for t in judged] == [1.0, 0.4, 0.0]
    assert judged.trajectories[1].logs == ["RULER explanation: judged 2"]
    assert sum(t.metrics["ruler_judge_prompt_tokens"] for t in judged) == pytest.approx(100)
    assert [t.reward for t in group] == [0.25, 0.5, 0.75], "the input group is left as it was"
    sent = scripted_chat.requests[0]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["model"] == "scripted-judge"

    again = await ruler(
        [t.messages() for t in group],
        "openai/scripted-judge",
        scripted_params(scripted_chat) | {"api_key": "another-key"},
        cache=tmp_path,
    )
    assert len(scripted_chat.requests) == 1, "served from the cache"
    assert [s.score for s in again] == [1.0, 0.4, 0.0]
    assert len(cached_answers(tmp_path)) == 1


async def test_the_judge_cost_is_recorded_where_litellm_knows_the_price(
    scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    scripted_chat.answers += [answer(("1", 1.0), ("2", 0.0))] * 2
    params = scripted_params(scripted_chat)
    priced = await ruler_score_group(
        group_of(ANSWERS[:2]), "openai/gpt-4o-mini", params, cache=False
    )
    assert priced is not None
    # 100 prompt and 20 completion tokens at gpt-4o-mini's list price, shared by 2.
    assert sum(t.metrics["ruler_judge_cost"] for t in priced) == pytest.approx(2.7e-5)
    unpriced = await ruler_score_group(
        group_of(ANSWERS[:2]), "openai/my-judge", params, cache=False
    )
    assert unpriced is not None
    assert all("ruler_judge_cost" not in t.metrics for t in unpriced)


async def test_cache_false_always_asks_the_judge(
    scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    scripted_chat.answers += [answer(("1", 1.0), ("2", 0.0))] * 2
    lists = [t.messages() for t in group_of(ANSWERS[:2])]
    for _ in range(2):
        await ruler(lists, "openai/scripted-judge", scripted_params(scripted_chat), cache=False)
    assert len(scripted_chat.requests) == 2
    assert not cached_answers(tmp_path)


async def test_an_unusable_answer_is_asked_for_once_more(
    scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    scripted_chat.answers += ["not json", answer(("1", 0.2), ("2", 0.8))]
    scores = await ruler(
        [t.messages() for t in group_of(ANSWERS[:2])],
        "openai/scripted-judge",
        scripted_params(scripted_chat),
        cache=tmp_path,
    )
    assert [s.score for s in scores] == [0.2, 0.8]
    assert len(scripted_chat.requests) == 2


async def test_a_small_judges_answer_is_read_and_a_retry_shows_it_its_mistake(
    scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    """What a small local judge writes, from a real server through LiteLLM: prose around
    JSON with ids and scores of its own making is read as meant; an answer with no JSON is
    asked for again, the judge shown its answer and what was wrong with it."""
    prose = (
        "Let me compare them.\n```json\n"
        + json.dumps({"scores": _entries(["trajectory 1", "trajectory 2"], ["8/10", 3])})
        + "\n```"
    )
    scripted_chat.answers += [prose, "Trajectory 1 is better.", answer(("1", 0.7), ("2", 0.2))]
    messages = [t.messages() for t in group_of(ANSWERS[:2])]
    scores = await ruler(
        messages, "openai/scripted-judge", scripted_params(scripted_chat), cache=tmp_path
    )
    assert [s.score for s in scores] == pytest.approx([0.8, 0.3])
    assert len(scripted_chat.requests) == 1

    scores = await ruler(
        messages, "openai/scripted-judge", scripted_params(scripted_chat), cache=False
    )
    assert [s.score for s in scores] == [0.7, 0.2]
    first, second = scripted_chat.requests[1:]
    assert second["messages"][: len(first["messages"])] == first["messages"]
    shown, told = second["messages"][len(first["messages"]) :]
    assert shown == {"role": "assistant", "content": "Trajectory 1 is better."}
    assert told["role"] == "user"
    assert "holds no JSON list of scores" in told["content"]
    assert "one entry for each trajectory id (1, 2)" in told["content"]


async def test_a_wrong_id_count_is_an_error_or_with_swallow_a_dropped_group(
    scripted_chat: ScriptedChat, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = answer(("1", 0.9), ("2", 0.5), ("3", 0.1))  # three scores for four trajectories
    scripted_chat.answers += [wrong] * 4
    group = group_of(ANSWERS)
    with pytest.raises(
        art.JudgeError, match=r"3 scores for 4 trajectories.*no score for trajectory id '4'"
    ):
        await ruler_score_group(
            group, "openai/scripted-judge", scripted_params(scripted_chat), cache=tmp_path
        )
    assert len(scripted_chat.requests) == 2, "one retry, then the error"

    with caplog.at_level(logging.WARNING, logger="art.ruler"):
        dropped = await ruler_score_group(
            group,
            "openai/scripted-judge",
            scripted_params(scripted_chat),
            swallow_exceptions=True,
            cache=tmp_path,
        )
    assert dropped is None
    assert "RULER dropped a group of 4 trajectories: JudgeError" in caplog.text
    assert not cached_answers(tmp_path), "rejected answers are never cached"


async def test_gather_drops_a_group_the_judge_could_not_score(
    scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    async def rollout(text: str) -> art.Trajectory:
        return group_of([text]).trajectories[0]

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(text) for text in ANSWERS[:2])],
        pbar_desc=None,
        after_each=lambda group: ruler_score_group(
            group,
            "openai/scripted-judge",
            scripted_params(scripted_chat),  # nothing scripted: the judge answers 400
            swallow_exceptions=True,
            cache=tmp_path,
        ),
    )
    assert groups == []


async def test_bad_arguments_name_the_field() -> None:
    lists = [t.messages() for t in group_of(ANSWERS[:2])]
    with pytest.raises(art.ConfigError, match="judge_model"):
        await ruler(lists, "")
    with pytest.raises(art.ConfigError, match=r"extra_litellm_params\['response_format'\]"):
        await ruler(lists, "openai/judge", {"response_format": {"type": "text"}})
    with pytest.raises(art.ConfigError, match=r"extra_litellm_params\['model'\]"):
        await ruler(lists, "openai/judge", {"model": "openai/other"})
    assert await ruler([], "openai/judge") == []


def test_model_litellm_completion_params_reach_its_endpoint() -> None:
    model = art.Model(
        name="judge", project="p", inference_base_url="http://127.0.0.1:1/v1", inference_api_key="k"
    )
    params = model.litellm_completion_params()
    assert params["model"] == "judge"
    assert params["base_url"] == "http://127.0.0.1:1/v1"
    assert params["api_key"] == "k"


# --- a real judge: the default model served by our own backend ----------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def judge_endpoint(
    shared_backend: art.local.LocalBackend,
) -> AsyncIterator[tuple[art.local.LocalBackend, dict[str, Any]]]:
    backend = shared_backend
    model = art.TrainableModel(name="policy", project="ruler", base_model=BASE)
    await model.register(backend)
    params = model.litellm_completion_params()
    assert params["model"] == "hosted_vllm/ruler/policy"  # the served name: project/name
    # The judge is the base model, which the same endpoint serves under its own name.
    judge = {
        "base_url": params["base_url"],
        "api_key": params["api_key"],
        "temperature": 0.0,
        "max_tokens": longest_answer_chars(4),  # the group of 4 below cannot be cut off
    }
    yield backend, judge


async def test_a_real_judge_scores_a_group_of_4_and_the_cache_answers_once_it_is_gone(
    judge_endpoint: tuple[Any, dict[str, Any]], tmp_path: Path
) -> None:
    backend, params = judge_endpoint
    group = group_of(ANSWERS, rewards=[1.0, 0.5, 0.0, 0.0])
    judged = await ruler_score_group(group, f"openai/{BASE}", params, cache=tmp_path)
    assert judged is not None
    assert len(judged) == 4
    for trajectory, independent in zip(judged, [1.0, 0.5, 0.0, 0.0], strict=True):
        assert 0.0 <= trajectory.reward <= 1.0
        assert trajectory.metrics["ruler_score"] == trajectory.reward
        assert trajectory.metrics["independent_reward"] == independent
        assert trajectory.logs[0].startswith("RULER explanation: ")
        assert trajectory.metrics["ruler_judge_completion_tokens"] > 0

    await backend.close()  # the endpoint is gone: only the cache can answer now
    again = await ruler_score_group(group, f"openai/{BASE}", params, cache=tmp_path)
    assert again is not None
    assert [t.reward for t in again] == [t.reward for t in judged]
    assert [t.logs for t in again] == [t.logs for t in judged]
    assert all(t.metrics["ruler_judge_completion_tokens"] == 0 for t in again)


# --- a LangGraph rollout with two LLM nodes -----------------------------------------------


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    summary: str


async def test_a_langgraph_gather_with_two_llm_nodes_is_judged_whole(
    chat_server_url: str, scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    """A second LLM node becomes an additional history; RULER shows it to the judge."""
    from langgraph.graph import END, START, StateGraph

    from art.langgraph import init_chat_model, wrap_rollout

    agent = art.Model(
        name="agent", project="ruler", inference_base_url=chat_server_url, inference_api_key="k"
    )

    async def rollout(question: str) -> art.Trajectory:
        llm = init_chat_model(agent)

        async def answer(state: State) -> dict[str, Any]:
            return {"messages": [await llm.ainvoke(state["messages"])]}

        async def summarize(state: State) -> dict[str, Any]:
            last = str(state["messages"][-1].content)
            summary = await llm.ainvoke([("user", f"Summarize: {last}")])
            return {"summary": str(summary.content)}

        graph = StateGraph(State)
        graph.add_node("answer", answer)
        graph.add_node("summarize", summarize)
        graph.add_edge(START, "answer")
        graph.add_edge("answer", "summarize")
        graph.add_edge("summarize", END)
        await graph.compile().ainvoke({"messages": [("user", question)], "summary": ""})
        return art.Trajectory(reward=0.0)

    scripted_chat.answers.append(answer(("1", 0.9), ("2", 0.1)))
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(wrap_rollout(agent, rollout)(q) for q in ("7 + 5?", "8 + 1?"))],
        pbar_desc=None,
        after_each=lambda group: ruler_score_group(
            group,
            "openai/scripted-judge",
            scripted_params(scripted_chat),
            swallow_exceptions=True,
            cache=tmp_path,
        ),
    )
    (group,) = groups
    assert [len(t.additional_histories) for t in group] == [1, 1]
    assert [t.reward for t in group] == [0.9, 0.1]
    (request,) = scripted_chat.requests
    shown = request["messages"][1]["content"]
    # Each trajectory's main conversation and its summarizer call, under its own id.
    first = shown[shown.index('<trajectory id="1">') : shown.index('<trajectory id="2">')]
    assert "echo: 7 + 5?" in first
    assert "additional conversation 1 of 1" in first
    assert "Summarize: echo: 7 + 5?" in first
    assert "echo: Summarize: echo: 7 + 5?" in first
    assert "Summarize: echo: 8 + 1?" in shown[shown.index('<trajectory id="2">') :]
