"""AutoRL: input generation against real endpoints on 127.0.0.1, and `art autorl` end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ScriptedChat

import art
from art.autorl import GeneratedInputs, InputGenerationError, generate_inputs, normalize

TASK = "Answer customer questions about our shop's return policy, politely and correctly."
ROOT = Path(__file__).resolve().parents[2]


def batch(*texts: str) -> str:
    return json.dumps({"inputs": list(texts)})


def scripted(chat: ScriptedChat) -> dict[str, str]:
    return {"api_base": chat.url, "api_key": "k"}


# --- against a scripted generator -----------------------------------------------------------


def test_inputs_are_compared_by_normalized_text() -> None:
    assert normalize("  Can I return   SHOES?! ") == normalize("can i return shoes")
    assert normalize("Return shoes") != normalize("Return a shirt")


async def test_duplicates_are_dropped_and_exactly_num_inputs_are_split_off(
    scripted_chat: ScriptedChat,
) -> None:
    scripted_chat.answers = [
        batch("Can I return shoes?", "can I return SHOES", "How long do refunds take?", " "),
        batch("How long do refunds take??", "Do you refund shipping?", "Can I return a gift?"),
        batch("What if the item is broken?", "Is there a restocking fee?"),
        json.dumps({"system_prompt": "You are the shop's polite returns assistant."}),
    ]
    inputs = await generate_inputs(
        TASK,
        4,
        num_val=1,
        generator_model="openai/scripted",
        extra_litellm_params=scripted(scripted_chat),
    )
    assert len(inputs.train) == 4
    assert len(inputs.val) == 1
    everything = inputs.train + inputs.val
    assert len({normalize(text) for text in everything}) == 5
    assert set(everything) == {
        "Can I return shoes?",
        "How long do refunds take?",
        "Do you refund shipping?",
        "Can I return a gift?",
        "What if the item is broken?",
    }
    assert inputs.system_prompt == "You are the shop's polite returns assistant."
    # The generator is asked with a JSON schema, and told what it already wrote.
    first, second = scripted_chat.requests[:2]
    assert first["response_format"]["type"] == "json_schema"
    assert (
        first["response_format"]["json_schema"]["schema"]["properties"]["inputs"]["minItems"] == 4
    )
    assert "Can I return shoes?" in second["messages"][-1]["content"]
    assert GeneratedInputs.from_json(inputs.to_json()) == inputs


async def test_a_given_system_prompt_is_kept(scripted_chat: ScriptedChat) -> None:
    scripted_chat.answers = [batch("Can I return shoes?", "Do you refund shipping?")]
    inputs = await generate_inputs(
        TASK,
        2,
        generator_model="openai/scripted",
        extra_litellm_params=scripted(scripted_chat),
        system_prompt="Be brief.",
    )
    assert inputs.system_prompt == "Be brief."
    assert inputs.val == []
    assert len(scripted_chat.requests) == 1


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("these are not JSON", "not JSON"),
        (json.dumps(["a list", "not an object"]), 'not {"inputs"'),
        (json.dumps({"inputs": [1, 2]}), "other than strings"),
        (batch("", "  "), "no new input"),
    ],
)
async def test_unusable_generator_output_fails_after_its_retries_saying_why(
    scripted_chat: ScriptedChat, answer: str, problem: str
) -> None:
    scripted_chat.answers = [answer] * 3
    with pytest.raises(InputGenerationError, match=problem) as caught:
        await generate_inputs(
            TASK,
            2,
            generator_model="openai/scripted",
            extra_litellm_params=scripted(scripted_chat),
            max_batches=3,
        )
    assert "0 of the 2" in str(caught.value)
    assert len(scripted_chat.requests) == 3


async def test_bad_arguments_are_named() -> None:
    with pytest.raises(art.ConfigError, match="task_description"):
        await generate_inputs(" ", 2, generator_model="openai/x")
    with pytest.raises(art.ConfigError, match="num"):
        await generate_inputs(TASK, 0, generator_model="openai/x")
    with pytest.raises(art.ConfigError, match="response_format"):
        await generate_inputs(
            TASK, 2, generator_model="openai/x", extra_litellm_params={"response_format": {}}
        )


def test_the_report_escapes_generated_text_and_plots_each_evaluated_step(tmp_path: Path) -> None:
    from art.autorl import AutoRLResult, Evaluation
    from art.autorl.report import summary_table, write_html, write_plot

    hostile = "<script>alert('x')</script> & <b>"
    evaluations = [
        Evaluation(step, 0.5 + step / 10, 0.6, 0.5, 1, [
            {"input": hostile, "base": "<i>old</i>", "answer": hostile, "score": 0.7, "base_score": 0.5}
        ])
        for step in (1, 2)
    ]  # fmt: skip
    inputs = GeneratedInputs(TASK, "Be <polite>.", ["a"], [hostile])
    result = AutoRLResult(tmp_path, inputs, 0, 2, evaluations)
    page = write_html(result, tmp_path / "report.html").read_text()
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;b&gt;" in page
    assert "Be &lt;polite&gt;." in page
    assert write_plot(evaluations, tmp_path / "v.png").read_bytes().startswith(b"\x89PNG")
    table = summary_table(result).splitlines()
    assert table[-1].split() == ["2", "0.70", "0.60", "0.50", "1"]

    unjudged = {"input": "q", "base": "b", "answer": "a", "error": "not <valid> JSON"}
    evaluations.append(Evaluation(3, math.nan, math.nan, math.nan, 0, [unjudged]))
    result = AutoRLResult(tmp_path, inputs, 0, 3, evaluations)
    page = write_html(result, tmp_path / "report.html").read_text()
    assert "<b>Unjudged:</b> not &lt;valid&gt; JSON" in page
    assert summary_table(result).splitlines()[-1].split() == ["3", "-", "-", "-", "0"]
    assert write_plot(evaluations, tmp_path / "v.png").read_bytes().startswith(b"\x89PNG")


# --- the command line ------------------------------------------------------------------------


def art_command(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": str(ROOT), "ART_RULER_CACHE": "0"}
    return subprocess.run(
        [sys.executable, "-m", "art", "autorl", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_autorl_rejects_bad_arguments_by_name(tmp_path: Path) -> None:
    done = art_command(TASK, "--steps", "-1", "--path", str(tmp_path))
    assert done.returncode == 2
    assert "steps" in done.stderr
    assert "at least 0" in done.stderr


SMALL_RUN = (
    "--num-inputs", "4", "--num-val", "1", "--groups-per-step", "1",
    "--group-size", "2", "--max-tokens", "32",
)  # fmt: skip


@pytest.mark.model
@pytest.mark.timeout(1200)
def test_autorl_trains_end_to_end_writes_its_report_and_resumes(tmp_path: Path) -> None:
    # One step: on a busy 2-core CPU a step (rollouts, RULER, training, validation) takes
    # minutes, so one step and its resume are what this test can afford.
    first = art_command(TASK, "--steps", "1", "--path", str(tmp_path), *SMALL_RUN)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "step 0 -> 1" in first.stdout
    # Whatever the judge decided, the user is told whether the step had anything to learn.
    assert "of 1 judged groups had scores that differ" in first.stdout
    model_dir = tmp_path / "autorl" / "models" / "autorl"
    run_dir = model_dir / "autorl"
    # The default model wrote the inputs: distinct, none empty, and a system prompt.
    inputs = json.loads((run_dir / "inputs.json").read_text())
    assert len(inputs["train"]) == 4
    assert len(inputs["val"]) == 1
    everything = inputs["train"] + inputs["val"]
    assert all(text.strip() for text in everything)
    assert len({normalize(text) for text in everything}) == 5
    assert inputs["system_prompt"].strip()
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == ["0000", "0001"]
    history = [json.loads(line) for line in (model_dir / "history.jsonl").read_text().splitlines()]
    assert [row["step"] for row in history if "val/judged" in row] == [1]
    evaluations = json.loads((run_dir / "evaluations.json").read_text())
    assert [e["step"] for e in evaluations] == [1]
    # The default model as judge may answer the validation pair unusably (it once looped
    # inside its JSON until its token budget, twice): that input is then unjudged, with the
    # judge's error beside it and said on the console, and the run still ends well.
    [sample] = evaluations[0]["samples"]
    assert evaluations[0]["judged"] == ("score" in sample)
    assert ("error" in sample) == ("score" not in sample)
    assert ("could not score 1 of 1 validation inputs" in first.stdout) == ("error" in sample)
    assert (run_dir / "validation.png").read_bytes().startswith(b"\x89PNG")
    report = (run_dir / "report.html").read_text()
    assert "Answers before and after" in report
    assert "<script" not in report  # generated text is escaped, never markup
    assert (run_dir / "base_answers.json").exists()

    again = art_command(TASK, "--steps", "1", "--path", str(tmp_path), *SMALL_RUN)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step 1 -> 1" in again.stdout
    assert json.loads((run_dir / "inputs.json").read_text()) == inputs
    assert json.loads((run_dir / "evaluations.json").read_text()) == evaluations
    assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == ["0000", "0001"]

    other_task = art_command("Write haiku.", "--steps", "1", "--path", str(tmp_path), *SMALL_RUN)
    assert other_task.returncode == 2
    assert "task_description" in other_task.stderr
