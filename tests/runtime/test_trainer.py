"""PeftTrainer on the real default model: weights move, and only when they should."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from openai.types.chat.chat_completion import Choice

import art
from art.runtime.trainer.peft_trainer import PeftTrainer, add_adapter, create_peft_model

pytestmark = pytest.mark.model  # loads the default model or starts a model service

PEFT_ARGS = art.dev.PeftArgs(r=4, lora_alpha=8)
PROMPTS = (
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "A color?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "A fruit?"}],
)
REWARDS = ([1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.25])


def sample(
    model: Any, tokenizer: Any, messages: list[dict[str, str]], n: int, seed: int
) -> list[Choice]:
    """Sample `n` short completions with the model itself, recording ids and logprobs as
    our endpoint does (temperature 1, the final EOS kept)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt] * n)
    logprobs: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(8):
            step = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
            token = torch.multinomial(step.exp(), 1, generator=generator)
            logprobs.append(step.gather(-1, token))
            ids = torch.cat([ids, token], dim=1)
    choices = []
    for row in range(n):
        tokens = ids[row, len(prompt) :].tolist()
        values = torch.cat(logprobs, dim=1)[row].tolist()
        eos = tokenizer.eos_token_id
        end = tokens.index(eos) + 1 if eos in tokens else len(tokens)
        content = tokenizer.decode(tokens[:end], skip_special_tokens=True)
        choices.append(
            Choice.model_validate(
                {
                    "index": 0,
                    "finish_reason": "stop" if end < len(tokens) else "length",
                    "message": {"role": "assistant", "content": content},
                    "prompt_token_ids": prompt,
                    "token_ids": tokens[:end],
                    "token_logprobs": values[:end],
                }
            )
        )
    return choices


@pytest.fixture(scope="module")
def sampled(default_model: tuple[Any, Any]) -> list[list[tuple[list[Any], Choice]]]:
    model, tokenizer = default_model
    return [
        [(messages, choice) for choice in sample(model, tokenizer, messages, 4, seed=i)]
        for i, messages in enumerate(PROMPTS)
    ]


def groups_with(
    sampled: list[list[tuple[list[Any], Choice]]], rewards: tuple[list[float], ...]
) -> list[art.TrajectoryGroup]:
    return [
        art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*messages, choice], reward=reward)
            for (messages, choice), reward in zip(group, group_rewards, strict=True)
        )
        for group, group_rewards in zip(sampled, rewards, strict=True)
    ]


def fresh_trainer(default_model: tuple[Any, Any], adapter_dir: Path | None = None) -> PeftTrainer:
    base, tokenizer = default_model
    # The same LoRA A initialisation in every test.
    model = create_peft_model(copy.deepcopy(base), PEFT_ARGS, adapter_dir, seed=0)
    return PeftTrainer(
        model, tokenizer, init_args=art.dev.InitArgs(), trainer_args=art.dev.TrainerArgs()
    )


def lora_weights(trainer: PeftTrainer) -> dict[str, torch.Tensor]:
    return {
        name: param.detach().clone()
        for name, param in trainer.model.named_parameters()
        if "lora_" in name
    }


CONFIG = art.TrainConfig(learning_rate=1e-3)


