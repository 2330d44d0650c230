"""ART 0.5.23's `kl_penalty_step_lag`: the KL penalty's reference is the checkpoint that
many steps behind the one being trained from (the base model without a lag), and, as in
ART's PipelineTrainer, the penalty compares the sampler's logprobs with it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import art
from art.local import LocalBackend
from art.pipeline_trainer import PipelineTrainer

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEDICATED = art.dev.InternalModelConfig(trainer_gpu_ids=[], inference_gpu_ids=[])


def model(name: str, project: str = "pipeline") -> art.TrainableModel:
    return art.TrainableModel(
        name=name, project=project, base_model=BASE, _internal_config=DEDICATED
    )


async def base_rollout(model: art.TrainableModel, scenario: dict[str, Any], config: None) -> Any:
    """Two rollouts sampled by the base model (checkpoint 0) whatever the step; rewards 0, 1."""

    async def sample() -> Any:
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(0),
            messages=[{"role": "user", "content": scenario["q"]}],
            max_tokens=8,
        )
        return completion.choices[0]

    choices = await asyncio.gather(sample(), sample())
    return art.TrajectoryGroup(
        art.Trajectory(
            messages_and_choices=[{"role": "user", "content": scenario["q"]}, choice],
            reward=float(i),
        )
        for i, choice in enumerate(choices)
    )


def test_the_reference_step_lags_the_step_trained_from(tmp_path: Path) -> None:
    backend = LocalBackend(path=tmp_path)
    lagged = PipelineTrainer(
        model("kl"), backend, base_rollout, [], None, kl_penalty_coef=0.1, kl_penalty_step_lag=2
    )
    assert [lagged.kl_reference_step(step) for step in range(5)] == [0, 0, 0, 1, 2]
    unlagged = PipelineTrainer(model("kl"), backend, base_rollout, [], None, kl_penalty_coef=0.1)
    assert [unlagged.kl_reference_step(step) for step in range(5)] == [0] * 5
    # As in ART's PipelineTrainer, the penalty is taken on the sampler's logprobs.
    assert lagged.train_config.kl_penalty_source == "sample"
    # The base model needs no adapter; a later reference is its checkpoint's directory,
    # which must still be there.
    assert lagged._kl_reference(2).kl_ref_adapter_path is None
    with pytest.raises(art.ConfigError) as raised:
        lagged._kl_reference(3)
    assert raised.value.field == "kl_penalty_step_lag"
    assert "checkpoint 1" in raised.value.problem
    for kwargs in [
        {"kl_penalty_step_lag": 0, "kl_penalty_coef": 0.1},  # ART's: at least 1
        {"kl_penalty_step_lag": 1},  # no penalty to take a reference for
    ]:
        with pytest.raises(art.ConfigError) as raised:
            PipelineTrainer(model("kl"), backend, base_rollout, [], None, **kwargs)
        assert raised.value.field == "kl_penalty_step_lag"


@pytest.mark.model
async def test_the_penalty_is_taken_against_the_lagged_checkpoint(
    dedicated_backend: LocalBackend, unique_project: str
) -> None:
    """Every rollout is sampled by the base model. With lag 1, steps 0 and 1 take their
    reference from the base (step 0) too, so the sampler and the reference agree and the
    mean log-ratio is ~0; step 2's reference is checkpoint 1, which a large step moved
    away from the base, so there it is not.

    The step-2 figure is a mean over two sampled replies of 8 tokens, an estimate with a
    spread of its own: at learning rate 1e-2 it ranged 0.29-1.32 over runs (CI drew the
    0.29, under the old bar of 0.3). At 5e-2 checkpoint 1 is so far from the base that
    every reply shows it: 3.8-7.5 in bfloat16 and 2.5-5.9 with AVX2 float32 kernels (ten
    runs), against a floor of ~0.03 and ~1e-6."""
    trained = model("kl", unique_project)
    await trained.register(dedicated_backend)
    trainer = PipelineTrainer(
        trained,
        dedicated_backend,
        base_rollout,
        [{"q": f"Name a colour, {i}."} for i in range(3)],
        None,
        num_rollout_workers=1,
        min_batch_size=1,
        max_batch_size=1,
        max_steps_off_policy=None,  # base samples stay trainable at every step
        learning_rate=5e-2,
        kl_penalty_coef=0.1,
        kl_penalty_step_lag=1,
        eval_at_start=False,
    )
    await trainer.train()

    directory = Path(dedicated_backend.path) / trained.project / "models" / trained.name
    rows = [json.loads(line) for line in (directory / "history.jsonl").read_text().splitlines()]
    kl = {row["step"]: row["loss/kl_policy_ref"] for row in rows if "loss/kl_policy_ref" in row}
    assert sorted(kl) == [0, 1, 2]
    # Sampler and reference on the same weights: only the engine's and the trainer's
    # kernels differ (a few hundredths on this CPU at most, in runs seen).
    floor = max(abs(kl[0]), abs(kl[1]))
    assert floor < 0.1, kl
    # On base samples the mean log-ratio to checkpoint 1 estimates KL(base || step 1) > 0,
    # and a step at learning rate 5e-2 makes it large (with the base as reference: ~0).
    assert kl[2] > max(0.5, 10 * floor), kl
