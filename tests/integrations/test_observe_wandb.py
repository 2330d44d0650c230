"""W&B: every history row in the model's run, at its step, resumed by the next process.

Each case runs in a fresh interpreter (W&B keeps process-wide state and exit hooks) with
the real wandb library, offline: the run file it writes is read back as `wandb sync`
would read it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from observe_helpers import closed_port_url, read_wandb_run, run_python, wandb_records

import art

# Logs the `train` split of the given steps for model obs/agent, as training does: the
# step's trajectory groups, with the trainer's numbers as extra metrics.
LOG_STEPS = """
import asyncio, sys
import art
from art.local import LocalBackend

async def main(path, steps, report):
    model = art.Model(name="agent", project="obs", report_metrics=report)
    await model.register(LocalBackend(path=path))
    for step in steps:
        group = art.TrajectoryGroup(
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": f"q{step}"},
                                      {"role": "assistant", "content": f"a{i}"}],
                reward=0.25 * i + step,
                metrics={"turns": i + 1},
            )
            for i in range(3)
        )
        await model.log([group], split="train", step=step, metrics={"loss": 1.5 - step})
    print("modules:", sorted(m for m in sys.modules if m.split(".")[0] in ("wandb", "weave", "langfuse")))

asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else PATH, STEPS, REPORT))
"""


def _script(path: Path, steps: list[int], report: list[str] | None) -> str:
    return LOG_STEPS.replace("sys.argv[1] if len(sys.argv) > 1 else PATH", repr(str(path))).replace(
        "STEPS, REPORT", f"{steps!r}, {report!r}"
    )


def _history(path: Path) -> list[dict[str, object]]:
    history = path / "obs" / "models" / "agent" / "history.jsonl"
    return [json.loads(line) for line in history.read_text().splitlines()]


def _offline_runs(wandb_dir: Path) -> list[Path]:
    return sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))


def test_offline_run_gets_every_history_row_at_its_step_and_the_next_process_resumes_it(
    tmp_path: Path,
) -> None:
    art_path, wandb_dir = tmp_path / ".art", tmp_path / "wb"
    wandb_dir.mkdir()
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_API_KEY": ""}

    first = run_python(_script(art_path, [0, 1], ["wandb"]), env)
    assert first.returncode == 0, first.stderr
    second = run_python(_script(art_path, [2], ["wandb"]), env)
    assert second.returncode == 0, second.stderr

    runs = [read_wandb_run(file) for file in _offline_runs(wandb_dir)]
    assert len(runs) == 2  # one per process ...
    assert {(run.run_id, run.project, run.name) for run in runs} == {("agent", "obs", "agent")}
    # ... and the same run: the second continues it (wandb sync merges them by id).
    logged = [row for run in runs for row in run.history]
    history = _history(art_path)
    assert [row["step"] for row in history] == [0, 1, 2]
    assert [row["training_step"] for row in logged] == [0, 1, 2]
    for row, sent in zip(history, logged, strict=True):
        metrics = {k: v for k, v in row.items() if k not in ("step", "recorded_at")}
        # ART 0.5.23's names: the batch's counts under data/, the rest under the split
        assert {
            "train/reward",
            "train/loss",
            "train/turns",
            "train/exception_rate",
            "data/step_num_trajectories",
            "data/step_num_groups_trainable",
        } <= set(metrics)
        assert metrics["training_step"] == row["step"]
        # What ART sends (its canonical keys and the user's own metrics), W&B's own
        # bookkeeping (`_step`, `_runtime`, ...) and the step it belongs to, against which
        # W&B plots every metric; the batch's counts stay in history.jsonl, as in ART.
        assert {k for k in sent if not k.startswith("_")} == {
            "training_step",
            "train/reward",
            "train/reward_std_dev",
            "train/exception_rate",
            "train/turns",
            "train/loss",
        }
        for key in set(sent) & set(metrics):
            assert sent[key] == pytest.approx(metrics[key]), key
    assert logged[1]["train/reward"] == pytest.approx(1.25)  # step 1: rewards 1, 1.25, 1.5
    assert logged[2]["train/loss"] == pytest.approx(-0.5)  # logged directly: under its split
    assert "data/step_num_trajectories" not in logged[2]
    # ART's x-axes, as ART defines them: training_step for the splits' and sections'
    # metrics, sft/gradient_step for an SFT batch's.
    axes = {
        record.metric.glob_name or record.metric.name: record.metric.step_metric
        for file in _offline_runs(wandb_dir)
        for record in wandb_records(file)
        if record.WhichOneof("record_type") == "metric"
    }
    for glob in ("train/*", "val/*", "loss/*", "data/*", "time/*", "costs/*"):
        assert axes[glob] == "training_step", glob
    assert axes["sft/*"] == "sft/gradient_step"
    assert "*" not in axes  # one catch-all would give sft/ the wrong axis


def test_a_runs_w_and_b_run_is_named_by_its_run_name_as_in_art(tmp_path: Path) -> None:
    art_path, wandb_dir = tmp_path / ".art", tmp_path / "wb"
    wandb_dir.mkdir()
    script = f"""
