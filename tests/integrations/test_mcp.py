"""The MCP integration against real MCP servers (stdio and streamable HTTP).

The notes server of `examples/` runs over stdio and over HTTP; `mcp_tool_server.py`
has tools that fail, hang or flood. The default model is served by one in-process
LocalBackend for the module; where a test needs exact model turns (malformed calls), a
scripted OpenAI-compatible server on 127.0.0.1 plays the model.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
import pytest_asyncio
from helpers import JsonHandler, serving
from openai.types.chat.chat_completion import Choice

import art
from art.local import LocalBackend
from art.mcp import (
    GeneratedScenario,
    GeneratedScenarioCollection,
    MCPConnectionError,
    MCPResource,
    MCPRolloutConfig,
    MCPSession,
    MCPTool,
    ScenarioGenerationError,
    evaluate,
    generate_scenarios,
    mcp_rollout,
    reward_scorer,
)

ROOT = Path(__file__).resolve().parents[2]
NOTES_SERVER = ROOT / "examples" / "mcp_notes_server.py"
TOOL_SERVER = Path(__file__).resolve().parents[1] / "mcp_tool_server.py"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
NOTES_TOOLS = {"add_note", "list_notes", "search_notes", "read_note", "delete_note"}


# --- a scripted model: each model name plays a fixed list of assistant turns ------------


def call(name: str, arguments: str | dict[str, Any], index: int = 0) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": f"call_{name}_{index}",
        "type": "function",
        "function": {"name": name, "arguments": text},
    }


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "errors": [
        {"tool_calls": [call("read_note", {"note_id": 999})]},  # the server reports a failure
        {"tool_calls": [call("read_note", '{"note_id": 1')]},  # arguments are not JSON
        {"tool_calls": [call("fly_to_the_moon", {})]},  # no such tool
        {"tool_calls": [call("list_notes", "[1, 2]")]},  # arguments not an object
        {"tool_calls": [call("echo", {"text": "still here"})]},  # the second server
        {"tool_calls": [call("complete_task", {"summary": "checked the notes"})]},
    ],
    "misbehaving": [
        {"tool_calls": [call("sleep", {"seconds": 3})]},
        {"tool_calls": [call("big", {"characters": 5000})]},
        {"content": "The tools were slow and verbose."},
    ],
    "writer": [
        {"tool_calls": [call("add_note", {"title": "from a rollout", "body": "hello"})]},
        {"tool_calls": [call("complete_task", {"summary": "added a note"})]},
    ],
    "quitter": [{"content": "I will not use any tool."}],
    "reader": [{"tool_calls": [call("list_notes", {})]}, {"content": "Those are all."}],
    "finisher": [{"tool_calls": [call("complete_task", {"summary": "nothing to do"})]}],
}


def _own_note_script(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add a note titled with the task, wait, find it again, and finish."""
    task = next(m["content"] for m in messages if m["role"] == "user")
    return [
        {"tool_calls": [call("add_note", {"title": task, "body": "mine"})]},
        {"tool_calls": [call("sleep", {"seconds": 0.1})]},
        {"tool_calls": [call("search_notes", {"query": task})]},
        {"tool_calls": [call("complete_task", {"summary": "found it"})]},
    ]


GENERATOR_ANSWERS = [
    # invalid difficulty, a missing task, and a duplicate (up to case and spacing)
    {
        "scenarios": [
            {"task": "List every note tagged home.", "difficulty": 1},
            {"task": "Summarise the dentist note.", "difficulty": 9},
            {"difficulty": 2},
            {"task": "list every  note tagged HOME.", "difficulty": 2},
        ]
    },
    {
        "scenarios": [
            {
                "task": "Find the note about the kickoff meeting and report its day.",
                "difficulty": 2,
            },
            {"task": "Delete the grocery note, then list what is left.", "difficulty": 3},
        ]
    },
]


