"""ART's benchmarking helpers on a small project's real Parquet logs.

The project "bench" has a model "trained" (val steps 0-2 and a train step) and a prompted
"prompted" (val step 0), written by the model store as training writes them. Each val
step of "trained" has a group of two rollouts and a group of one, so a mean of group
means (what the aggregates take) differs from the plain mean over rows (what the charts
draw), and a test that mixed them up fails.
"""

from __future__ import annotations

import asyncio
import json
import struct
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import tool_trajectory
from observe_helpers import read_wandb_run, run_python

import art
from art.core.data.errors import ConfigError
from art.core.store.model_store import ModelStore
from art.utils.benchmark_rollout import benchmark_rollout
from art.utils.benchmarking.aggregate_trajectories import (
    load_aggregated_trajectories,
    load_latest_metrics,
)
from art.utils.benchmarking.charts import percentage_comparison_bar_chart, training_progress_chart
from art.utils.benchmarking.filter_model_split import filter_rename_model_split
from art.utils.benchmarking.load_trajectories import load_trajectories
from art.utils.benchmarking.types import BenchmarkModelKey
from art.utils.old_benchmarking.calculate_step_metrics import calculate_step_std_dev
from art.utils.old_benchmarking.display_image_grid import display_image_grid
from art.utils.old_benchmarking.generate_comparison_table import generate_comparison_table
from art.utils.old_benchmarking.generate_line_graphs import generate_line_graphs
from art.utils.old_benchmarking.load_benchmarked_models import load_benchmarked_models
from art.utils.old_benchmarking.types import BenchmarkedModelKey

# Rewards of (group of two, group of one) at each val step of "trained".
TRAINED_VAL = {0: ([0.0, 0.2], [0.4]), 1: ([0.4, 0.6], [0.6]), 2: ([0.8, 1.0], [0.8])}
PROMPTED_VAL = [0.5, 0.7]


def _group(rewards: list[float], step: int, topic: str) -> art.TrajectoryGroup:
    trajectories = []
    for i, reward in enumerate(rewards):
        trajectory = tool_trajectory(reward, city=f"City{i}")
        trajectory.metrics["turns"] = step + i  # per-trajectory, so its mean is checkable
        trajectories.append(trajectory)
    return art.TrajectoryGroup(
        trajectories, metadata={"topic": topic}, metrics={"difficulty": len(rewards)}
    )


@pytest.fixture
def art_path(tmp_path: Path) -> Path:
    path = tmp_path / ".art"
    trained = ModelStore(path, "bench", "trained")
    for step, (pair, single) in TRAINED_VAL.items():
        trained.write_trajectories(
            "val", step, [_group(pair, step, "pair"), _group(single, step, "single")]
        )
        trained.append_history(step, {"val/reward": 0.5})
    trained.append_history(1, {"loss/train": 0.1})  # a later row of step 1
    failed = art.TrajectoryGroup(
        [tool_trajectory(0.3)], exceptions=[ValueError("rollout broke")]
    )  # the exception is data in the log, never a row of the table
    trained.write_trajectories("train", 0, [failed])
    ModelStore(path, "bench", "prompted").write_trajectories(
        "val", 0, [_group(PROMPTED_VAL, 0, "pair")]
    )
    return path


def _rows(table: pa.Table, **where: Any) -> list[dict[str, Any]]:
    return [r for r in table.to_pylist() if all(r[k] == v for k, v in where.items())]


# --- load, filter ----------------------------------------------------------------------


