"""Each example runs end to end, as a user would start it, on a small budget, and each of
its steps trains exactly the groups whose stored rewards differ. Whether a draw gives some
group different rewards is the draw's, not the recipe's: the 135M model at temperature 1
can earn the same in every rollout (the LangGraph example once did in CI). That a step
with differing rewards raises the rewarded completion is `tests/test_trainer.py`'s."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_trained_the_groups_told_apart
from openai.types.chat.chat_completion import Choice

from art.core.store.model_store import ModelStore

pytestmark = pytest.mark.model  # loads the default model or starts a model service

ROOT = Path(__file__).resolve().parent.parent


def run_demo(path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [
            *(sys.executable, str(ROOT / "examples" / "demo.py"), "--path", str(path)),
            *("--held-out", "8", *options),  # the full 32 add nothing to what is checked
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.timeout(1800)  # three starts of the demo, one of them training
def test_the_demo_trains_a_step_writes_its_plot_then_resumes_and_starts_over(
    tmp_path: Path,
) -> None:
    result = run_demo(tmp_path, "--steps", "1")
    assert "step 1: reward" in result.stdout
    # Each held-out line counts the answers its reward came from: the correct sum pays 0.5
    # inside other text, 1.0 alone.
    lines = [
        (r"held-out reward before training: ([\d.]+) ", "before"),
        (r"held-out reward: [\d.]+ before, ([\d.]+) after training", "held-out answers after"),
    ]
    for reward_pattern, label in lines:
        reward = re.search(reward_pattern, result.stdout)
        counts = re.search(
            label + r".*?(\d+) of 8 with the correct sum, (\d+) of them the bare number",
            result.stdout,
        )
        assert reward is not None, result.stdout
        assert counts is not None, result.stdout
        correct, bare = int(counts[1]), int(counts[2])
        assert 0 <= bare <= correct <= 8
        assert float(reward[1]) == pytest.approx((bare + 0.5 * (correct - bare)) / 8, abs=0.006)
    run = tmp_path / "art-demo" / "models" / "arithmetic"
    assert (run / "reward.png").stat().st_size > 10_000
    adapter = run / "checkpoints" / "0001" / "adapter_model.safetensors"
    assert adapter.is_file()
    # A step ran, training the groups its draw told apart (step 1's mean reward was
    # 0.02-0.07 in the runs RESULTS.md records; one CI run drew no group with a difference).
    assert_trained_the_groups_told_apart(run)
    trained = adapter.read_bytes()

    # Started again, the run resumes: step 1 is kept and not trained again.
    result = run_demo(tmp_path, "--steps", "1")
    assert "resuming the run" in result.stdout
    assert "at step 1" in result.stdout
    assert "step 1: reward" not in result.stdout
    assert adapter.read_bytes() == trained

    # --fresh deletes the run and starts over at step 0 (no step asked for: training a
    # step again would show nothing the first start did not).
    result = run_demo(tmp_path, "--steps", "0", "--fresh")
    assert "removing the previous run" in result.stdout
    assert "resuming" not in result.stdout
    assert not adapter.parent.exists()
    rows = [line for line in (run / "history.jsonl").read_text().splitlines() if "train/" in line]
    assert rows == []  # the old run's history went with it


@pytest.mark.sampling
def test_the_zero_label_example_trains_a_step_with_ruler_as_the_only_reward(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "ruler_zero_label.py"),
            "--steps",
            "1",
            "--groups",
            "1",  # one judge call: benchmarks/ruler_learns.py --quick judges and trains too
            "--path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=os.environ | {"ART_RULER_CACHE": "0"},  # leave the user cache alone
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mean RULER score" in result.stdout
    assert "RULER explanation: " in result.stdout
    run = tmp_path / "art-ruler" / "models" / "zero-label"
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
    assert_trained_the_groups_told_apart(run)


# Liveness only, as the subprocess's own limit: scenario generation, rollouts, RULER and a
# step of the default model, on 2 cores shared with the rest of the suite.
@pytest.mark.timeout(1200)
def test_the_mcp_rl_example_generates_scenarios_rolls_out_judges_and_trains(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "mcp_rl.py"),
            *("--steps", "1", "--groups", "1", "--group-size", "2", "--val", "1"),
            *("--path", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tools: add_note, list_notes, search_notes, read_note, delete_note" in result.stdout
    assert "held-out:" in result.stdout
    run = tmp_path / "art-mcp" / "models" / "notes-agent"
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
    assert_trained_the_groups_told_apart(run)


@pytest.mark.sampling
def test_sft_then_rl_teaches_the_format_then_trains_from_that_checkpoint(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "sft_then_rl.py"),
            "--rl-steps",
            "1",
            "--path",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rates = {
        when: float(rate)
        for when, rate in re.findall(
            r"^(.*?)(?: \(step \d+\))?: format rate ([\d.]+)", result.stdout, re.M
        )
    }
    assert rates["before SFT"] == 0.0, result.stdout
    assert rates["after SFT"] >= 0.8, result.stdout
    assert "after RL (step 2): format rate" in result.stdout
    run = tmp_path / "art-sft" / "models" / "format"
    assert (run / "checkpoints" / "0002" / "adapter_model.safetensors").is_file()
    assert_trained_the_groups_told_apart(run)


def test_the_langgraph_example_records_the_graphs_calls_and_trains_what_they_earned(
    tmp_path: Path,
) -> None:
    """Not whether the draw taught anything: at temperature 1 the 135M model sometimes
    earns 0 in every rollout of both groups (once in CI, with 8 rollouts a group), which
    teaches GRPO nothing. What the recipe guarantees is checked instead: every LLM call
    of the graph is in its rollout's trajectory with the sampled tokens, and the step
    trained exactly the groups whose rewards differ. That a LangGraph trajectory's sampled
    tokens all train is `tests/integrations/test_langgraph.py`'s."""
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "langgraph_agent.py"),
            *("--steps", "1", "--path", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 1: reward" in result.stdout
    run = tmp_path / "langgraph" / "models" / "capitals-agent"
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
    store = ModelStore(tmp_path, "langgraph", "capitals-agent")
    groups = store.read_trajectories("train", 0)
    assert [len(group.trajectories) for group in groups] == [4, 4]  # the example's defaults
    for trajectory in (t for group in groups for t in group.trajectories):
        messages = trajectory.messages()
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        assert messages[-1]["role"] == "assistant"  # the graph ends on the model's turn
        for i, message in enumerate(messages[2:], start=2):
            if message["role"] != "assistant":
                continue
            turn = trajectory.messages_and_choices[i]  # a call the graph made, as sampled
            assert isinstance(turn, Choice), message
            assert turn.logprobs, message
            for call in message.get("tool_calls") or []:  # the forced lookup, and its result
                assert call["function"]["name"] == "lookup_capital"
                assert messages[i + 1]["role"] == "tool"
        assert trajectory.reward in (0.0, 0.5, 1.0)
    assert_trained_the_groups_told_apart(run)
