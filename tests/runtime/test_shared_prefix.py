"""Shared prefixes trained once: the same logprobs and gradients as every sequence alone."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from helpers import live_rss_bytes
from openai.types.chat.chat_completion import Choice

import art
from art.runtime.trainer.batching import MicroBatch
from art.runtime.trainer.loss import LossConfig, grpo_loss
from art.runtime.trainer.memory import GIB, StepMemory
from art.runtime.trainer.peft_trainer import PeftTrainer, create_peft_model
from art.runtime.trainer.shared_prefix import PrefixTree, distinct_tokens
from art.runtime.trainer.tokenize import TrainingSequence, tokenize_trajectory

pytestmark = pytest.mark.model  # loads the default model or starts a model service

PEFT_ARGS = art.dev.PeftArgs(r=4, lora_alpha=8)
SYSTEM = "You are a calculator. Reply with the number only."


def test_the_tree_holds_each_distinct_prefix_once_and_masks_by_sequence() -> None:
    sequences = [[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 7], [9], [1, 2, 3, 4]]
    tree = PrefixTree.of(sequences)

    assert tree.token_ids == [1, 2, 3, 4, 5, 6, 7, 9]
    assert tree.positions == [0, 1, 2, 3, 3, 4, 2, 0]
    assert tree.where == [[0, 1, 2, 3], [0, 1, 2, 4, 5], [0, 1, 6], [7], [0, 1, 2, 3]]
    assert tree.shared
    assert not PrefixTree.of([[1, 2], [2, 1]]).shared
    assert distinct_tokens(sequences) == 8
    mask = tree.attention_mask(torch.device("cpu"))[0, 0]
    # Token 5 (row 4) sees its sequence's 1, 2, 3 and itself; not 4, a sibling's.
    assert mask[4].tolist() == [True, True, True, False, True, False, False, False]
    assert mask[6].tolist() == [True, True, False, False, False, False, True, False]
    assert mask[7].tolist() == [False] * 7 + [True]  # a sequence of its own sees only itself


def _ids(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _prompt(tokenizer: Any, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return _ids(tokenizer, text)


def _choice(prompt: list[int], tokens: list[int], logprobs: list[float]) -> Choice:
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "..."},
            "prompt_token_ids": prompt,
            "token_ids": tokens,
            "token_logprobs": logprobs,
        }
    )


def _sample(
    model: Any, prompt: list[int], n: int, seed: int
) -> list[tuple[list[int], list[float]]]:
    """`n` completions of up to 10 tokens at temperature 1, with their logprobs."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.tensor([prompt] * n)
    steps: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(10):
            logprobs = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), dim=-1)
            token = torch.multinomial(logprobs.exp(), 1, generator=generator)
            steps.append(logprobs.gather(-1, token))
            ids = torch.cat([ids, token], dim=1)
    values = torch.cat(steps, dim=1)
    # Cut each at a different length, so the suffixes of a group differ in length too.
    return [
        (ids[row, len(prompt) : len(prompt) + 4 + row].tolist(), values[row, : 4 + row].tolist())
        for row in range(n)
    ]