def test_one_step_moves_the_lora_weights(
    default_model: tuple[Any, Any], sampled: list[list[tuple[list[Any], Choice]]]
) -> None:
    trainer = fresh_trainer(default_model)
    before = lora_weights(trainer)
    b_name = next(name for name in before if "lora_B" in name)
    assert not before[b_name].any()  # LoRA B starts at zero

    metrics = trainer.step(groups_with(sampled, REWARDS), CONFIG, art.dev.TrainConfig())

    after = lora_weights(trainer)
    assert after[b_name].abs().sum() > 0
    assert metrics["sequences_trained"] > 0
    assert metrics["sequences_trained"] == 8
    assert metrics["tokens_trained"] > 0
    assert metrics["truncated_tokens"] == 0
    for name in ("loss", "policy_loss", "grad_norm", "entropy"):
        assert math.isfinite(metrics[name]), name
    assert metrics["grad_norm"] > 0
    assert metrics["entropy"] > 0
    # The sampler's logprobs came from this very model: the trainer must recompute them
    # for the same tokens (an off-by-one would put the ratio far from 1).
    assert metrics["mean_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["clip_fraction"] == 0.0
    assert "kl" not in metrics
    assert not trainer.model.training


def test_micro_batches_sum_to_one_token_level_mean(
    default_model: tuple[Any, Any], sampled: list[list[tuple[list[Any], Choice]]]
) -> None:
    groups = groups_with(sampled, REWARDS)
    # None adapts: each group's 4 sequences share their prompt, one micro-batch a group.
    whole = fresh_trainer(default_model).step(groups, CONFIG, art.dev.TrainConfig())
    split = fresh_trainer(default_model).step(
        groups, CONFIG, art.dev.TrainConfig(gradient_accumulation_sequences=3)
    )
    assert whole["micro_batches"] == 2
    assert split["micro_batches"] == 3  # per group 3 sharing a prompt, + the 2 left over
    # grad_norm is measured before clipping: the same gradient, however it was accumulated.
    for name in ("loss", "grad_norm", "entropy", "mean_ratio", "tokens_trained"):
        assert split[name] == pytest.approx(whole[name], rel=1e-4), name


def test_groups_without_reward_variance_train_nothing(
    default_model: tuple[Any, Any], sampled: list[list[tuple[list[Any], Choice]]]
) -> None:
    trainer = fresh_trainer(default_model)
    before = lora_weights(trainer)

    metrics = trainer.step(
        groups_with(sampled, ([1.0] * 4, [0.0] * 4)), CONFIG, art.dev.TrainConfig()
    )

    assert metrics["tokens_trained"] == 0
    assert metrics["sequences_trained"] == 0
    assert metrics["loss"] == 0
    assert metrics["grad_norm"] == 0
    after = lora_weights(trainer)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert not trainer.optimizer.state  # no optimizer step was taken


def test_save_then_reload_gives_the_same_adapter_and_optimizer(
    default_model: tuple[Any, Any],
    sampled: list[list[tuple[list[Any], Choice]]],
    tmp_path: Path,
) -> None:
    trainer = fresh_trainer(default_model)
    trainer.step(groups_with(sampled, REWARDS), CONFIG, art.dev.TrainConfig())
    trainer.save(tmp_path)
    assert (tmp_path / "adapter_config.json").is_file()
    assert (tmp_path / "optimizer.pt").is_file()

    reloaded = fresh_trainer(default_model, adapter_dir=tmp_path)
    assert reloaded.load_optimizer(tmp_path)

    saved, loaded = lora_weights(trainer), lora_weights(reloaded)
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[name], loaded[name]) for name in saved)
    assert [p.requires_grad for p in reloaded.parameters] == [True] * len(trainer.parameters)
    state = reloaded.optimizer.state_dict()["state"]
    assert state
    assert all(int(entry["step"]) == 1 for entry in state.values())
    assert not fresh_trainer(default_model).load_optimizer(tmp_path / "missing")


def test_kl_to_the_base_model_is_reported_with_beta(
    default_model: tuple[Any, Any], sampled: list[list[tuple[list[Any], Choice]]]
) -> None:
    trainer = fresh_trainer(default_model)
    config = art.TrainConfig(learning_rate=1e-3, beta=0.1)
    groups = groups_with(sampled, REWARDS)

    first = trainer.step(groups, config, art.dev.TrainConfig())
    second = trainer.step(groups, config, art.dev.TrainConfig())

    # LoRA B is zero at first, so the policy is the base model; after a step it is not.
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl"] > 0
    assert math.isfinite(second["loss"])