async def test_load_trajectories_flattens_every_logged_trajectory(art_path: Path) -> None:
    table = await load_trajectories("bench", art_path=art_path)

    assert isinstance(table, pa.Table)
    assert table.num_rows == 9 + 1 + 2
    assert table.column_names[:7] == [
        "model",
        "split",
        "step",
        "reward",
        "group_number",
        "messages",
        "logs",
    ]
    assert {"metric_turns", "metric_correct", "metadata_city", "metadata_attempt"} <= set(
        table.column_names
    )
    assert {"group_metric_difficulty", "group_metadata_topic"} <= set(table.column_names)
    assert table.schema.field("metric_correct").type == pa.float64()

    rows = _rows(table, model="trained", split="val", step=1)
    assert sorted(r["reward"] for r in rows) == [0.4, 0.6, 0.6]
    single = next(r for r in rows if r["group_metadata_topic"] == "single")
    assert single["group_metric_difficulty"] == 1.0
    assert single["metric_correct"] == 1.0
    assert single["metadata_attempt"] == "1"
    assert single["logs"] == ["called get_weather once"]
    messages = single["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert [m["trainable"] for m in messages] == [False, False, True, False, True]
    assert messages[2]["tool_calls"] == [
        {"function": {"name": "get_weather", "arguments": '{"city": "City0"}'}}
    ]
    assert messages[4]["content"] == "It is sunny in City0."
    assert messages[4]["tool_calls"] is None

    # One number per (model, split, step, group), from 1; the group's rows share it.
    numbers = {
        (r["model"], r["split"], r["step"], r["group_metadata_topic"]): r["group_number"]
        for r in table.to_pylist()
    }
    assert sorted(numbers.values()) == list(range(1, len(numbers) + 1))
    assert len(numbers) == 8
    assert [r["reward"] for r in _rows(table, split="train")] == [0.3]


async def test_load_trajectories_selects_models_and_names_what_is_missing(
    art_path: Path,
) -> None:
    table = await load_trajectories("bench", models=["prompted"], art_path=art_path, debug=True)
    assert set(table.column("model").to_pylist()) == {"prompted"}

    with pytest.raises(ConfigError, match=r"models.*'nobody'.*Pick from: prompted, trained"):
        await load_trajectories("bench", models=["nobody"], art_path=art_path)
    with pytest.raises(ConfigError, match="project_name"):
        await load_trajectories("elsewhere", art_path=art_path)

    ModelStore(art_path, "empty", "fresh").write_model({"name": "fresh"})
    empty = await load_trajectories("empty", art_path=art_path)
    assert empty.num_rows == 0
    assert "messages" in empty.column_names


async def test_filter_rename_model_split_keeps_the_keyed_rows_renamed(art_path: Path) -> None:
    table = await load_trajectories("bench", art_path=art_path)
    kept = filter_rename_model_split(
        table, [BenchmarkModelKey("trained", "RL", split="train"), BenchmarkModelKey("prompted")]
    )
    assert sorted(
        zip(kept.column("model").to_pylist(), kept.column("split").to_pylist(), strict=True)
    ) == [
        ("RL", "train"),
        ("prompted", "val"),
        ("prompted", "val"),
    ]
    assert str(BenchmarkModelKey("a", split=None)) == "a"
    assert BenchmarkModelKey("a").split == "val"
    with pytest.raises(ConfigError, match="df"):
        filter_rename_model_split(table.drop_columns(["split"]), [])


# --- aggregates ------------------------------------------------------------------------


async def test_aggregates_average_groups_first_then_the_step(art_path: Path) -> None:
    steps = await load_aggregated_trajectories("bench", art_path=art_path, include_history=True)

    val = _rows(steps, model="trained", split="val")
    assert [r["step"] for r in val] == [0, 1, 2]
    # Step 0: groups [0.0, 0.2] and [0.4]: (0.1 + 0.4) / 2, not the row mean 0.2.
    assert [r["metric_reward"] for r in val] == pytest.approx([0.25, 0.55, 0.85])
    # turns are step + i: the pair averages step + 0.5, the single group step.
    assert [r["metric_turns"] for r in val] == pytest.approx([0.25, 1.25, 2.25])
    # Sample std of the pair (0.1414...); the group of one has none and is left out.
    assert [r["metric_reward_std_dev"] for r in val] == pytest.approx([0.02**0.5] * 3)
    history = ModelStore(art_path, "bench", "trained").read_history()
    first_of_1 = next(row["recorded_at"] for row in history if row["step"] == 1)
    assert val[1]["recorded_at"] == first_of_1
    assert _rows(steps, model="prompted")[0]["recorded_at"] is None  # it has no history
    assert steps.column_names[:3] == ["model", "split", "step"]
    assert [(r["model"], r["split"]) for r in steps.to_pylist()] == [
        ("prompted", "val"),
        ("trained", "train"),
        *[("trained", "val")] * 3,
    ]

    only = await load_aggregated_trajectories("bench", metrics=["turns"], art_path=art_path)
    assert [n for n in only.column_names if n.startswith("metric_")] == ["metric_turns"]
    with pytest.raises(ConfigError, match=r"metrics.*'speed'"):
        await load_aggregated_trajectories("bench", metrics=["speed"], art_path=art_path)


async def test_latest_metrics_take_each_models_last_step_of_the_split(art_path: Path) -> None:
    latest = await load_latest_metrics("bench", art_path=art_path)
    assert [(r["model"], r["step"]) for r in latest.to_pylist()] == [
        ("prompted", 0),
        ("trained", 2),
    ]
    assert latest.column("metric_reward").to_pylist() == pytest.approx([0.6, 0.85])
    assert "split" not in latest.column_names

    train = await load_latest_metrics("bench", split="train", art_path=art_path)
    assert train.column("model").to_pylist() == ["trained"]
    with pytest.raises(ConfigError, match=r"split.*'test'.*Pick from: train, val"):
        await load_latest_metrics("bench", split="test", art_path=art_path)


# --- charts ----------------------------------------------------------------------------


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


async def test_training_progress_chart_draws_each_models_step_means(
    art_path: Path, tmp_path: Path
) -> None:
    table = await load_trajectories("bench", art_path=art_path)
    figure = training_progress_chart(
        table, "reward", models=[BenchmarkModelKey("trained", "RL"), "prompted"], perfect_score=1
    )
    axes = figure.axes[0]
    lines = {line.get_label(): line for line in axes.get_lines()}
    # The chart draws the plain mean of a step's rows: (0.0 + 0.2 + 0.4) / 3 at step 0.
    assert list(lines["RL"].get_xdata()) == [0, 1, 2]
    assert list(lines["RL"].get_ydata()) == pytest.approx([0.2, 1.6 / 3, 2.6 / 3])
    assert list(lines["prompted"].get_xdata()) == [0, 2]  # across the trained steps
    assert list(lines["prompted"].get_ydata()) == pytest.approx([0.6, 0.6])
    assert lines["prompted"].get_linestyle() == "--"
    assert list(lines["_ref"].get_ydata()) == [1, 1]
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["RL", "prompted"]
    assert axes.get_title() == "reward"
    assert axes.get_xlabel() == "Step"

    out = tmp_path / "progress.png"
    figure.savefig(out)
    assert _png_size(out) == (1800, 1200)  # 6 x 4 inches at 300 dpi

    # Without a model list: trained models first; labels and title as given.
    figure = training_progress_chart(
        table, "metric_turns", title="Turns", x_label="", y_label="turns", legend_loc=None
    )
    axes = figure.axes[0]
    assert [t.get_text() for t in axes.get_legend().get_texts()] == ["trained", "prompted"]
    assert (axes.get_title(), axes.get_xlabel(), axes.get_ylabel()) == ("Turns", "", "turns")


async def test_percentage_bar_chart_stacks_the_change_from_first_to_last_step(
    art_path: Path, tmp_path: Path
) -> None:
    table = await load_trajectories("bench", art_path=art_path, models=["trained", "prompted"])
    val = table.filter(pc.equal(table.column("split"), "val"))
    figure = percentage_comparison_bar_chart(
        val, "reward", y_label="accuracy", perfect_score=1.0, num_decimals=1
    )
    axes = figure.axes[0]
    heights = [round(p.get_height(), 6) for p in axes.patches]
    bottoms = [round(p.get_y(), 6) for p in axes.patches]
    # trained: 20% at step 0, +66.7 points by step 2 (stacked); prompted: 60%, one bar.
    assert heights == [20.0, round(2.6 / 3 * 100 - 20, 6), 60.0]
    assert bottoms == [0.0, 20.0, 0.0]
    texts = [t.get_text() for t in axes.texts]
    assert texts == ["RL +66.7%", "86.7%", "60.0%", "Perfect score"]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["trained", "prompted"]
    assert axes.get_ylabel() == "accuracy"
    assert axes.get_title() == "reward"

    out = tmp_path / "bars.png"
    figure.savefig(out)
    assert out.stat().st_size > 10_000
    assert _png_size(out) == (1800, 1200)

    turns = percentage_comparison_bar_chart(val, "turns")  # not in [0, 1]: no percentages
    assert [t.get_text() for t in turns.axes[0].texts] == ["RL +2", "2", "0"]


def test_each_chart_is_also_its_own_module_as_in_art() -> None:
    from art.utils.benchmarking.charts.percentage_comparison_bar_chart import (
        percentage_comparison_bar_chart as bars,
    )
    from art.utils.benchmarking.charts.training_progress_chart import (
        training_progress_chart as progress,
    )

    assert bars is percentage_comparison_bar_chart
    assert progress is training_progress_chart


async def test_charts_name_what_they_cannot_draw(art_path: Path) -> None:
    table = await load_trajectories("bench", art_path=art_path)
    with pytest.raises(ConfigError, match=r"metric_name.*'speed'"):
        training_progress_chart(table, "speed")
    with pytest.raises(ConfigError, match=r"models.*'ghost'"):
        training_progress_chart(table, "reward", models=["ghost"])
    with pytest.raises(ConfigError, match="num_decimals"):
        percentage_comparison_bar_chart(table, "reward", num_decimals=-1)
    with pytest.raises(ConfigError, match=r"df.*list"):
        training_progress_chart(table.to_pylist(), "reward")


# --- ART's first helpers ---------------------------------------------------------------


def test_benchmarked_models_hold_per_step_metrics(art_path: Path) -> None:
    key = BenchmarkedModelKey("trained", "val", step_indices=[0, -1])
    (model,) = load_benchmarked_models("bench", [key], ["reward", "turns"], str(art_path))
    assert key.step_indices == [0, -1]  # the caller's key is left as it was
    assert [step.index for step in model.steps] == [0, 2]
    assert str(model.model_key) == "trained val 0-2"
    first, last = model.steps
    assert first.metrics["reward"] == pytest.approx(0.25)
    assert last.metrics["turns"] == pytest.approx(2.25)
    assert first.metrics["reward_std_dev"] == pytest.approx(0.1)  # population std of the pair
    history = ModelStore(art_path, "bench", "trained").read_history()
    last_of_step_0 = [row["recorded_at"] for row in history if row["step"] == 0][-1]
    assert first.recorded_at == datetime.fromisoformat(last_of_step_0)

    missing = BenchmarkedModelKey("trained", "val", [7])
    with pytest.raises(FileNotFoundError, match="step 7"):
        load_benchmarked_models("bench", [missing], api_path=str(art_path))
    groups = ModelStore(art_path, "bench", "trained").read_trajectories("val", 1)
    assert calculate_step_std_dev(groups) == pytest.approx(0.1)


def test_comparison_table_and_line_graphs(art_path: Path) -> None:
    keys = [BenchmarkedModelKey("trained", "val"), BenchmarkedModelKey("prompted", "val")]
    table = generate_comparison_table("bench", keys, ["reward", "speed"], str(art_path))
    assert table.column_names == ["Model", "Split", "Step", "reward", "speed"]
    rows = table.to_pylist()
    assert [(r["Model"], r["Step"]) for r in rows] == [
        ("trained", "0000"),
        ("trained", "0001"),
        ("trained", "0002"),
        ("prompted", "0000"),
    ]
    assert float(rows[1]["reward"]) == pytest.approx(0.55)
    assert rows[1]["speed"] == "N/A"

    paths = generate_line_graphs(
        "bench", keys[:1], keys[1:], ["reward", "turns"], api_path=str(art_path)
    )
    assert [Path(p).parent for p in paths] == [art_path / "bench" / "benchmarks"] * 2
    assert all(
        p.endswith(f"_{m}_line_graph.png") for p, m in zip(paths, ["reward", "turns"], strict=True)
    )
    assert all(_png_size(Path(p))[0] > 0 for p in paths)
    by_time = generate_line_graphs(
        "bench", keys[:1], [], x_axis_metric="time", api_path=str(art_path)
    )
    assert len(by_time) == 1
    with pytest.raises(ConfigError, match="x_axis_metric"):
        generate_line_graphs("bench", keys, [], x_axis_metric="tokens", api_path=str(art_path))  # type: ignore[arg-type]


def test_display_image_grid_needs_ipython() -> None:
    from art.analysis.benchmarked_models import image_grid_html

    page = image_grid_html(["a.png", "b'.png"], images_per_row=3)
    assert "repeat(3, 1fr)" in page
    assert page.count("<img ") == 2
    assert "b&#x27;.png" in page
    try:
        import IPython  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install ipython"):
            display_image_grid(["a.png"])
    else:
        display_image_grid(["a.png"])


# --- rollouts, W&B, S3 -----------------------------------------------------------------


async def test_benchmark_rollout_averages_the_rewards(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[str, int, bool]] = []

    async def rollout(model: str, index: int, training: bool) -> art.Trajectory:
        seen.append((model, index, training))
        await asyncio.sleep(0)
        return tool_trajectory(float(index))

    assert await benchmark_rollout("agent", 4, rollout) == pytest.approx(1.5)
    assert sorted(seen) == [("agent", i, False) for i in range(4)]
    assert "Average reward for agent: 1.5" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="num_rollouts"):
        await benchmark_rollout("agent", 0, rollout)


