"""ART 0.5.23's `limit_mean_steps_off_policy`: a group whose sampled tokens are, on
average (token-weighted), more steps old than the limit is dropped as stale."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

import art
from art.local import LocalBackend
from art.pipeline._staleness import is_stale, mean_steps_off_policy
from art.pipeline_trainer import PipelineTrainer

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEDICATED = art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])


def sampled(version: int, tokens: int) -> Choice:
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "x"},
            "policy_version": version,
            "token_ids": list(range(tokens)),
        }
    )


def trajectory(*turns: tuple[int, int], reward: float = 0.0) -> art.Trajectory:
    items: list[Any] = [{"role": "user", "content": "q"}, *(sampled(*t) for t in turns)]
    return art.Trajectory(messages_and_choices=items, reward=reward)


def test_the_mean_is_weighted_by_the_tokens_each_turn_sampled() -> None:
    # At step 4: 30 tokens of step 4 (age 0) and 10 of step 0 (age 4) -> mean 1.0;
    # the other trajectory: 20 tokens of step 2 (age 2).
    group = art.TrajectoryGroup([trajectory((4, 30), (0, 10)), trajectory((2, 20), reward=1.0)])
    assert mean_steps_off_policy(group, 4) == pytest.approx((10 * 4 + 20 * 2) / 60)
    # The oldest turn is 4 steps old: within max_steps_off_policy=4, but its mean is past 1.
    assert not is_stale(group, 4, 4)
    assert is_stale(group, 4, 4, limit_mean_steps_off_policy=1.0)
    assert not is_stale(group, 4, 4, limit_mean_steps_off_policy=1.5)
    assert not is_stale(group, 4, None, limit_mean_steps_off_policy=None)
    # Plain messages are context: a trajectory with no sampled turn counts at its stamp.
    stamped = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}])
    stamped.initial_policy_version = 1
    assert mean_steps_off_policy(art.TrajectoryGroup([stamped]), 4) == 3.0
    assert mean_steps_off_policy(art.TrajectoryGroup([trajectory()]), 4) is None


def test_a_negative_limit_is_refused(tmp_path: Path) -> None:
    model = art.TrainableModel(
        name="mean", project="pipeline", base_model=BASE, _internal_config=DEDICATED
    )
    with pytest.raises(art.ConfigError) as raised:
        PipelineTrainer(
            model, LocalBackend(path=tmp_path), rollout, [], None, limit_mean_steps_off_policy=-1
        )
    assert raised.value.field == "limit_mean_steps_off_policy"


async def rollout(model: art.TrainableModel, scenario: dict[str, Any], config: None) -> Any:
    """Two rollouts, rewards 0 and 1; a `slow` scenario's environment takes until the policy
    has moved a step past the one that sampled it, so its tokens are a step old or more."""

    async def sample() -> Any:
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=[{"role": "user", "content": scenario["q"]}],
            max_tokens=4,
        )
        return completion.choices[0]

    choices = await asyncio.gather(sample(), sample())
    if scenario.get("slow"):
        sampled_at = min(choice.policy_version for choice in choices)
        while await model.get_step() <= sampled_at:  # noqa: ASYNC110  (the step is in files)
            await asyncio.sleep(0.05)
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": scenario["q"]}, choice],
            reward=float(i),
        )
        for i, choice in enumerate(choices)
    )


@pytest.mark.model
async def test_a_run_drops_groups_older_on_average_than_the_limit(
    dedicated_backend: LocalBackend, unique_project: str
) -> None:
    """No max_steps_off_policy: only the mean bound can drop the slow group."""
    model = art.TrainableModel(
        name="mean", project=unique_project, base_model=BASE, _internal_config=DEDICATED
    )
    await model.register(dedicated_backend)
    scenarios = [{"q": "What is 0 + 0?", "slow": True}, *({"q": f"{i} + 1?"} for i in range(3))]
    trainer = PipelineTrainer(
        model,
        dedicated_backend,
        rollout,
        scenarios,
        None,
        pipeline=art.PipelineRuntimeConfig(
            num_rollout_workers=2, min_batch_size=1, max_batch_size=1
        ),
        max_steps_off_policy=None,
        limit_mean_steps_off_policy=0.5,
        learning_rate=1e-4,
        eval_at_start=False,
    )
    await trainer.train()

    assert trainer.groups_dropped_stale >= 1  # the slow group, at least
    rows = [r for r in history(dedicated_backend, model) if "train/staleness_max" in r]
    assert rows  # the first group trained at once, at age 0
    for row in rows:
        assert row["offpolicy/token_weighted_policy_age_steps"] <= 0.5
        assert row["train/staleness_max"] <= 0.5  # one turn each: its mean is its age


def history(backend: LocalBackend, model: art.TrainableModel) -> list[dict[str, Any]]:
    path = Path(backend.path) / model.project / "models" / model.name / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]
