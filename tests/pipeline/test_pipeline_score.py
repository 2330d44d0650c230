"""The sample-efficiency figures each step logs, and ART's `score_reference_*` arguments
that set the batch a step is measured against. Hand-worked; no model is loaded."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

import art
from art.local import LocalBackend
from art.pipeline.score import ScoreReference, score_metrics
from art.pipeline_trainer import PipelineRuntimeConfig, PipelineTrainer

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


def group(*turns: tuple[int, int], size: int = 2) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": "q"}, *(sampled(*t) for t in turns)],
            reward=float(i),
        )
        for i in range(size)
    )


def test_the_batch_factor_is_the_reference_batch_over_this_one() -> None:
    # (G_ref + 300 / R_ref) / (G + 300 / R): 8 groups of 4 beside 2 groups of 4.
    factor = ScoreReference(groups_per_step=8.0).batch_factor(2.0, 4.0)
    assert factor == pytest.approx((8 + 75) / (2 + 75))
    # A reference group size of its own: 8 groups of 10 beside 2 groups of 4.
    own = ScoreReference(groups_per_step=8.0, rollouts_per_group=10.0).batch_factor(2.0, 4.0)
    assert own == pytest.approx((8 + 30) / (2 + 75))
    assert ScoreReference(groups_per_step=None).batch_factor(2.0, 4.0) == 1.0
    assert ScoreReference().batch_factor(8.0, 4.0) == pytest.approx(1.0)


def test_ages_are_weighted_by_the_tokens_each_policy_sampled() -> None:
    # At step 3: 10 tokens sampled by step 3 (age 0) and 30 by step 1 (age 2), per trajectory.
    batch = [group((3, 10), (1, 30))]
    metrics = score_metrics(batch, 3, ScoreReference())
    assert metrics["offpolicy/token_weighted_policy_age_steps"] == pytest.approx(1.5)
    assert metrics["offpolicy/token_weighted_policy_age_p95_steps"] == 2.0
    expected = 40 / (10 * math.exp(0) + 30 * math.exp(2 / 8))
    assert metrics["sample_efficiency/freshness_discount"] == pytest.approx(expected)
    assert metrics["sample_efficiency/accepted_groups_per_step"] == 1.0
    assert metrics["sample_efficiency/batch_factor"] == pytest.approx((8 + 150) / (1 + 150))


def test_the_trainer_takes_the_reference_from_its_argument_else_the_config(tmp_path: Path) -> None:
    async def rollout(model: art.TrainableModel, scenario: Any, config: None) -> Any:
        raise AssertionError("never run")

    model = art.TrainableModel(
        name="score", project="pipeline", base_model=BASE, _internal_config=DEDICATED
    )
    backend = LocalBackend(path=tmp_path)

    def reference(**kwargs: Any) -> ScoreReference:
        return PipelineTrainer(model, backend, rollout, [], None, **kwargs).score_reference

    assert reference() == ScoreReference(groups_per_step=8.0, rollouts_per_group=None)
    config = PipelineRuntimeConfig(
        score_reference_groups_per_step=3.0, score_reference_rollouts_per_group=6.0
    )
    assert reference(pipeline=config) == ScoreReference(3.0, 6.0)
    assert reference(pipeline=config, score_reference_groups_per_step=5.0) == ScoreReference(
        5.0, 6.0
    )
    with pytest.raises(art.ConfigError) as raised:
        reference(score_reference_rollouts_per_group=0.0)
    assert raised.value.field == "score_reference_rollouts_per_group"