class _ScriptedModel(JsonHandler):
    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        request = self.read_json()
        type(self).requests.append(request)
        if request["model"] == "generator":
            answered = sum(1 for r in type(self).requests if r["model"] == "generator") - 1
            content = json.dumps(GENERATOR_ANSWERS[min(answered, len(GENERATOR_ANSWERS) - 1)])
            message: dict[str, Any] = {"role": "assistant", "content": content}
        else:
            turn = sum(1 for m in request["messages"] if m["role"] == "assistant")
            script = SCRIPTS.get(request["model"]) or _own_note_script(request["messages"])
            message = {"role": "assistant", "content": None} | script[min(turn, len(script) - 1)]
        body = {
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": 0,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                    "message": message,
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        self.send_json(body)


@pytest.fixture(scope="module")
def scripted_url() -> Iterator[str]:
    with serving(_ScriptedModel) as url:
        yield url


def scripted(name: str, url: str) -> art.Model:
    return art.Model(
        name=name, project="tests", inference_base_url=url, inference_api_key="scripted"
    )


# --- real MCP servers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def notes_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("notes")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stdio_notes(notes_dir: Path) -> AsyncIterator[MCPSession]:
    session = MCPSession.stdio(
        sys.executable, [str(NOTES_SERVER), "--db", str(notes_dir / "stdio.db")]
    )
    async with session:
        yield session


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tool_server() -> AsyncIterator[MCPSession]:
    async with MCPSession.stdio(sys.executable, [str(TOOL_SERVER)]) as session:
        yield session


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def http_notes(notes_dir: Path) -> AsyncIterator[MCPSession]:
    port = _free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 (started once, not awaited on)
        [
            sys.executable,
            str(NOTES_SERVER),
            *("--db", str(notes_dir / "http.db")),
            *("--http", "--port", str(port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with httpx.AsyncClient() as client:
            for _ in range(300):  # until the server listens (or has died)
                if process.poll() is not None:
                    raise RuntimeError(f"the HTTP notes server exited: {process.stderr!r}")
                try:
                    await client.get(url)
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
        async with MCPSession.http(url) as session:
            yield session
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(shared_backend: LocalBackend) -> art.TrainableModel:
    model = art.TrainableModel(name="mcp-agent", project="mcp", base_model=BASE)
    await model.register(shared_backend)
    return model


# --- discovery --------------------------------------------------------------------------


async def test_tools_and_resources_are_discovered_with_their_schemas_over_stdio_and_http(
    stdio_notes: MCPSession, http_notes: MCPSession
) -> None:
    stdio_tools = await stdio_notes.list_tools()
    assert {tool.name for tool in stdio_tools} == NOTES_TOOLS
    assert await http_notes.list_tools() == stdio_tools
    add_note = next(tool for tool in stdio_tools if tool.name == "add_note")
    assert add_note.description == "Add a note and return its id."
    assert add_note.parameters["required"] == ["title", "body"]
    assert add_note.parameters["properties"]["tag"]["default"] == "general"
    schema = add_note.to_tool_schema()
    assert schema == {
        "type": "function",
        "function": {
            "name": "add_note",
            "description": "Add a note and return its id.",
            "parameters": add_note.parameters,
        },
    }
    assert MCPTool.from_dict(add_note.to_dict()) == add_note

    resources = await http_notes.list_resources()
    assert resources == [
        MCPResource(
            uri="notes://stats",
            name="stats",
            description="How many notes there are, per tag.",
            mime_type="text/plain",
        )
    ]
    assert "home: 2" in await http_notes.read_resource("notes://stats")


async def test_a_session_used_before_it_is_open_or_for_a_missing_server_says_so() -> None:
    session = MCPSession.stdio(sys.executable, [str(NOTES_SERVER)])
    with pytest.raises(MCPConnectionError, match="is not open"):
        await session.list_tools()
    with pytest.raises(MCPConnectionError, match="cannot connect"):
        async with MCPSession.stdio("/nonexistent/mcp-server"):
            pass
    with pytest.raises(art.ConfigError, match="url"):
        MCPSession.http("localhost:8000/mcp")


# --- rollouts with the default model ----------------------------------------------------


async def test_the_default_model_steered_to_a_tool_records_the_call_and_its_real_result(
    served: art.TrainableModel, stdio_notes: MCPSession
) -> None:
    config = MCPRolloutConfig(
        max_turns=1,
        max_tokens=48,
        temperature=0.0,
        tool_choice={"type": "function", "function": {"name": "search_notes"}},
    )
    trajectory = await mcp_rollout(served, "Find my note about the dentist.", stdio_notes, config)

    choice = trajectory.messages_and_choices[2]
    assert isinstance(choice, Choice)
    calls = choice.message.tool_calls
    assert calls is not None
    assert calls[0].type == "function"
    assert calls[0].function.name == "search_notes"
    tool_message = trajectory.messages_and_choices[3]
    assert isinstance(tool_message, dict)
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == calls[0].id
    # the very text the server gives for these arguments
    again = await stdio_notes.call_tool("search_notes", json.loads(calls[0].function.arguments))
    assert tool_message["content"] == (again.text if not again.is_error else f"Error: {again.text}")
    assert trajectory.metrics["turns"] == 1
    assert trajectory.metrics["tool_calls"] == 1
    assert trajectory.metrics["hit_turn_limit"] is True
    assert {t["function"]["name"] for t in trajectory.tools or []} == NOTES_TOOLS | {
        "complete_task"
    }
    assert trajectory.metadata["task"] == "Find my note about the dentist."


async def test_8_concurrent_rollouts_share_one_session_per_server(
    scripted_url: str, http_notes: MCPSession, tool_server: MCPSession
) -> None:
    model = scripted("concurrent", scripted_url)
    trajectories = await art.gather_trajectories(
        (mcp_rollout(model, f"errand {i}", [http_notes, tool_server]) for i in range(8)),
        pbar_desc=None,
    )
    added = []
    for i, trajectory in enumerate(trajectories):
        results = [str(m["content"]) for m in trajectory.messages() if m["role"] == "tool"]
        assert results[0].startswith("added note ")
        note_id = int(results[0].removeprefix("added note "))
        assert results[1:] == ["slept 0.1", f"{note_id}: errand {i}", "Task marked complete."]
        assert trajectory.metrics["tool_errors"] == 0
        added.append(note_id)
    assert len(set(added)) == 8  # every rollout got its own note back, none mixed up
    assert http_notes.connected
    assert tool_server.connected


async def test_fresh_sessions_start_every_rollout_from_the_same_server_state(
    scripted_url: str, http_notes: MCPSession
) -> None:
    writer, reader = scripted("writer", scripted_url), scripted("reader", scripted_url)
    # the notes server keeps its store in the process: a new process starts from the seed
    notes = MCPSession.stdio(sys.executable, [str(NOTES_SERVER), "--db", ":memory:"])

    def first_result(trajectory: art.Trajectory) -> str:
        return next(str(m["content"]) for m in trajectory.messages() if m["role"] == "tool")

    async with notes:  # shared (the default): the second rollout sees the first one's note
        await mcp_rollout(writer, "Add a note.", notes)
        assert "from a rollout" in first_result(await mcp_rollout(reader, "List.", notes))

    fresh = MCPRolloutConfig(fresh_sessions=True)
    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(mcp_rollout(writer, "Add a note.", notes, fresh) for _ in range(3))],
        pbar_desc=None,
    )
    # four seeded notes in each rollout's own store, so each adds note 5
    assert [first_result(t) for t in groups[0]] == ["added note 5"] * 3
    listing = first_result(await mcp_rollout(reader, "List my notes.", notes, fresh))
    assert "from a rollout" not in listing
    assert len(listing.splitlines()) == 4
    assert not notes.connected  # a template: each rollout opened and closed its own

    with pytest.raises(art.ConfigError, match="fresh_sessions"):
        await mcp_rollout(reader, "List my notes.", http_notes, fresh)


# --- bad calls are data ----------------------------------------------------------------


async def test_failing_tools_and_malformed_calls_are_recorded_and_the_rollout_goes_on(
    scripted_url: str, http_notes: MCPSession, tool_server: MCPSession
) -> None:
    trajectory = await mcp_rollout(
        scripted("errors", scripted_url), "Check my notes.", [http_notes, tool_server]
    )
    results = [m["content"] for m in trajectory.messages() if m["role"] == "tool"]
    assert len(results) == 6
    assert results[0] == (
        "Error executing tool read_note: there is no note 999; call list_notes to see the ids"
    )
    assert results[1].startswith("Error: the arguments of 'read_note' are not valid JSON")
    assert results[2].startswith("Error: there is no tool 'fly_to_the_moon'. Available tools:")
    assert "search_notes" in results[2]
    assert results[3] == "Error: the arguments of 'list_notes' must be a JSON object, got list."
    assert results[4] == "still here"
    assert results[5] == "Task marked complete."
    assert trajectory.metrics == trajectory.metrics | {
        "turns": 6,
        "tool_calls": 5,  # the built-in complete_task is counted in `completed`, not here
        "tool_errors": 4,
        "completed": True,
        "hit_turn_limit": False,
    }
    assert trajectory.metadata["summary"] == "checked the notes"
    assert len(trajectory.logs) == 4


async def test_a_rollout_that_only_calls_complete_task_has_made_no_tool_call(
    scripted_url: str, tool_server: MCPSession
) -> None:
    trajectory = await mcp_rollout(scripted("finisher", scripted_url), "Do nothing.", tool_server)
    assert trajectory.metrics == trajectory.metrics | {
        "turns": 1,
        "tool_calls": 0,
        "tool_errors": 0,
        "completed": True,
    }


async def test_a_timeout_and_an_oversize_result_become_messages_and_the_session_lives_on(
    scripted_url: str, tool_server: MCPSession
) -> None:
    config = MCPRolloutConfig(tool_timeout=0.5, max_result_chars=100)
    trajectory = await mcp_rollout(
        scripted("misbehaving", scripted_url), "Be slow.", tool_server, config
    )
    results = [m["content"] for m in trajectory.messages() if m["role"] == "tool"]
    assert results[0] == "Error: 'sleep' timed out after 0.5 s."
    assert results[1] == "x" * 100 + "\n[truncated: 100 of 5000 characters shown]"
    assert trajectory.metrics["tool_errors"] == 1
    assert trajectory.metrics["tool_results_truncated"] == 1
    assert trajectory.messages()[-1]["content"] == "The tools were slow and verbose."
    assert (await tool_server.call_tool("echo", {"text": "ok"})).text == "ok"


# --- scoring without training -----------------------------------------------------------


async def test_evaluate_scores_a_model_per_scenario_and_overall(
    scripted_url: str, http_notes: MCPSession, tool_server: MCPSession
) -> None:
    scenarios = [GeneratedScenario(task="Add a note saying hello.", difficulty=1), "Do nothing."]
    sessions = [http_notes, tool_server]
    for model_name, expected in (("writer", 1.0), ("quitter", 0.0)):
        evaluation = await evaluate(
            scripted(model_name, scripted_url),
            scenarios,
            sessions,
            reward_scorer(lambda t: float(t.metrics["completed"])),
            rollouts_per_scenario=2,
            pbar_desc=None,
        )
        assert [r.task for r in evaluation.results] == ["Add a note saying hello.", "Do nothing."]
        assert [len(r.trajectories) for r in evaluation.results] == [2, 2]
        assert [r.mean_reward for r in evaluation.results] == [expected, expected]
        assert evaluation.mean_reward == expected
    assert "from a rollout" in (await http_notes.call_tool("list_notes", {})).text


# --- scenarios -------------------------------------------------------------------------


def test_a_scenario_collection_splits_filters_shuffles_and_round_trips_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    collection = GeneratedScenarioCollection(
        [GeneratedScenario(task=f"task number {i}", difficulty=i % 5 + 1) for i in range(10)]
    )
    train, val = collection.split(7)
    assert (len(train), len(val)) == (7, 3)
    assert val[0].task == "task number 7"
    assert {s.difficulty for s in collection.filter_by_difficulty(2, 3)} == {2, 3}
    shuffled = collection.shuffle(seed=1)
    assert shuffled != collection
    assert sorted(s.task for s in shuffled) == sorted(s.task for s in collection)
    assert collection.shuffle(seed=1) == shuffled
    assert GeneratedScenarioCollection.from_json(collection.to_json(indent=2)) == collection
    collection.preview(n=2)
    assert capsys.readouterr().out == (
        "1. task number 0  (difficulty 1/5)\n2. task number 1  (difficulty 2/5)\n"
    )
    with pytest.raises(art.ArtValueError, match="train_size"):
        collection.split(11)
    with pytest.raises(ValueError, match="difficulty"):
        GeneratedScenario(task="too hard", difficulty=6)


async def test_generate_scenarios_asks_with_a_schema_until_n_valid_distinct_ones(
    scripted_url: str, stdio_notes: MCPSession
) -> None:
    tools = await stdio_notes.list_tools()
    collection = await generate_scenarios(
        tools,
        await stdio_notes.list_resources(),
        num_scenarios=3,
        show_preview=False,
        generator_model="openai/generator",
        generator_api_key="scripted",
        generator_base_url=scripted_url,
    )
    assert [s.to_dict() for s in collection] == [
        {"task": "List every note tagged home.", "difficulty": 1},
        {"task": "Find the note about the kickoff meeting and report its day.", "difficulty": 2},
        {"task": "Delete the grocery note, then list what is left.", "difficulty": 3},
    ]
    asked = [r for r in _ScriptedModel.requests if r["model"] == "generator"]
    assert len(asked) == 2
    schema = asked[1]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scenarios"]["minItems"] == 2  # only the missing ones
    assert "add_note" in asked[0]["messages"][0]["content"]

    with pytest.raises(ScenarioGenerationError, match="gave 2 valid distinct scenarios of the 5"):
        await generate_scenarios(
            tools,
            num_scenarios=5,
            show_preview=False,
            generator_model="openai/generator",
            generator_api_key="scripted",
            generator_base_url=scripted_url,
            max_attempts=1,
        )


async def test_generate_scenarios_with_the_local_model_returns_exactly_n_valid_ones(
    served: art.TrainableModel, stdio_notes: MCPSession
) -> None:
    collection = await generate_scenarios(
        await stdio_notes.list_tools(),
        num_scenarios=3,
        show_preview=False,
        generator_model=served,
        max_task_length=100,
    )
    assert len(collection) == 3
    assert len({s.task.casefold() for s in collection}) == 3
    assert all(1 <= s.difficulty <= 5 and s.task.strip() for s in collection)