import asyncio
import art

async def main():
    model = art.TrainableModel(
        name="agent", run_name="agent-run-2", project="obs", base_path={str(art_path)!r},
        base_model="HuggingFaceTB/SmolLM2-135M-Instruct", report_metrics=["wandb"],
    )
    await model.log(metrics={{"loss": 1.0}}, split="train", step=0)

asyncio.run(main())
"""
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(wandb_dir), "WANDB_API_KEY": ""}
    result = run_python(script, env)
    assert result.returncode == 0, result.stderr
    runs = [read_wandb_run(file) for file in _offline_runs(wandb_dir)]
    assert {(run.run_id, run.name) for run in runs} == {("agent-run-2", "agent-run-2")}
    assert (art_path / "obs" / "models" / "agent-run-2" / "history.jsonl").is_file()
    assert not (art_path / "obs" / "models" / "agent").exists()


def test_online_without_a_key_warns_once_and_the_metrics_stay_in_history(tmp_path: Path) -> None:
    art_path, home = tmp_path / ".art", tmp_path / "home"
    home.mkdir()
    code = _script(art_path, [0, 1], ["wandb"]) + (
        "\nfrom art.integrations.observability import finish_wandb_runs\nfinish_wandb_runs(60)\n"
    )
    result = run_python(
        code,
        {
            "WANDB_MODE": "",  # online
            "WANDB_API_KEY": "",
            "HOME": str(home),  # no ~/.netrc with a key
            "WANDB_CONFIG_DIR": str(home / ".config"),
            "WANDB_BASE_URL": closed_port_url(),
            "WANDB_DIR": str(tmp_path),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("W&B: no API key") == 1, result.stderr
    assert [row["step"] for row in _history(art_path)] == [0, 1]
    assert not list(tmp_path.glob("wandb/*run-*"))


def test_off_by_default_and_with_report_metrics_empty_nothing_is_imported(tmp_path: Path) -> None:
    for report, key in ((None, ""), ([], "x" * 40)):
        result = run_python(
            _script(tmp_path / ".art", [0], report),
            {"WANDB_MODE": "offline", "WANDB_API_KEY": key, "WANDB_DIR": str(tmp_path)},
        )
        assert result.returncode == 0, result.stderr
        assert "modules: []" in result.stdout, (report, result.stdout)
    assert not list(tmp_path.glob("wandb/*run-*"))


def test_a_key_alone_turns_w_and_b_on_as_in_art(tmp_path: Path) -> None:
    result = run_python(
        _script(tmp_path / ".art", [0], None),
        {"WANDB_MODE": "offline", "WANDB_API_KEY": "x" * 40, "WANDB_DIR": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    (run,) = [read_wandb_run(file) for file in _offline_runs(tmp_path)]
    assert [row["training_step"] for row in run.history] == [0]


def test_report_metrics_names_only_services_it_reports_to() -> None:
    with pytest.raises(art.ConfigError, match=r"report_metrics.*'trackio'"):
        art.Model(name="m", project="p", report_metrics=["trackio"])
    assert art.Model(name="m", project="p", report_metrics=["wandb"]).report_metrics == ["wandb"]
    trainable = art.TrainableModel(name="m", project="p", base_model="b", report_metrics=[])
    assert trainable.report_metrics == []
    with pytest.raises(art.ConfigError, match="report_metrics"):
        trainable.report_metrics = ["tensorboard"]


def test_an_unreachable_server_warns_once_and_the_metrics_stay_in_history(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    result = run_python(
        _script(tmp_path / ".art", [0, 1], ["wandb"]),
        {
            "WANDB_MODE": "",  # online
            "WANDB_API_KEY": "x" * 40,
            "HOME": str(home),
            "WANDB_BASE_URL": closed_port_url(),
            "WANDB_INIT_TIMEOUT": "5",  # W&B's own knob, honoured: the test need not wait 30 s
            "WANDB_DIR": str(tmp_path),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("W&B run obs/agent could not start") == 1, result.stderr
    assert [row["step"] for row in _history(tmp_path / ".art")] == [0, 1]


# Two real GRPO steps of the embedded default model (in process, a few tokens each).
TRAIN_TWO_STEPS = """
import asyncio
import art
from art.local import LocalBackend