@pytest.fixture(scope="module")
def groups(default_model: tuple[Any, Any]) -> list[art.TrajectoryGroup]:
    """Three groups as a step sees them: GRPO rollouts sharing their prompt; two-turn
    rollouts sharing a first sampled turn (trained tokens inside the shared prefix) whose
    second user turn and answer differ; and a group of a single rollout."""
    model, tokenizer = default_model
    prompt = _prompt(tokenizer, "What is 7 + 5?")
    plain = [
        art.Trajectory(messages_and_choices=[_choice(prompt, tokens, logprobs)], reward=reward)
        for (tokens, logprobs), reward in zip(
            _sample(model, prompt, 4, seed=0), [1.0, 0.0, 0.5, 0.25], strict=True
        )
    ]
    first_prompt = _prompt(tokenizer, "What is 2 + 2?")
    first, first_logprobs = _ids(tokenizer, "4<|im_end|>"), [-0.3, -0.1]
    two_turn = []
    for k, question in enumerate(["And times 3?", "And minus 1?", "And squared, then halved?"]):
        follow_up = _ids(
            tokenizer, f"\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        )
        second_prompt = first_prompt + first + follow_up
        answer = _sample(model, second_prompt, 1, seed=10 + k)[0]
        two_turn.append(
            art.Trajectory(
                messages_and_choices=[
                    _choice(first_prompt, first, first_logprobs),
                    _choice(second_prompt, *answer),
                ],
                reward=float(k * k),  # none at the mean: all three are trained
            )
        )
    lone_prompt = _ids(
        tokenizer, "<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n"
    )
    ((tokens, logprobs),) = _sample(model, lone_prompt, 1, seed=20)
    lone = [
        art.Trajectory(messages_and_choices=[_choice(lone_prompt, tokens, logprobs)], reward=1.0)
    ]
    return [art.TrajectoryGroup(plain), art.TrajectoryGroup(two_turn), art.TrajectoryGroup(lone)]


def _trainer(default_model: tuple[Any, Any], **trainer_args: Any) -> PeftTrainer:
    base, tokenizer = default_model
    model = create_peft_model(copy.deepcopy(base), PEFT_ARGS, seed=0)
    with torch.no_grad():  # LoRA B starts at 0: give it weights so the adapter acts
        generator = torch.Generator().manual_seed(1)
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.02)
    return PeftTrainer(
        model,
        tokenizer,
        init_args=art.dev.InitArgs(),
        trainer_args=art.dev.TrainerArgs(**trainer_args),
    )


def _sequences(
    tokenizer: Any, groups: list[art.TrajectoryGroup]
) -> tuple[list[TrainingSequence], dict[tuple[int, int], float]]:
    sequences: list[TrainingSequence] = []
    advantages: dict[tuple[int, int], float] = {}
    for i, group in enumerate(groups):
        for j, trajectory in enumerate(group.trajectories):
            sequences += tokenize_trajectory(
                trajectory, tokenizer, group_index=i, trajectory_index=j
            )
            advantages[i, j] = trajectory.reward - 0.5
    return sequences, advantages


def _run(
    trainer: PeftTrainer,
    sequences: list[TrainingSequence],
    advantages: dict[tuple[int, int], float],
    *,
    share: bool,
) -> tuple[MicroBatch, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """One micro-batch's forward, loss (beta > 0, so the reference pass runs too) and
    backward: its layout, per-sequence logprobs, entropies and the LoRA gradients."""
    trainer.model.zero_grad(set_to_none=True)
    batch = MicroBatch.of(sequences, advantages, trainer.device, share_prefixes=share)
    config = LossConfig(beta=0.1)
    reference = trainer._ref_logprobs(batch, None, trainer._memory.head_rows)
    flat, entropy = trainer._logprobs(batch, trainer._memory.head_rows)
    logprobs = batch.per_sequence(flat)
    result = grpo_loss(
        logprobs, batch.old_logprobs, batch.advantages, batch.mask, config, reference
    )
    result.loss.backward()
    grads = [p.grad.detach().clone() for p in trainer.parameters]  # type: ignore[union-attr]
    trainer.model.zero_grad(set_to_none=True)
    return batch, logprobs.detach(), batch.per_sequence(entropy), grads


@pytest.mark.parametrize("which", ["all", "shared prompt", "two turns", "lone prompt"])
def test_shared_prefixes_give_the_packed_logprobs_and_gradients(
    default_model: tuple[Any, Any], groups: list[art.TrajectoryGroup], which: str
) -> None:
    _, tokenizer = default_model
    chosen = (
        groups
        if which == "all"
        else [groups[["shared prompt", "two turns", "lone prompt"].index(which)]]
    )
    sequences, advantages = _sequences(tokenizer, chosen)
    trainer = _trainer(default_model)
    trainer._train_mode()

    packed, want, want_entropy, want_grads = _run(trainer, sequences, advantages, share=False)
    shared, got, got_entropy, got_grads = _run(trainer, sequences, advantages, share=True)

    total = sum(len(s.token_ids) for s in sequences)
    assert packed.tokens == total
    assert packed.attention_mask is None
    if which == "lone prompt":  # one sequence: nothing to share, the plain layout
        assert shared.tokens == total
        assert shared.attention_mask is None
    else:  # the prompt (in two turns, the first turn too) ran once, not once per sequence
        assert shared.tokens == distinct_tokens([s.token_ids for s in sequences])
        assert shared.tokens < 0.7 * total
        assert shared.attention_mask is not None
    torch.testing.assert_close(shared.mask, packed.mask)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_entropy, want_entropy, rtol=1e-4, atol=1e-5)
    assert float(want.abs().sum()) > 0
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        assert float(want_grad.norm()) > 0
        # The same sums in another order: equal up to float32 rounding.
        assert float((got_grad - want_grad).norm() / want_grad.norm()) < 1e-4


