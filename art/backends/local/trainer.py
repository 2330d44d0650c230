"""`PeftTrainer`: GRPO on a LoRA adapter with PEFT and a plain PyTorch loop.

A recipe read top to bottom: `__init__` sets up the optimizer over the adapter's
parameters; `step` turns trajectory groups into advantages and token sequences, runs
forward/backward over micro-batches, clips the gradient and takes one optimizer step;
`save` writes the adapter and the optimizer state. The maths lives in `advantages.py`
and `loss.py`, tokenization in `tokenize.py`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import save_file

from ...core import dev
from ...core.errors import ConfigError, TrainingError
from ...core.trajectories import TrajectoryGroup
from ...core.types import TrainConfig
from .advantages import group_advantages
from .loss import LossConfig, grpo_loss
from .tokenize import TrainingSequence, tokenize_trajectory, truncate

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MICRO_BATCH_SEQUENCES = 8
# Rows (batch x positions) of logits turned into log-probabilities at once: bounds the
# float32 temporaries of a large vocabulary (49k x 512 x 4 bytes ~ 100 MB).
_LOGPROB_CHUNK_ROWS = 512


def create_peft_model(
    base_model: PreTrainedModel, peft_args: dev.PeftArgs, adapter_dir: Path | None = None
) -> PeftModel:
    """Wrap `base_model` (in place) with a fresh LoRA adapter, or the one in `adapter_dir`."""
    return add_adapter(base_model, "default", peft_args, adapter_dir)


def lora_config(peft_args: dev.PeftArgs) -> LoraConfig:
    """PEFT's LoRA config for `peft_args`."""
    return LoraConfig(
        r=peft_args.r,
        lora_alpha=peft_args.lora_alpha,
        lora_dropout=peft_args.lora_dropout,
        target_modules=list(peft_args.target_modules),
        task_type="CAUSAL_LM",
    )


def add_adapter(
    model: PreTrainedModel | PeftModel,
    name: str,
    peft_args: dev.PeftArgs,
    adapter_dir: Path | None = None,
) -> PeftModel:
    """Add the LoRA adapter `name` to `model`: fresh, or loaded trainable from `adapter_dir`.

    A base model is wrapped in place into a `PeftModel`; a `PeftModel` gains one more
    adapter (several models trained on one base share its weights). The active adapter
    is left as it was: a `PeftTrainer` activates its own.
    """
    if adapter_dir is not None and not (adapter_dir / "adapter_config.json").is_file():
        raise ConfigError(
            "adapter_dir",
            f"no LoRA adapter (adapter_config.json) in {adapter_dir}",
            "Point it at a checkpoint directory written by `PeftTrainer.save`",
        )
    config = lora_config(peft_args)
    with warnings.catch_warnings():
        # peft reads a transformers property that transformers itself marks deprecated.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        if isinstance(model, PeftModel):
            if adapter_dir is not None:
                model.load_adapter(str(adapter_dir), adapter_name=name, is_trainable=True)
            else:
                model.add_adapter(name, config)
            return model
        if adapter_dir is not None:
            wrapped = PeftModel.from_pretrained(
                model, str(adapter_dir), adapter_name=name, is_trainable=True
            )
        else:
            wrapped = get_peft_model(model, config, adapter_name=name)
    assert isinstance(wrapped, PeftModel)
    return wrapped


@dataclass(frozen=True)
class _MicroBatch:
    input_ids: torch.Tensor  # [batch, length], right-padded
    attention_mask: torch.Tensor  # [batch, length]
    # The rest are aligned with the predicted tokens, input_ids[:, 1:]: [batch, length - 1].
    mask: torch.Tensor  # 1.0 on trained tokens
    old_logprobs: torch.Tensor  # the sampler's, NaN where unknown
    advantages: torch.Tensor


