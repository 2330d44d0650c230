"""LocalBackend registration, logging and checkpoints on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from helpers import WEATHER_TOOL, tool_trajectory

import art
from art.core.store.model_store import ModelStore
from art.local import LocalBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service


def model_dir(root: Path, name: str = "agent-001") -> Path:
    return root / "proj" / "models" / name


def history(root: Path, name: str = "agent-001") -> list[dict[str, object]]:
    lines = (model_dir(root, name) / "history.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


async def registered(root: Path, name: str = "agent-001") -> art.Model:
    """A model served elsewhere, logged by LocalBackend: storage without a model service."""
    model = art.Model(name=name, project="proj")
    await model.register(LocalBackend(path=root))
    return model


async def test_seed_style_rollouts_are_gathered_and_logged(
    art_path: Path, chat_server_url: str
) -> None:
    """The documented loop, up to `model.log`, against a real OpenAI-compatible endpoint."""
    model = art.Model(
        name="agent-001", project="proj", inference_base_url=chat_server_url, inference_api_key="k"
    )
    await model.register(LocalBackend(path=art_path))
    scenarios = ["Paris", "Oslo", "Lima"]

    async def rollout(model: art.Model, city: str) -> art.Trajectory:
        client = model.openai_client()
        trajectory = art.Trajectory(
            messages_and_choices=[
                {"role": "system", "content": "Answer with the weather."},
                {"role": "user", "content": f"Weather in {city}?"},
            ],
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
        )
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),
            tools=trajectory.tools,  # type: ignore[arg-type]
            logprobs=True,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        trajectory.reward = 1.0 if city in (choice.message.content or "") else 0.0
        trajectory.metrics["answer_chars"] = len(choice.message.content or "")
        return trajectory

    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(model, city) for _ in range(2)) for city in scenarios),
        pbar_desc="gather",
    )
    await model.log(groups, split="val")

    table = pq.read_table(model_dir(art_path) / "trajectories" / "val" / "0000.parquet").to_pylist()
    assert len(table) == 6
    assert {row["reward"] for row in table} == {1.0}
    first = table[0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert first["messages"][2]["trainable"] is True
    assert json.loads(first["messages"][2]["tool_calls"])[0]["function"]["name"] == "get_weather"
    assert json.loads(first["metrics"])["answer_chars"] == len("echo: Weather in Paris?")
    assert json.loads(first["tools"]) == [WEATHER_TOOL]
    assert history(art_path)[0]["val/reward"] == 1.0


async def test_parquet_holds_every_message_tool_call_reward_and_metric(art_path: Path) -> None:
    model = await registered(art_path)
    groups = [
        art.TrajectoryGroup([tool_trajectory(1.0, city="Rome"), tool_trajectory(0.25)]),
        art.TrajectoryGroup([tool_trajectory(0.5, city="Kyiv")], metadata={"scenario": "k"}),
    ]
    await model.log(groups, split="train")

    path = model_dir(art_path) / "trajectories" / "train" / "0000.parquet"
    rows = pq.read_table(path).to_pylist()
    assert [(r["group_index"], r["trajectory_index"], r["reward"]) for r in rows] == [
        (0, 0, 1.0),
        (0, 1, 0.25),
        (1, 0, 0.5),
    ]
    rome = rows[0]
    assert [m["role"] for m in rome["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert [m["trainable"] for m in rome["messages"]] == [False, False, True, False, True]
    call = json.loads(rome["messages"][2]["tool_calls"])[0]
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
    assert rome["messages"][3]["tool_call_id"] == "call_7"
    assert rome["messages"][4]["content"] == "It is sunny in Rome."
    assert json.loads(rome["metrics"]) == {"turns": 2, "correct": True}
    assert json.loads(rome["metadata"]) == {"city": "Rome", "attempt": 1}
    assert rome["logs"] == ["called get_weather once"]
    assert json.loads(rows[2]["group_metadata"]) == {"scenario": "k"}

    assert ModelStore(art_path, "proj", "agent-001").read_trajectories("train", 0) == groups


async def test_group_metrics_and_logs_are_stored_and_logged_as_arts(art_path: Path) -> None:
    """`TrajectoryGroup(metrics=, logs=)` (ART 0.5.18): the step's Parquet file keeps both,
    and the history row gets `val/group_<name>`, the mean over the groups."""
    model = await registered(art_path)
    groups = [
        art.TrajectoryGroup([tool_trajectory(1.0)], metrics={"hops": 1}, logs=["easy"]),
        art.TrajectoryGroup([tool_trajectory(0.0)], metrics={"hops": 3}, logs=["hard"]),
    ]
    await model.log(groups)
    assert ModelStore(art_path, "proj", "agent-001").read_trajectories("val", 0) == groups
    rows = pq.read_table(model_dir(art_path) / "trajectories" / "val" / "0000.parquet").to_pylist()
    assert [json.loads(row["group_metrics"]) for row in rows] == [{"hops": 1}, {"hops": 3}]
    assert [row["group_logs"] for row in rows] == [["easy"], ["hard"]]
    assert history(art_path)[-1]["val/group/hops"] == 2.0


async def test_failed_rollouts_are_stored_and_counted_in_exception_rate(art_path: Path) -> None:
    model = await registered(art_path)

    async def rollout(i: int) -> art.Trajectory:
        if i % 4 == 0:
            raise TimeoutError(f"scenario {i} timed out")
        return tool_trajectory(i / 10)

    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(g * 4 + i) for i in range(4)) for g in range(2)),
        max_exceptions=0.25,
    )
    await model.log(groups, split="train")

    row = history(art_path)[-1]
    assert row["train/exception_rate"] == 0.25
    assert row["train/num_exceptions"] == 2
    assert row["data/step_num_trajectories"] == 8  # ART counts every rollout, raised ones too
    stored = ModelStore(art_path, "proj", "agent-001").read_trajectories("train", 0)
    assert [len(g.exceptions) for g in stored] == [1, 1]
    assert "timed out" in stored[0].exceptions[0].message


async def test_history_rows_carry_split_prefixed_averages(art_path: Path) -> None:
    model = await registered(art_path)
    await model.log([art.TrajectoryGroup([tool_trajectory(1.0), tool_trajectory(0.0)])])
    await model.log(metrics={"custom": 3.5}, split="train", step=4)
    rows = history(art_path)
    assert rows[0]["step"] == 0
    assert rows[0]["val/reward"] == 0.5
    assert rows[0]["val/reward_std_dev"] == 0.5
    assert rows[0]["val/trainable_groups"] == 1
    assert rows[0]["val/turns"] == 2
    assert rows[0]["val/correct"] == 0.5
    assert rows[0]["val/data/step_num_scenarios"] == 1  # ART's counts, under the split
    assert "data/step_num_groups_trainable" not in rows[0]  # ART records it for train only
    assert rows[1]["step"] == 4
    assert rows[1]["train/custom"] == 3.5


async def test_a_second_log_at_the_same_step_adds_to_the_file(art_path: Path) -> None:
    model = await registered(art_path)
    await model.log([art.TrajectoryGroup([tool_trajectory(1.0)])])
    await model.log([art.TrajectoryGroup([tool_trajectory(0.0)])])
    stored = ModelStore(art_path, "proj", "agent-001").read_trajectories("val", 0)
    assert [[t.reward for t in g] for g in stored] == [[1.0], [0.0]]


async def test_bad_input_is_refused_and_nothing_logged_is_lost(art_path: Path) -> None:
    model = await registered(art_path)
    await model.log([art.TrajectoryGroup([tool_trajectory(1.0)])])
    parquet = model_dir(art_path) / "trajectories" / "val" / "0000.parquet"
    before = (parquet.read_bytes(), (model_dir(art_path) / "history.jsonl").read_text())

    no_role = tool_trajectory(1.0)
    no_role.messages_and_choices.append({"content": "lost role"})  # type: ignore[arg-type]
    with pytest.raises(
        art.TrajectoryValidationError,
        match=r"trajectories\[0\]\.trajectories\[0\]\.messages_and_choices\[5\]: message has no 'role'",
    ):
        await model.log([art.TrajectoryGroup([no_role])])

    nan_metric = tool_trajectory(1.0)
    nan_metric.metrics["score"] = float("nan")
    with pytest.raises(art.TrajectoryValidationError, match=r"metrics\['score'\]: must be finite"):
        await model.log([art.TrajectoryGroup([nan_metric])])

    bad_meta = tool_trajectory(1.0)
    bad_meta.metadata["obj"] = object()  # type: ignore[assignment]
    with pytest.raises(art.TrajectoryValidationError, match=r"metadata\['obj'\]"):
        await model.log([art.TrajectoryGroup([bad_meta])])

    with pytest.raises(
        art.TrajectoryValidationError, match=r"trajectories\[1\]: the group is empty"
    ):
        await model.log([art.TrajectoryGroup([tool_trajectory(1.0)]), art.TrajectoryGroup([])])
    with pytest.raises(art.TrajectoryValidationError, match="no trajectory groups"):
        await model.log([])
    with pytest.raises(art.ConfigError, match="split"):
        await model.log([art.TrajectoryGroup([tool_trajectory(1.0)])], split="../escape")

    after = (parquet.read_bytes(), (model_dir(art_path) / "history.jsonl").read_text())
    assert after == before


async def test_a_model_used_before_register_says_how_to_fix_it() -> None:
    model = art.TrainableModel(name="m", project="p", base_model="b")
    for call in (
        model.get_step(),
        model.log([art.TrajectoryGroup([art.Trajectory()])]),
        model.train([]),
    ):
        with pytest.raises(art.ModelNotRegisteredError, match=r"await model.register\(backend\)"):
            await call
    with pytest.raises(art.ModelNotRegisteredError):
        model.openai_client()


def test_names_must_be_safe_directory_names() -> None:
    with pytest.raises(ValueError, match=r"name '\.\./x' is not a valid name"):
        art.TrainableModel(name="../x", project="p", base_model="b")
    with pytest.raises(ValueError, match="project"):
        art.Model(name="ok", project="a/b")
    with pytest.raises(ValueError, match="base_model"):
        art.TrainableModel(name="ok", project="p", base_model=" ")


async def test_register_writes_model_json_and_refuses_a_changed_base_model(art_path: Path) -> None:
    config = art.dev.InternalModelConfig(peft_args=art.dev.PeftArgs(r=4))
    model = art.TrainableModel(
        name="m",
        project="proj",
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        config={"lr": 1},
        _internal_config=config,
    )
    backend = LocalBackend(path=art_path, in_process=True)
    try:
        await model.register(backend)
    finally:
        await backend.close()
    saved = json.loads((model_dir(art_path, "m") / "model.json").read_text())
    assert saved["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert saved["config"] == {"lr": 1}
    assert saved["internal_config"]["peft_args"]["r"] == 4

    other = art.TrainableModel(name="m", project="proj", base_model="some/other-model")
    with pytest.raises(art.ConfigError, match="base_model"):
        await other.register(LocalBackend(path=art_path))
    assert json.loads((model_dir(art_path, "m") / "model.json").read_text()) == saved


async def test_register_refuses_a_config_that_cannot_be_stored(art_path: Path) -> None:
    model = art.TrainableModel(name="m", project="proj", base_model="b", config={"f": object()})
    with pytest.raises(art.ConfigError, match="config"):
        await model.register(LocalBackend(path=art_path))


async def test_step_is_the_highest_complete_checkpoint(art_path: Path) -> None:
    model = await registered(art_path)
    assert await model.get_step() == 0
    checkpoints = model_dir(art_path) / "checkpoints"
    for name in ("0001", "0003", ".0004.tmp", "0002"):
        (checkpoints / name).mkdir(parents=True)
    assert await model.get_step() == 3


async def test_delete_checkpoints_keeps_the_latest_and_the_best_mean(
    art_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As ART 0.5.18: the best step is the one whose rows average highest on the metric."""
    model = await registered(art_path)
    checkpoints = model_dir(art_path) / "checkpoints"
    for step, rewards in [(1, [0.2]), (2, [0.1, 0.9]), (3, [0.6, 0.6]), (4, [0.5]), (5, [])]:
        (checkpoints / f"{step:04d}").mkdir(parents=True)
        for reward in rewards:
            await model.log(metrics={"reward": reward}, step=step)
    assert await model.delete_checkpoints() == [1, 2, 4]
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0003", "0005"]
    assert capsys.readouterr().out == ""


