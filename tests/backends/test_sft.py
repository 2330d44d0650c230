"""Supervised fine-tuning (`model.train_sft`, `art.utils.sft.train_sft_from_file`), then RL.

On the real default model through LocalBackend: SFT on 80 examples of an answer format
the base model never writes brings its held-out format rate at temperature 0 to >= 0.8,
served at once as `name` and `name@step`; two RL steps then continue from that
checkpoint. Tool calls are trained as the endpoint renders and parses them. A file with
bad lines names each (`file:line`, field) and trains and writes nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_server import KEY, Server

import art
from art.backends import serverless
from art.core.data.sft_data import SFTDataError, create_lr_schedule, iterate_file
from art.local import LocalBackend
from art.serverless.backend import ServerlessBackend
from art.utils.sft import train_sft_from_file

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
FORMAT = re.compile(r"^\[\[answer: -?\d+\]\]$")


def _question(a: int, b: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is {a} plus {b}?"}]


def _example(a: int, b: int) -> dict[str, Any]:
    return {
        "messages": [*_question(a, b), {"role": "assistant", "content": f"[[answer: {a + b}]]"}]
    }


def _pairs(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randint(1, 60), rng.randint(1, 60)) for _ in range(n)]


@pytest.fixture(scope="module")
def backend(shared_backend: LocalBackend) -> LocalBackend:
    return shared_backend


@pytest.fixture(scope="module")
def art_path(shared_backend: LocalBackend) -> Path:
    return Path(shared_backend.path)


async def _answers(
    model: art.TrainableModel, questions: list[Any], step: int | None = None, **kwargs: Any
) -> list[Any]:
    client = model.openai_client()

    async def one(messages: list[Any]) -> Any:
        completion = await client.chat.completions.create(
            model=model.get_inference_name(step),
            messages=messages,
            max_tokens=48,
            temperature=0,
            **kwargs,
        )
        return completion.choices[0]

    return list(await asyncio.gather(*(one(q) for q in questions)))


async def _format_rate(model: art.TrainableModel, questions: list[Any]) -> float:
    choices = await _answers(model, questions)
    return sum(bool(FORMAT.match((c.message.content or "").strip())) for c in choices) / len(
        choices
    )


def _history(model_dir: Path) -> list[dict[str, Any]]:
    path = model_dir / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.asyncio(loop_scope="session")
async def test_sft_teaches_a_format_the_base_never_writes_then_rl_continues(
    backend: LocalBackend, art_path: Path, tmp_path: Path
) -> None:
    model = art.TrainableModel(name="format", project="sft", base_model=BASE)
    await model.register(backend)
    pairs = _pairs(96, seed=0)
    held_out = [_question(a, b) for a, b in pairs[80:]]
    assert await _format_rate(model, held_out) == 0.0  # the base model never writes it

    data = tmp_path / "format.jsonl"
    data.write_text("".join(json.dumps(_example(a, b)) + "\n" for a, b in pairs[:80]))
    await train_sft_from_file(model, str(data), batch_size=8, peak_lr=1e-3)

    assert await model.get_step() == 1
    assert await _format_rate(model, held_out) >= 0.8  # served at once as `name`
    pinned = await _answers(model, held_out[:2], step=1)  # and as `name@1`
    assert all(FORMAT.match((c.message.content or "").strip()) for c in pinned)

    model_dir = art_path / "sft" / "models" / "format"
    rows = [row for row in _history(model_dir) if "sft/loss/train" in row]
    assert [row["sft/gradient_step"] for row in rows] == list(range(1, 11))  # 80 / 8, one row each
    assert all(row["step"] == 1 and row["sft/tokens"] > 0 for row in rows)
    # The file's schedule: one warm-up batch to the peak, then linear decay to 0.
    assert [row["sft/loss/learning_rate"] for row in rows] == pytest.approx(
        create_lr_schedule(10, 1e-3, "linear", warmup_steps=1)
    )
    assert rows[-1]["sft/loss/train"] < rows[0]["sft/loss/train"] / 4
    assert not list(model_dir.glob(".sft-*"))  # the spooled examples are gone

    # RL from the SFT checkpoint: reward the right sum, two steps.
    client = model.openai_client()

    async def rollout(a: int, b: int) -> art.Trajectory:
        trajectory = art.Trajectory(messages_and_choices=_question(a, b))
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),
            max_tokens=12,
            temperature=1.0,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        trajectory.reward = float((choice.message.content or "").strip() == f"[[answer: {a + b}]]")
        trajectory.reward += 0.1 * bool(FORMAT.match((choice.message.content or "").strip()))
        return trajectory

    for step in range(2):
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(a, b) for _ in range(6))
            for a, b in pairs[step * 4 : step * 4 + 4]
        )
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-5))
    assert await model.get_step() == 3
    rl_rows = [row for row in _history(model_dir) if "data/step_loss_bearing_tokens" in row]
    assert [row["step"] for row in rl_rows] == [1, 2]
    assert sum(row["data/step_loss_bearing_tokens"] for row in rl_rows) > 0
    assert await _format_rate(model, held_out) >= 0.8  # RL went on from the SFT weights


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CITIES = ["Paris", "Lima", "Oslo", "Cairo", "Tokyo", "Quito", "Perth", "Dakar", "Hanoi", "Bern"]


def _tool_conversation(city: str) -> art.Trajectory:
    return art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": f"Is it raining in {city}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": json.dumps({"city": city}),
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "light rain, 12 C"},
            {"role": "assistant", "content": f"Yes, light rain in {city}."},
        ],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )


@pytest.mark.asyncio(loop_scope="session")
async def test_sft_trains_tool_calls_as_the_endpoint_renders_and_parses_them(
    backend: LocalBackend,
) -> None:
    model = art.TrainableModel(name="tools", project="sft", base_model=BASE)
    await model.register(backend)
    questions = [[{"role": "user", "content": f"Is it raining in {city}?"}] for city in CITIES[7:]]

    def calls(choices: list[Any]) -> list[str]:
        return [
            json.loads(c.message.tool_calls[0].function.arguments).get("city", "")
            if c.message.tool_calls
            else ""
            for c in choices
        ]

    before = calls(await _answers(model, questions, tools=[WEATHER_TOOL]))
    # A generator, read once: the trainer streams it.
    trajectories = (_tool_conversation(city) for _ in range(6) for city in CITIES[:7])
    await model.train_sft(trajectories, art.TrainSFTConfig(learning_rate=1e-3, batch_size=6))
    answered = await _answers(model, questions, tools=[WEATHER_TOOL])
    after = calls(answered)
    texts = [c.message.content for c in answered]
    assert sum(after[i] == city for i, city in enumerate(CITIES[7:])) >= 2, (before, after, texts)
    assert sum(after[i] == city for i, city in enumerate(CITIES[7:])) > sum(
        before[i] == city for i, city in enumerate(CITIES[7:])
    )


@pytest.mark.asyncio(loop_scope="session")
async def test_a_file_with_bad_lines_names_each_and_trains_nothing(
    backend: LocalBackend, art_path: Path, tmp_path: Path
) -> None:
    model = art.TrainableModel(name="bad-data", project="sft", base_model=BASE)
    await model.register(backend)
    model_dir = art_path / "sft" / "models" / "bad-data"
    before = sorted(p.name for p in model_dir.rglob("*"))
    good = json.dumps(_example(1, 2))
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
    lines = [
        good,
        "{not json",  # 2
        json.dumps({"messages": [{"role": "user", "content": "hi"}]}),  # 3: no assistant turn
        json.dumps(
            {"messages": [{"role": "robot", "content": "hi"}, _example(1, 1)["messages"][1]]}
        ),
        json.dumps({"messages": [{"role": "assistant", "content": None, "tool_calls": [call]}]}),
        "",
        good,
        json.dumps({"messages": _example(3, 4)["messages"], "weight": 0}),  # 8
    ]
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(SFTDataError) as caught:
        await train_sft_from_file(model, str(data))
    problems = caught.value.problems
    assert any(p.startswith(f"{data}:2: line: not JSON") for p in problems)
    assert any(p.startswith(f"{data}:3: messages: no assistant turn") for p in problems)
    assert any(p.startswith(f"{data}:4: messages[0].role: 'robot'") for p in problems)
    assert any(
        p.startswith(f"{data}:5: messages[0].tool_calls[0].function.arguments: not JSON")
        for p in problems
    )
    assert any(p.startswith(f"{data}:8: weight: not a field") for p in problems)
    assert not any(f"{data}:1:" in p or f"{data}:7:" in p for p in problems)
    assert f"{data}:5" in str(caught.value)

    # One example longer than the model trains: found by the trainer's own tokenizer,
    # before any step, named by its line.
    long = {
        "messages": [
            {"role": "user", "content": "word " * 9000},
            {"role": "assistant", "content": "ok"},
        ]
    }
    data.write_text(good + "\n" + json.dumps(long) + "\n")
    with pytest.raises(
        SFTDataError, match=rf"{re.escape(str(data))}:2: messages: \d+ tokens, longer than the 8192"
    ):
        await train_sft_from_file(model, str(data))

    with pytest.raises(art.ConfigError, match=r"TrainSFTConfig\.learning_rate"):
        await model.train_sft(
            [art.Trajectory(messages_and_choices=_example(1, 2)["messages"])] * 3,
            art.TrainSFTConfig(learning_rate=[1e-4], batch_size=1),
        )
    assert await model.get_step() == 0
    assert sorted(p.name for p in model_dir.rglob("*")) == before  # nothing trained or written


def test_the_file_streams_shuffled_per_epoch_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(_example(i, 0)) + "\n" for i in range(10)))
    order = [where for where, _ in iterate_file(data, epochs=2, shuffle_buffer_size=4)]
    assert sorted(order[:10]) == sorted(order[10:]) == sorted(f"{data}:{i}" for i in range(1, 11))
    assert order[:10] != [f"{data}:{i}" for i in range(1, 11)]  # shuffled
    assert order[:10] != order[10:]  # each epoch its own order
    resumed = [
        where for where, _ in iterate_file(data, epochs=2, shuffle_buffer_size=4, initial_skip=7)
    ]
    assert resumed == order[7:]


def test_schedules_and_config_errors_name_the_field() -> None:
    assert create_lr_schedule(4, 1.0, "constant", warmup_steps=2) == [0.5, 1.0, 1.0, 1.0]
    assert create_lr_schedule(3, 1.0, "linear") == [1.0, 0.5, 0.0]
    assert create_lr_schedule(3, 1.0, "cosine") == pytest.approx([1.0, 0.5, 0.0])
    with pytest.raises(art.ConfigError, match="batch_size"):
        art.TrainSFTConfig(batch_size=0)
    with pytest.raises(art.ConfigError, match="learning_rate"):
        art.TrainSFTConfig(learning_rate=[])
    with pytest.raises(art.ConfigError, match="max_grad_norm"):
        art.dev.TrainSFTConfig(max_grad_norm=0)
    with pytest.raises(art.ConfigError, match="nonsense"):
        art.dev.TrainSFTConfig(nonsense=1)  # type: ignore[call-arg]


# --- ServerlessBackend through a real `art serve` -------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("serve-sft") / ".art")
    yield running
    running.stop()


@pytest.mark.asyncio(loop_scope="session")
async def test_serverless_sft_uploads_in_parts_and_trains_on_art_serve(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serverless, "_UPLOAD_PART_BYTES", 2048)  # ~20 parts for 80 examples
    backend = ServerlessBackend(base_url=server.url, api_key=KEY)
    model = art.TrainableModel(name="format", project="sft", base_model=BASE)
    await model.register(backend)
    pairs = _pairs(96, seed=0)
    held_out = [_question(a, b) for a, b in pairs[80:]]
    assert await _format_rate(model, held_out) == 0.0

    bad = [art.Trajectory(messages_and_choices=_question(1, 2))]  # no assistant turn
    with pytest.raises(SFTDataError, match=r"trajectories\[0\]: messages: no assistant turn"):
        await model.train_sft(bad)

    trajectories = [
        art.Trajectory(messages_and_choices=_example(a, b)["messages"]) for a, b in pairs[:80]
    ]
    await model.train_sft(trajectories, art.TrainSFTConfig(learning_rate=1e-3, batch_size=8))
    assert await model.get_step() == 1
    assert await _format_rate(model, held_out) >= 0.8
    rows = [
        row
        for row in _history(server.path / "sft" / "models" / "format")
        if "sft/loss/train" in row
    ]
    assert [row["sft/gradient_step"] for row in rows] == list(range(1, 11))
    assert not list((server.path / ".art-serve" / "sft-data").rglob("*.jsonl"))  # consumed

    # A client other than ours: every bad line of an upload is a 400 naming it.
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}
    ) as http:
        model_id = "sft~format"
        upload = await http.post(
            f"/preview/models/{model_id}/sft-data",
            content=(json.dumps(_example(1, 2)) + "\n{broken\n").encode(),
        )
        assert upload.status_code == 200, upload.text
        job = await http.post(
            "/preview/sft-training-jobs",
            json={"model_id": model_id, "training_data_url": upload.json()["url"]},
        )
        assert job.status_code == 400
        error = job.json()["error"]
        assert error["code"] == "SFTDataError"
        assert error["problems"] == [
            f"{upload.json()['url']}:2: line: not JSON (Expecting property name enclosed in double quotes at column 2)"
        ]
        missing = await http.post(
            "/preview/sft-training-jobs",
            json={
                "model_id": model_id,
                "training_data_url": "art-serve:///sft-data/sft-data-" + "0" * 32,
            },
        )
        assert missing.status_code == 404
    assert await model.get_step() == 1