class PeftTrainer:
    """Takes one GRPO optimizer step on the LoRA adapter of `model` per `step` call."""

    def __init__(
        self,
        model: PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        init_args: dev.InitArgs,
        trainer_args: dev.TrainerArgs,
    ) -> None:
        torch.manual_seed(trainer_args.seed)
        self.model = model
        self.tokenizer = tokenizer
        self.init_args = init_args
        # The adapter active now is the one this trainer trains; activating it makes its
        # parameters, and no other adapter's, require grad.
        self.adapter = model.active_adapter
        model.set_adapter(self.adapter)
        self.parameters = [p for p in model.parameters() if p.requires_grad]
        if not self.parameters:
            raise TrainingError(f"adapter {self.adapter!r} has no trainable parameters")
        # The learning rate is set from `TrainConfig` on every step.
        self.optimizer = torch.optim.AdamW(
            self.parameters,
            lr=0.0,
            betas=(trainer_args.adam_beta1, trainer_args.adam_beta2),
            weight_decay=trainer_args.weight_decay,
        )

    def step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        chat_template: str | None = None,
    ) -> dict[str, float]:
        """Train on `groups` with one optimizer step; return the step's metrics."""
        sequences, advantages = self._sequences(groups, dev_config, chat_template)
        sequences, truncated = truncate(sequences, self.init_args.max_seq_length)
        # Position 0 predicts nothing, so only tokens 1.. count.
        tokens = sum(sum(sequence.trained[1:]) for sequence in sequences)
        loss_config = LossConfig.from_configs(config, dev_config)
        metrics = {
            "sequences_trained": float(len(sequences)) if tokens else 0.0,
            "tokens_trained": float(tokens),
            "truncated_tokens": float(truncated),
        }
        names = ["loss", "policy_loss", "entropy", "clip_fraction", "mean_ratio"]
        if loss_config.beta > 0:
            names.append("kl")
        sums = dict.fromkeys(names, 0.0)
        if tokens == 0:
            return metrics | sums | {"grad_norm": 0.0}

        micro_batch = dev_config.gradient_accumulation_sequences or DEFAULT_MICRO_BATCH_SEQUENCES
        self.model.set_adapter(self.adapter)  # inference may have switched to another
        self._train_mode()
        try:
            for batch in self._micro_batches(sequences, advantages, micro_batch):
                ref_logprobs = self._ref_logprobs(batch) if loss_config.beta > 0 else None
                logits = self.model(
                    input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
                ).logits
                new_logprobs, entropy = _token_logprobs(logits[:, :-1], batch.input_ids[:, 1:])
                result = grpo_loss(
                    new_logprobs,
                    batch.old_logprobs,
                    batch.advantages,
                    batch.mask,
                    loss_config,
                    ref_logprobs,
                )
                # Each micro-batch's mean weighted by its share of the tokens: the sum of
                # the gradients is that of one token-level mean over the whole step.
                share = float(batch.mask.sum()) / tokens
                torch.autograd.backward(result.loss * share)
                sums["loss"] += float(result.loss.detach()) * share
                sums["policy_loss"] += float(result.policy_loss) * share
                sums["clip_fraction"] += float(result.clip_fraction) * share
                sums["mean_ratio"] += float(result.mean_ratio) * share
                sums["entropy"] += float((entropy * batch.mask).sum()) / tokens
                if result.kl is not None:
                    sums["kl"] += float(result.kl) * share

            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.parameters, dev_config.max_grad_norm)
            )
            if not math.isfinite(grad_norm):
                raise TrainingError(
                    f"the gradient norm is {grad_norm}; the adapter was left unchanged. "
                    "Lower the learning rate, or check the rewards and sampler logprobs"
                )
            for param_group in self.optimizer.param_groups:
                param_group["lr"] = config.learning_rate
            self.optimizer.step()
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.model.eval()
        return metrics | sums | {"grad_norm": grad_norm}

    def save(self, directory: Path) -> None:
        """Write the adapter and `optimizer.pt` into `directory` (the caller makes it atomic).

        The adapter files lie at the top of `directory` whatever the adapter's name (PEFT's
        own `save_pretrained` puts a non-default adapter in a subfolder), so a checkpoint
        is loadable as `base_model` or `adapter_dir` as it is.
        """
        directory.mkdir(parents=True, exist_ok=True)
        config = self.model.peft_config[self.adapter]
        # PEFT's "auto" asks the Hub whether the vocabulary was resized (warning offline);
        # we never resize it, so embeddings are saved only when the adapter targets them.
        targets = getattr(config, "target_modules", None) or ()
        weights = get_peft_model_state_dict(
            self.model,
            adapter_name=self.adapter,
            save_embedding_layers=any(name in ("embed_tokens", "lm_head") for name in targets),
        )
        save_file(
            {key: value.detach().contiguous() for key, value in weights.items()},
            directory / "adapter_model.safetensors",
        )
        config.save_pretrained(str(directory))
        torch.save(self.optimizer.state_dict(), directory / "optimizer.pt")

    def load_optimizer(self, directory: Path) -> bool:
        """Restore the optimizer state saved in `directory`; False when there is none."""
        path = directory / "optimizer.pt"
        if not path.is_file():
            return False
        self.optimizer.load_state_dict(torch.load(path, weights_only=True))
        return True

    def _sequences(
        self, groups: list[TrajectoryGroup], dev_config: dev.TrainConfig, chat_template: str | None
    ) -> tuple[list[TrainingSequence], dict[tuple[int, int], float]]:
        sequences: list[TrainingSequence] = []
        advantages: dict[tuple[int, int], float] = {}
        for i, group in enumerate(groups):
            rewards = [trajectory.reward for trajectory in group.trajectories]
            values = group_advantages(rewards, scale=dev_config.scale_rewards)
            for j, (trajectory, advantage) in enumerate(
                zip(group.trajectories, values, strict=True)
            ):
                if advantage == 0.0:
                    continue  # no learning signal, and its tokens need not be valid
                advantages[i, j] = advantage
                sequences += tokenize_trajectory(
                    trajectory,
                    self.tokenizer,
                    group_index=i,
                    trajectory_index=j,
                    chat_template=chat_template,
                    allow_training_without_logprobs=dev_config.allow_training_without_logprobs,
                )
        return sequences, advantages

    def _micro_batches(
        self,
        sequences: Sequence[TrainingSequence],
        advantages: dict[tuple[int, int], float],
        size: int,
    ) -> Iterator[_MicroBatch]:
        # Longest first: similar lengths share a batch (less padding), and a batch too
        # large for memory fails at once rather than at the end.
        ordered = sorted(sequences, key=lambda s: len(s.token_ids), reverse=True)
        pad = self.tokenizer.pad_token_id
        pad_id = pad if isinstance(pad, int) else 0
        device = next(iter(self.parameters)).device
        for start in range(0, len(ordered), size):
            chunk = ordered[start : start + size]
            length = len(chunk[0].token_ids)
            shape = (len(chunk), length)
            input_ids = torch.full(shape, pad_id, dtype=torch.long)
            attention_mask = torch.zeros(shape, dtype=torch.long)
            trained = torch.zeros(shape)
            old_logprobs = torch.full(shape, math.nan)
            advantage = torch.zeros(shape)
            for row, sequence in enumerate(chunk):
                n = len(sequence.token_ids)
                input_ids[row, :n] = torch.tensor(sequence.token_ids)
                attention_mask[row, :n] = 1
                trained[row, :n] = torch.tensor(sequence.trained, dtype=torch.float32)
                old_logprobs[row, :n] = torch.tensor(sequence.sampler_logprobs)
                advantage[row, :n] = advantages[sequence.group_index, sequence.trajectory_index]
            yield _MicroBatch(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                mask=trained[:, 1:].to(device),
                old_logprobs=old_logprobs[:, 1:].to(device),
                advantages=advantage[:, 1:].to(device),
            )

    def _ref_logprobs(self, batch: _MicroBatch) -> torch.Tensor:
        # The base model is the adapter switched off: no second copy of the weights.
        with torch.no_grad(), self.model.disable_adapter():
            logits = self.model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
            ).logits
            return _token_logprobs(logits[:, :-1], batch.input_ids[:, 1:])[0]

    def _train_mode(self) -> None:
        self.model.train()
        # Only LoRA's own dropout should act: a base model's dropout (GPT-2 has 0.1) would
        # make the trainer's logprobs disagree with the sampler's and skew the ratio.
        for name, module in self.model.named_modules():
            if isinstance(module, torch.nn.Dropout) and "lora_dropout" not in name:
                module.eval()


def _token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 log-probability of each target token, and the entropy (no grad) at each position."""
    positions = max(1, _LOGPROB_CHUNK_ROWS // logits.shape[0])
    logprobs: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    for start in range(0, logits.shape[1], positions):
        chunk = logits[:, start : start + positions].float()
        normalizer = torch.logsumexp(chunk, dim=-1)
        picked = chunk.gather(-1, targets[:, start : start + positions, None]).squeeze(-1)
        logprobs.append(picked - normalizer)
        with torch.no_grad():
            probs = torch.softmax(chunk, dim=-1)
            entropies.append(normalizer - (probs * chunk).sum(-1))
    return torch.cat(logprobs, dim=1), torch.cat(entropies, dim=1)


__all__ = [
    "DEFAULT_MICRO_BATCH_SEQUENCES",
    "PeftTrainer",
    "add_adapter",
    "create_peft_model",
    "lora_config",
]