async def rollout(model, i):
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "Say a number."}])
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=6, seed=i
    )
    trajectory.messages_and_choices.append(completion.choices[0])
    trajectory.reward = float(i)
    return trajectory

async def main():
    model = art.TrainableModel(
        name="trained", project="obs", base_model="HuggingFaceTB/SmolLM2-135M-Instruct",
        report_metrics=["wandb"],
    )
    await model.register(LocalBackend(path=PATH, in_process=True))
    for _ in range(2):
        groups = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(model, i) for i in range(2))], pbar_desc=None
        )
        await model.train(groups)

asyncio.run(main())
"""


# Solo: in three CI runs of 2026-11-26 (pytest-xdist, two workers) the script's W&B
# service was told to tear down 2 s into wandb.init (wandb-core's log: InformTeardown on
# the script's own connection), so art dropped the run's rows as it should; alone, with a
# load beside it, with CI's environment, it never happened. Cause not found: the
# assertion below carries W&B's logs and the script's WANDB_* environment.
@pytest.mark.model
@pytest.mark.solo
def test_two_real_training_steps_reach_the_offline_run_at_their_steps(tmp_path: Path) -> None:
    art_path = tmp_path / ".art"
    result = run_python(
        TRAIN_TWO_STEPS.replace("PATH", repr(str(art_path))),
        {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_API_KEY": ""},
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    (run,) = [read_wandb_run(file) for file in _offline_runs(tmp_path)]
    assert (run.run_id, run.project) == ("trained", "obs")
    history = [
        json.loads(line)
        for line in (art_path / "obs/models/trained/history.jsonl").read_text().splitlines()
    ]
    assert [row["step"] for row in history] == [0, 1]
    logs = "".join(
        f"\n--- {log.name}\n{log.read_text()[-3000:]}"
        for log in sorted(tmp_path.glob("wandb/*/logs/debug*.log"))
    )
    seen = {k: v for k, v in os.environ.items() if k.startswith(("WANDB", "_WANDB", "TMP"))}
    assert [row["training_step"] for row in run.history] == [0, 1], (
        f"{result.stderr[-3000:]}{logs}\n--- environment the script inherited: {seen}"
    )
    for row, sent in zip(history, run.history, strict=True):
        assert {"loss/train", "loss/grad_norm", "train/reward", "time/step_backend_train_s"} <= set(
            row
        )
        # The trainer's metrics all reach W&B (ART logs them directly), the batch's
        # counts only in history.jsonl (ART's W&B rule).
        assert {"loss/train", "loss/grad_norm", "train/reward"} <= set(sent)
        assert "data/step_num_trajectories" not in sent
        for key in set(sent) & set(row):
            assert sent[key] == pytest.approx(row[key]), key