async def test_delete_checkpoints_without_the_metric_keeps_the_latest_and_says_so(
    art_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ART's examples call it at every step from step 0, before anything is validated."""
    model = await registered(art_path)
    checkpoints = model_dir(art_path) / "checkpoints"
    for step in (0, 1, 2):
        (checkpoints / f"{step:04d}").mkdir(parents=True)
    assert await model.delete_checkpoints() == [0, 1]
    history_path = model_dir(art_path) / "history.jsonl"
    assert capsys.readouterr().out == f'"{history_path}" not found\n'

    (checkpoints / "0003").mkdir()
    await model.log(metrics={"loss": 1.0}, step=3)
    assert await model.delete_checkpoints("val/accuracy") == [2]
    assert capsys.readouterr().out == 'No "val/accuracy" metric found in history\n'
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0003"]


async def test_a_trainable_model_deletes_checkpoints_at_step_0(
    art_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ART's loop: `await model.delete_checkpoints()` at the top of every step, from 0."""
    backend = LocalBackend(path=art_path, in_process=True)
    model = art.TrainableModel(
        name="agent-001", project="proj", base_model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    try:
        await model.register(backend)
        assert await model.get_step() == 0
        assert await model.delete_checkpoints() == []
        history_path = model_dir(art_path) / "history.jsonl"
        assert capsys.readouterr().out == f'"{history_path}" not found\n'
        assert [p.name for p in (model_dir(art_path) / "checkpoints").iterdir()] == ["0000"]
        assert await model.get_step() == 0
    finally:
        await backend.close()


async def test_log_refuses_reserved_and_non_numeric_metrics(art_path: Path) -> None:
    """`step` and `recorded_at` are every row's own columns: no metric may overwrite them."""
    model = await registered(art_path)
    await model.log(metrics={"loss": 1.0})
    before = (model_dir(art_path) / "history.jsonl").read_text()
    with pytest.raises(art.ConfigError, match=r"metrics\['step'\]"):
        await model.log(metrics={"step": 777})
    with pytest.raises(art.ConfigError, match=r"metrics\['speed'\]: a metric must be a number"):
        await model.log(metrics={"speed": "fast"})  # type: ignore[dict-item]
    # The store refuses them too, for callers that skip `model.log` (art serve's log route).
    store = ModelStore(art_path, "proj", "agent-001")
    with pytest.raises(art.ConfigError, match=r"metrics\['recorded_at'\]"):
        store.append_history(3, {"recorded_at": 1.0})
    with pytest.raises(art.ConfigError, match=r"metrics\['training_step'\]"):
        store.append_history(3, {"training_step": 1.0})  # ART's x-axis, every row's own
    with pytest.raises(art.TrajectoryValidationError, match=r"\[1\]: the group is empty"):
        store.write_trajectories(
            "val", 0, [art.TrajectoryGroup([tool_trajectory(1.0)]), art.TrajectoryGroup([])]
        )
    assert (model_dir(art_path) / "history.jsonl").read_text() == before
    assert not (model_dir(art_path) / "trajectories").exists()
    assert [row["step"] for row in history(art_path)] == [0]


def test_the_train_split_stores_a_retried_steps_groups_once(art_path: Path) -> None:
    """A `train` that failed and is retried logs the same groups again: they are kept once."""
    store = ModelStore(art_path, "proj", "agent-001")
    groups = [art.TrajectoryGroup([tool_trajectory(1.0), tool_trajectory(0.0)])]
    retried = [art.TrajectoryGroup([tool_trajectory(0.5)])]
    store.write_trajectories("train", 0, groups)
    store.write_trajectories("train", 0, groups)  # the retry
    store.write_trajectories("train", 0, groups + retried)  # a retry with one more group
    stored = store.read_trajectories("train", 0)
    assert [[t.reward for t in group] for group in stored] == [[1.0, 0.0], [0.5]]