LOG_CONSTANTS = """
import asyncio, art
from art.utils.benchmarking.log_constant_metrics_wandb import log_constant_metrics_wandb
model = art.Model(name="gpt-baseline", project="bench")
asyncio.run(log_constant_metrics_wandb(
    model, 2, {"val": {"reward": 0.6}, "train": {"reward": 0.5}}, logged_run_name=NAME))
"""


@pytest.mark.parametrize("name", [None, "prompted"])
def test_constant_metrics_reach_every_step_of_a_wandb_run(tmp_path: Path, name: str | None) -> None:
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_API_KEY": ""}
    done = run_python(LOG_CONSTANTS.replace("NAME", repr(name)), env)
    assert done.returncode == 0, done.stderr
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    run = read_wandb_run(run_file)
    assert (run.project, run.name) == ("bench", name or "gpt-baseline")
    assert [(r["_step"], r["val/reward"], r["train/reward"]) for r in run.history] == [
        (0, 0.6, 0.5),
        (1, 0.6, 0.5),
        (2, 0.6, 0.5),
    ]


async def test_log_constant_metrics_refuses_what_it_cannot_log() -> None:
    from art.utils.benchmarking.log_constant_metrics_wandb import log_constant_metrics_wandb

    model = art.Model(name="m", project="p")
    with pytest.raises(ConfigError, match="num_steps"):
        await log_constant_metrics_wandb(model, -1, {"val": {"reward": 1.0}})
    with pytest.raises(ConfigError, match="split_metrics"):
        await log_constant_metrics_wandb(model, 3, {"val": {}})


async def test_pull_model_trajectories_fetches_the_logs_but_not_the_checkpoints(
    art_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: str
) -> None:
    from art.utils.benchmarking.pull_model_trajectories import pull_model_trajectories
    from art.utils.s3 import push_model_to_s3

    checkpoint = ModelStore(art_path, "bench", "trained").checkpoint_dir(2)
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_config.json").write_text(json.dumps({"r": 8}))
    await push_model_to_s3("trained", "bench", s3_bucket=s3_bucket, art_path=str(art_path))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # ART's default art path: ./.art outside a git repository
    model = art.Model(name="trained", project="bench")
    with pytest.raises(ConfigError, match="BACKUP_BUCKET"):
        await pull_model_trajectories(model)
    monkeypatch.setenv("BACKUP_BUCKET", s3_bucket)
    await pull_model_trajectories(model)

    pulled = await load_trajectories("bench", art_path=elsewhere / ".art")
    original = await load_trajectories("bench", models=["trained"], art_path=art_path)
    assert (
        pulled.drop_columns(["group_number"]).to_pylist()
        == original.drop_columns(["group_number"]).to_pylist()
    )
    assert not (elsewhere / ".art" / "bench" / "models" / "trained" / "checkpoints").exists()