def test_a_step_with_shared_prefixes_trains_as_one_sequence_at_a_time(
    default_model: tuple[Any, Any], groups: list[art.TrajectoryGroup]
) -> None:
    """The whole step: shared prefixes give the metrics (the gradient norm before clipping
    included) of micro-batches of one sequence, where nothing can be shared, with
    gradient checkpointing or without."""
    config = art.TrainConfig(learning_rate=1e-4, beta=0.1)
    shared = _trainer(default_model).step(groups, config, art.dev.TrainConfig())
    alone = _trainer(default_model).step(
        groups, config, art.dev.TrainConfig(gradient_accumulation_sequences=1)
    )
    recomputed = _trainer(default_model, gradient_checkpointing=True).step(
        groups, config, art.dev.TrainConfig()
    )

    # The group of one rollout has no reward variance: nothing of it is trained.
    assert alone["micro_batches"] == alone["sequences_trained"] == 7
    assert shared["micro_batches"] == 2  # a tree per group
    assert shared["forward_tokens"] < alone["forward_tokens"] * 0.6
    for name in (
        "loss",
        "policy_loss",
        "kl",
        "grad_norm",
        "entropy",
        "mean_ratio",
        "tokens_trained",
    ):
        assert math.isfinite(shared[name]), name
        assert shared[name] == pytest.approx(alone[name], rel=1e-4, abs=1e-7), name
        assert recomputed[name] == pytest.approx(shared[name], rel=1e-4, abs=1e-7), name
    # Gradient checkpointing recomputes each layer of a tree under the same mask.
    assert recomputed["checkpointed_micro_batches"] == recomputed["micro_batches"] == 2
    assert shared["kl"] > 0


def test_the_budget_counts_shared_tokens_once(
    default_model: tuple[Any, Any], groups: list[art.TrajectoryGroup]
) -> None:
    """The plan sizes a micro-batch by the tokens its forward computes: a budget with
    room for each group's distinct tokens, not for all of a group's tokens, trains each
    group in one micro-batch."""
    distinct, total = [], []
    for group in groups[:2]:
        sequences, _ = _sequences(default_model[1], [group])
        distinct.append(distinct_tokens([s.token_ids for s in sequences]))
        total.append(sum(len(s.token_ids) for s in sequences))
    assert max(distinct) + 60 < min(total)
    trainer = _trainer(default_model)
    memory = StepMemory.of(trainer._causal_lm, trainer.parameters)
    rss = live_rss_bytes()  # as the plan reads it
    # Tokens: the RSS may move by a few dozen tokens' worth between here and the plan.
    room = (max(distinct) + min(total)) // 2
    budget = (rss + memory.step_bytes(room, checkpointed=False)) / GIB
    tight = PeftTrainer(
        trainer.model,
        default_model[1],
        init_args=art.dev.InitArgs(),
        trainer_args=art.dev.TrainerArgs(memory_budget_gb=budget, gradient_checkpointing=False),
    )

    metrics = tight.step(groups, art.TrainConfig(learning_rate=1e-4), art.dev.TrainConfig())

    assert metrics["micro_batches"] == 2
    assert metrics["forward_tokens"] == sum(distinct)
