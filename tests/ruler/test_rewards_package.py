"""ART's `art.rewards` package: `art.rewards.ruler` the module whose `acompletion` and
`ModelResponse` RULER calls through, and the judge's cost in the model's history."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from conftest import ScriptedChat
from helpers import JsonHandler, sampled_choice, serving

import art
from art.core.store.model_store import ModelStore

SYSTEM = {"role": "system", "content": "Reply with the sum only."}
QUESTION = {"role": "user", "content": "What is 2 + 2?"}


def group_of(*answers: str) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        art.Trajectory(messages_and_choices=[SYSTEM, QUESTION, sampled_choice(text)], reward=0.0)
        for text in answers
    )


def verdict(*scores: float) -> str:
    entries = [
        {"trajectory_id": str(i), "explanation": f"judged {i}", "score": s}
        for i, s in enumerate(scores, start=1)
    ]
    return json.dumps({"scores": entries})


def model_response(content: str) -> Any:
    from litellm.types.utils import ModelResponse

    return ModelResponse(
        id="chatcmpl-fake",
        model="judge",
        choices=[
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    )


def ruler_module() -> Any:
    import art.rewards  # noqa: F401  (loads the submodule)

    return sys.modules["art.rewards.ruler"]


def test_the_package_resolves_ruler_as_art_does_without_importing_litellm() -> None:
    script = """
import sys
import art.rewards
from art.rewards import DEFAULT_RUBRIC, TrajectoryScore, ruler, ruler_score_group
from art.ruler import ruler as canonical
assert art.rewards.ruler is ruler is canonical, "the attribute is the function, as in ART"
assert "litellm" not in sys.modules, "LiteLLM loads on first use"
module = sys.modules["art.rewards.ruler"]
assert module.ruler is ruler and module.ruler_score_group is ruler_score_group
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"

    import litellm

    from art.rewards.ruler import (
        ChatCompletionMessageParam,
        ModelResponse,
        Response,
        acompletion,
    )

    assert acompletion is litellm.acompletion
    assert ModelResponse is litellm.types.utils.ModelResponse
    assert ChatCompletionMessageParam is not None
    assert Response.model_validate({"scores": []}).scores == []


async def test_patching_acompletion_there_changes_what_ruler_calls() -> None:
    from art.rewards import ruler, ruler_score_group

    calls: list[dict[str, Any]] = []

    async def fake_acompletion(**request: Any) -> Any:
        calls.append(request)
        return model_response(verdict(0.25, 1.0))

    with mock.patch("art.rewards.ruler.acompletion", fake_acompletion):
        scores = await ruler(
            [t.messages() for t in group_of("5", "4")], "openai/any-judge", cache=False
        )
    assert [s.score for s in scores] == [0.25, 1.0]
    assert calls[0]["model"] == "openai/any-judge"
    assert calls[0]["caching"] is False

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ruler_module(), "acompletion", fake_acompletion)
        judged = await ruler_score_group(group_of("5", "4"), "openai/any-judge", cache=False)
    assert judged is not None
    assert [t.reward for t in judged] == [0.25, 1.0]
    assert len(calls) == 2
    import litellm

    assert ruler_module().acompletion is litellm.acompletion, "restored after the patch"


async def test_patching_model_response_changes_what_ruler_accepts() -> None:
    from art.rewards import ruler

    async def fake_acompletion(**request: Any) -> Any:
        return model_response(verdict(1.0, 0.0))

    class OtherResponse:
        pass

    with (
        mock.patch("art.rewards.ruler.acompletion", fake_acompletion),
        mock.patch("art.rewards.ruler.ModelResponse", OtherResponse),
        pytest.raises(art.JudgeError, match="not a OtherResponse"),
    ):
        await ruler([t.messages() for t in group_of("5", "4")], "openai/any-judge", cache=False)


async def test_the_judges_cost_reaches_history_as_costs_train_judge_ruler(
    scripted_chat: ScriptedChat, tmp_path: Path
) -> None:
    from art.local import LocalBackend
    from art.rewards import ruler_score_group

    backend = LocalBackend(path=str(tmp_path / ".art"))
    model = art.Model(name="agent", project="judged")
    await model.register(backend)
    params = {"api_base": scripted_chat.url, "api_key": "k"}
    scripted_chat.answers += [verdict(1.0, 0.0)] * 3
    token = model.activate_metrics_context("train")
    try:
        # 100 prompt and 20 completion tokens at gpt-4o-mini's list price (LiteLLM's list).
        priced = await ruler_score_group(
            group_of("4", "5"), "openai/gpt-4o-mini", params, cache=False
        )
        # A judge no table prices (a model served on our own endpoint) records no cost.
        unpriced = await ruler_score_group(
            group_of("4", "5"), "openai/our-judge", params, cache=False
        )
    finally:
        token.var.reset(token)
    assert priced is not None
    assert unpriced is not None
    await model.log([priced, unpriced], split="train")
    with model.metrics_builder("eval").activate_context():
        evaluated = await ruler_score_group(
            group_of("4", "5"), "openai/gpt-4o-mini", params, cache=False
        )
    assert evaluated is not None
    await model.log([evaluated], split="val")

    one_call = (100 * 0.15 + 20 * 0.60) / 1e6
    train, val = ModelStore(tmp_path / ".art", "judged", "agent").read_history()
    assert train["costs/train/judge/ruler"] == pytest.approx(one_call)
    assert train["costs/all"] == pytest.approx(one_call)
    assert train["train/ruler_judge_cost"] == pytest.approx(one_call / 2), "mean per trajectory"
    assert val["costs/eval/judge/ruler"] == pytest.approx(one_call)
    assert val["costs/cum/all"] == pytest.approx(2 * one_call)
    assert "costs/train/judge/ruler" not in val
    await backend.close()


@pytest.fixture
def judge_stating_its_cost() -> Iterator[str]:
    class Handler(JsonHandler):
        def do_POST(self) -> None:
            request = self.read_json()
            count = request["messages"][1]["content"].count("<trajectory id=")
            self.send_json(
                {
                    "id": "chatcmpl-costed",
                    "object": "chat.completion",
                    "created": 0,
                    "model": request["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {
                                "role": "assistant",
                                "content": verdict(*[0.5] * count),
                            },
                        }
                    ],
                    "usage": {
                        "prompt_tokens": 100,
                        "completion_tokens": 20,
                        "total_tokens": 120,
                        "cost": 0.003,
                    },
                }
            )

    with serving(Handler) as url:
        yield url


async def test_a_cost_the_judge_states_is_recorded_even_for_an_unpriced_model(
    judge_stating_its_cost: str,
) -> None:
    from art.metrics import MetricsBuilder
    from art.rewards import ruler_score_group

    builder = MetricsBuilder("train")
    params = {"api_base": judge_stating_its_cost, "api_key": "k"}
    with builder.activate_context():
        judged = await ruler_score_group(
            group_of("4", "5"), "openai/our-judge", params, cache=False
        )
    assert judged is not None
    assert sum(t.metrics["ruler_judge_cost"] for t in judged) == pytest.approx(0.003)
    assert (await builder.flush())["costs/train/judge/ruler"] == pytest.approx(0.003)