def test_adapters_sharing_a_base_train_and_save_apart(
    default_model: tuple[Any, Any],
    sampled: list[list[tuple[list[Any], Choice]]],
    tmp_path: Path,
) -> None:
    base, tokenizer = default_model
    args = {"init_args": art.dev.InitArgs(), "trainer_args": art.dev.TrainerArgs()}
    model = add_adapter(add_adapter(copy.deepcopy(base), "one", PEFT_ARGS), "two", PEFT_ARGS)
    one = PeftTrainer(model, tokenizer, **args)
    model.set_adapter("two")
    two = PeftTrainer(model, tokenizer, **args)
    assert (one.adapter, two.adapter) == ("one", "two")
    before = lora_weights(one)

    two.step(groups_with(sampled, REWARDS), CONFIG, art.dev.TrainConfig())

    after = lora_weights(one)
    for name in before:
        moved = not torch.equal(before[name], after[name])
        assert moved == (".two." in name and "lora_B" in name), name
    two.save(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").is_file()  # not in a "two/" subfolder
    reloaded = add_adapter(copy.deepcopy(base), "three", PEFT_ARGS, adapter_dir=tmp_path)
    loaded = {
        name.replace(".three.", ".two."): param
        for name, param in reloaded.named_parameters()
        if "lora_" in name
    }
    assert all(torch.equal(loaded[name], after[name]) for name in loaded)
    assert len(loaded) == len(after) // 2


def completion_logprobs(
    trainer: PeftTrainer, sampled: list[list[tuple[list[Any], Choice]]]
) -> list[list[float]]:
    """The policy's total logprob of each sampled completion, given its prompt."""
    totals: list[list[float]] = []
    with torch.no_grad():
        for group in sampled:
            totals.append([])
            for _, choice in group:
                extra = choice.model_extra or {}
                prompt, tokens = extra["prompt_token_ids"], extra["token_ids"]
                ids = torch.tensor([prompt + tokens])
                logits = trainer.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
                picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])
                totals[-1].append(float(picked.sum()))
    return totals


def test_training_raises_the_rewarded_completion_and_lowers_the_others(
    default_model: tuple[Any, Any], sampled: list[list[tuple[list[Any], Choice]]]
) -> None:
    trainer = fresh_trainer(default_model)
    rewards = ([1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0])
    before = completion_logprobs(trainer, sampled)

    for _ in range(3):
        trainer.step(groups_with(sampled, rewards), CONFIG, art.dev.TrainConfig())

    after = completion_logprobs(trainer, sampled)
    for group_rewards, old, new in zip(rewards, before, after, strict=True):
        for reward, old_value, new_value in zip(group_rewards, old, new, strict=True):
            if reward > 0:
                assert new_value > old_value + 0.1, (old_value, new_value)
            else:
                assert new_value < old_value, (old_value, new_value)


def test_the_seed_fixes_the_adapter_init_and_leaves_the_global_rng_alone(
    default_model: tuple[Any, Any], sampled: list[list[tuple[list[Any], Choice]]]
) -> None:
    base, tokenizer = default_model
    state = torch.get_rng_state()

    def lora_a(seed: int) -> torch.Tensor:
        model = create_peft_model(copy.deepcopy(base), PEFT_ARGS, seed=seed)
        return next(p for n, p in model.named_parameters() if "lora_A" in n).detach().clone()

    assert torch.equal(lora_a(1), lora_a(1))
    assert not torch.equal(lora_a(1), lora_a(2))
    assert torch.equal(torch.get_rng_state(), state)

    # Nor does a trainer, in its set-up or its steps (LoRA dropout draws from its own RNG).
    model = create_peft_model(
        copy.deepcopy(base), art.dev.PeftArgs(r=4, lora_alpha=8, lora_dropout=0.1), seed=3
    )
    trainer = PeftTrainer(
        model, tokenizer, init_args=art.dev.InitArgs(), trainer_args=art.dev.TrainerArgs(seed=3)
    )
    trainer.step(groups_with(sampled, REWARDS), CONFIG, art.dev.TrainConfig())
    assert torch.equal(torch.get_rng_state(), state)
