"""`PeftTrainer`: GRPO on a LoRA adapter with PEFT and a plain PyTorch loop.

A recipe read top to bottom: `__init__` sets up the optimizer over the adapter's
parameters; `step` turns trajectory groups into advantages and token sequences, plans
micro-batches that fit the memory budget (or fails before anything runs), runs
forward/backward over them, clips the gradient and takes one optimizer step; `save`
writes the adapter and the optimizer state. The maths lives in `advantages.py` and
`loss.py`, tokenization in `tokenize.py`, packing in `batching.py`, shared prefixes
(a group's prompt trained once for all its rollouts) in `shared_prefix.py`, the chunked
LM head in `logprobs.py`, memory estimates and measurement in `memory.py`.
"""

from __future__ import annotations

import contextlib
import io
import math
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import torch
from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict
from safetensors.torch import save as safetensors_bytes
from tqdm.auto import tqdm

from ...core.data import dev
from ...core.data.errors import ConfigError, TrainingError
from ...core.data.trajectories import Trajectory, TrajectoryGroup
from ...core.data.types import TrainConfig
from ..chat_format import ChatRendering
from .advantages import balanced, group_advantages
from .batching import PACKED_ROW_TOKENS, MicroBatch, pack
from .logprobs import output_head, sampled_logprobs
from .lora_linear import with_fused_linear
from .loss import LossConfig, grpo_loss
from .memory import (
    GIB,
    Budget,
    PeakMemory,
    StepMemory,
    large_frees_returned,
    long_rows_returned,
    return_free_heap,
)
from .memory import budget as memory_budget
from .shared_prefix import PrefixTrie, distinct_tokens, worth_joining
from .token_losses import TokenDatum, check_datum, token_loss
from .tokenize import TrainingSequence, tokenize_trajectory, truncate

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

# Micro-batches of more tokens than this train with gradient checkpointing unless
# TrainerArgs says otherwise: their activations, not the weights, would then dominate a
# step's memory (the 135M default model keeps ~3 MB a token in float32, ~1.4 MB in bfloat16,
# without it: 2026-12-01). A shorter one the budget cannot hold whole checkpoints the fewest
# of its layers that bring it within the budget: each layer costs a part of a forward.
CHECKPOINT_ABOVE_TOKENS = 1024
# On a CPU with no memory budget configured, a shorter micro-batch whose step is estimated
# at more than this checkpoints the fewest layers that bring it within: the step shares
# the machine's memory with the user's agent and whatever else runs there. Eight 539-token
# micro-batches of the default model in float32 (AVX2, 2 cores, 2026-12-01) peaked at
# 2.8-3.1 GiB kept whole and at 2.1-2.2 within this bound, 11% slower (~14 of 30 layers
# recomputed). Prefix trees of a couple of hundred tokens, most RL steps, fit whole.
CPU_MICRO_BATCH_BYTES = GIB


def create_peft_model(
    base_model: PreTrainedModel,
    peft_args: dev.PeftArgs,
    adapter_dir: Path | None = None,
    *,
    seed: int | None = None,
) -> PeftModel:
    """Wrap `base_model` (in place) with a fresh LoRA adapter, or the one in `adapter_dir`."""
    return add_adapter(base_model, "default", peft_args, adapter_dir, seed=seed)


def lora_config(peft_args: dev.PeftArgs) -> LoraConfig:
    """PEFT's LoRA config for `peft_args`, its linear targets `FusedLoraLinear` layers."""
    return with_fused_linear(
        LoraConfig(
            r=peft_args.r,
            lora_alpha=peft_args.lora_alpha,
            lora_dropout=peft_args.lora_dropout,
            target_modules=list(peft_args.target_modules),
            task_type="CAUSAL_LM",
        )
    )


def add_adapter(
    model: PreTrainedModel | PeftModel,
    name: str,
    peft_args: dev.PeftArgs,
    adapter_dir: Path | None = None,
    *,
    seed: int | None = None,
) -> PeftModel:
    """Add the LoRA adapter `name` to `model`: fresh, or loaded trainable from `adapter_dir`.

    A base model is wrapped in place into a `PeftModel`; a `PeftModel` gains one more
    adapter (several models trained on one base share its weights). The active adapter
    is left as it was: a `PeftTrainer` activates its own. A fresh adapter's random
    initialisation is drawn from `seed` (`TrainerArgs.seed`) in a forked RNG, so it is
    reproducible and the global RNG is left as it was; None draws from the global RNG.
    """
    if adapter_dir is not None and not (adapter_dir / "adapter_config.json").is_file():
        raise ConfigError(
            "adapter_dir",
            f"no LoRA adapter (adapter_config.json) in {adapter_dir}",
            "Point it at a checkpoint directory written by `PeftTrainer.save`",
        )
    config = lora_config(peft_args)
    seeded = contextlib.nullcontext() if seed is None else _seeded(seed)
    with warnings.catch_warnings(), seeded:
        # peft reads a transformers property that transformers itself marks deprecated.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        if isinstance(model, PeftModel):
            if adapter_dir is not None:
                model.load_adapter(str(adapter_dir), adapter_name=name, is_trainable=True)
            else:
                model.add_adapter(name, config)
            return model
        if adapter_dir is not None:
            saved = with_fused_linear(LoraConfig.from_pretrained(str(adapter_dir)))
            wrapped = PeftModel.from_pretrained(
                model, str(adapter_dir), adapter_name=name, is_trainable=True, config=saved
            )
        else:
            wrapped = get_peft_model(model, config, adapter_name=name)
    assert isinstance(wrapped, PeftModel)
    return wrapped


def load_adapter_weights(model: PeftModel, adapter: str, directory: Path) -> None:
    """Set the weights of adapter `adapter` of `model` to the checkpoint in `directory`
    (written by `PeftTrainer.save`, here or in another process); every key must match."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    device = next(p.device for p in model.parameters())
    weights = load_file(str(directory / "adapter_model.safetensors"), device=str(device))
    result = set_peft_model_state_dict(model, weights, adapter_name=adapter)
    unexpected = list(getattr(result, "unexpected_keys", None) or [])
    if unexpected:
        raise TrainingError(
            f"the checkpoint in {directory} does not fit adapter {adapter!r}: "
            f"{len(unexpected)} of its weights have no place in it (e.g. {unexpected[0]})"
        )


class StepSync(Protocol):
    """How data-parallel trainers agree within one step (`art.backends.ray` gives one).

    Each worker trains its share of the groups; sums across the workers make the step the
    same as one worker's over all of them: the token count that weights each micro-batch,
    the gradients before clipping, and the additive metrics.
    """

    def sum(self, tensor: torch.Tensor) -> None:
        """Replace `tensor` in place by its sum over the workers."""
        ...


@dataclass(frozen=True)
class _Batch:
    """A planned micro-batch: indices into the step's sequences, and how it runs."""

    indices: list[int]
    tokens: int  # what its forward computes: a prefix shared by several sequences once
    checkpointed_layers: int  # decoder layers that recompute in backward: 0 to all
    shares_prefixes: bool  # laid out as a prefix tree (`shared_prefix.py`)

    @property
    def checkpointed(self) -> bool:
        return self.checkpointed_layers > 0


@dataclass(frozen=True)
class _Plan:
    """How a step runs, planned before it does: its micro-batches and its memory."""

    batches: list[_Batch]
    in_use_bytes: int  # what the process held when the step was planned (RSS on CPU)
    step_bytes: int  # what the largest micro-batch adds to that, as `StepMemory` counts it

    @property
    def estimated_bytes(self) -> int:
        """The process's estimated peak."""
        return self.in_use_bytes + self.step_bytes


class PeftTrainer:
    """Takes one GRPO optimizer step on the LoRA adapter of `model` per `step` call."""

    def __init__(
        self,
        model: PeftModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        init_args: dev.InitArgs,
        trainer_args: dev.TrainerArgs,
        sync: StepSync | None = None,
        overlaps_decoding: bool = False,
    ) -> None:
        """`overlaps_decoding=True`: a CPU step leaves glibc's mmap threshold alone, for an
        engine decoding in this process meanwhile (dedicated mode on the CPU): lowering it
        is process-wide and costs the decode loop ~20% of its throughput (5a97eb3) while the step
        trains. The step's freed activations then stay in the RSS, beyond what the memory
        plan counts (one step of 4 x 1.2k tokens on the default model, fp32: peak 4.1 GiB
        for 2.2 estimated with checkpointing, 1.9 with the threshold lowered), so it is
        refused with `TrainerArgs.memory_budget_gb`, which the plan could not hold. False
        (the default) keeps the plan honest at the decode loop's expense."""
        self.model = model
        self.sync = sync  # None: this trainer alone takes the step
        self.overlaps_decoding = overlaps_decoding
        self.tokenizer = tokenizer
        self.init_args = init_args
        self.trainer_args = trainer_args
        self.steps = 0  # steps taken by this trainer: with the seed, its RNG stream
        # The adapter active now is the one this trainer trains; activating it makes its
        # parameters, and no other adapter's, require grad.
        self.adapter = model.active_adapter
        model.set_adapter(self.adapter)
        # Held by name so that a step's walks do not grow with the adapters of the other
        # models sharing this base (one service hosts many: each adds LoRA modules).
        self._named_parameters = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.parameters = list(self._named_parameters.values())
        if not self.parameters:
            raise TrainingError(f"adapter {self.adapter!r} has no trainable parameters")
        self.device = self.parameters[0].device
        if (
            overlaps_decoding
            and self.device.type == "cpu"
            and trainer_args.memory_budget_gb is not None
        ):
            raise ConfigError(
                "overlaps_decoding",
                "a CPU step that leaves glibc's mmap threshold alone keeps freed activations "
                f"in the RSS, so TrainerArgs.memory_budget_gb={trainer_args.memory_budget_gb} "
                "cannot be held",
                "Leave memory_budget_gb unset, or pass overlaps_decoding=False",
            )
        # The decoder and LM head are called apart, so the head can run in chunks on the
        # trained positions only; LoRA layers sit inside them, so the adapter still acts.
        causal_lm = cast("PreTrainedModel", model.get_base_model())
        self._causal_lm = causal_lm
        base_modules = [
            (name, module)
            for name, module in causal_lm.named_modules()
            if ".lora_" not in name and not name.startswith("lora_")
        ]
        self._base_dropouts = [
            module for _, module in base_modules if isinstance(module, torch.nn.Dropout)
        ]
        # What transformers' `is_activation_checkpointing` reads, found once.
        self._checkpointable = [
            module for _, module in base_modules if hasattr(module, "gradient_checkpointing")
        ]
        from transformers.modeling_layers import GradientCheckpointingLayer

        self._decoder_layers = [
            module
            for module in self._checkpointable
            if isinstance(module, GradientCheckpointingLayer)
        ]
        self._decoder = causal_lm.get_decoder()  # type: ignore[no-untyped-call]
        self._head = output_head(causal_lm)
        self._memory = StepMemory.of(causal_lm, self.parameters)
        # A half-precision base trains under autocast: PEFT keeps the adapter in float32
        # and would otherwise run every LoRA matmul in float32 and cast around it (~20% of
        # a CPU step); the adapter's weights, gradients and optimizer stay float32.
        dtype = causal_lm.dtype
        self._autocast_dtype = dtype if dtype in (torch.bfloat16, torch.float16) else None
        self._share_up_to = _prefix_sharing_limit(causal_lm)
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
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]:
        """Train on `groups` with one GRPO optimizer step; return the step's metrics.

        The step is planned before anything runs: a sequence that cannot fit the memory
        budget even alone raises `TrainingError` with the adapter untouched.
        """
        row_tokens = dev_config.packed_sequence_length
        if row_tokens is not None and row_tokens > self.init_args.max_seq_length:
            raise ConfigError(
                "packed_sequence_length",
                f"{row_tokens} exceeds InitArgs.max_seq_length={self.init_args.max_seq_length}"
                ", the longest sequence this model trains",
                f"Give at most {self.init_args.max_seq_length}, or leave it None",
            )
        memory = self._memory
        if dev_config.logprob_calculation_chunk_size is not None:
            memory = replace(memory, head_rows=dev_config.logprob_calculation_chunk_size)
        sequences, advantages = self._sequences(groups, dev_config, rendering)
        loss_config = LossConfig.from_configs(config, dev_config)
        names = ["loss", "policy_loss", "entropy", "clip_fraction", "mean_ratio"]
        if loss_config.beta > 0:
            names.append("kl")
        if loss_config.kl_penalty_coef > 0:
            names.append("kl_policy_ref")

        reference = dev_config.kl_ref_adapter_path if loss_config.needs_reference else None

        def loss(batch: MicroBatch, flat: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            ref_logprobs = (
                self._ref_logprobs(batch, reference_name, memory.head_rows)
                if loss_config.needs_reference
                else None
            )
            new_logprobs = batch.per_sequence(flat)
            # ART's precalculate_logprobs: the old policy is the trainer's, before the step.
            # One optimizer step ends the call, so every micro-batch's forward pass runs on
            # those weights: its own logprobs, detached, are them (no second pass).
            precalculated = dev_config.precalculate_logprobs
            result = grpo_loss(
                new_logprobs,
                new_logprobs.detach() if precalculated else batch.old_logprobs,
                batch.advantages,
                batch.mask,
                loss_config,
                ref_logprobs,
                sampler_logprobs=batch.old_logprobs if precalculated else None,
            )
            terms = {
                "policy_loss": float(result.policy_loss),
                "clip_fraction": float(result.clip_fraction),
                "mean_ratio": float(result.mean_ratio),
            }
            if result.kl is not None:
                terms["kl"] = float(result.kl)
            if result.kl_policy_ref is not None:
                terms["kl_policy_ref"] = float(result.kl_policy_ref)
            return result.loss, terms

        with self._reference_adapter(reference) as reference_name:
            return self._optimize(
                sequences,
                advantages,
                loss,
                names,
                learning_rate=config.learning_rate,
                max_grad_norm=dev_config.max_grad_norm,
                max_sequences=dev_config.gradient_accumulation_sequences,
                trajectories_power=dev_config.num_trajectories_learning_rate_multiplier_power,
                memory=memory,
                row_tokens=row_tokens,
            )

    def sft_step(
        self,
        trajectories: list[Trajectory],
        learning_rate: float,
        dev_config: dev.TrainSFTConfig,
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]:
        """One supervised optimizer step on the assistant turns of `trajectories`.

        The loss is the mean negative log-likelihood over every assistant token of the
        batch (text and tool calls, rendered by the same chat template the endpoint
        renders prompts with); other tokens are context. Planned and measured as `step`.
        """
        sequences: list[TrainingSequence] = []
        for i, trajectory in enumerate(trajectories):
            sequences += tokenize_trajectory(
                trajectory,
                self.tokenizer,
                group_index=i,
                trajectory_index=0,
                rendering=rendering,
                allow_training_without_logprobs=True,
                last_turn_only=dev_config.assistant_turns == "last",
            )
        weights = {(sequence.group_index, 0): 1.0 for sequence in sequences}

        def loss(batch: MicroBatch, flat: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
            return -flat.mean(), {}

        return self._optimize(
            sequences,
            weights,
            loss,
            ["loss", "entropy"],
            learning_rate=learning_rate,
            max_grad_norm=dev_config.max_grad_norm,
            max_sequences=dev_config.gradient_accumulation_sequences,
        )

    def _optimize(
        self,
        sequences: list[TrainingSequence],
        advantages: dict[tuple[int, int], float],
        loss: Callable[[MicroBatch, torch.Tensor], tuple[torch.Tensor, dict[str, float]]],
        names: list[str],
        *,
        learning_rate: float,
        max_grad_norm: float,
        max_sequences: int | None,
        trajectories_power: float = 0.0,
        memory: StepMemory | None = None,
        row_tokens: int | None = None,
    ) -> dict[str, float]:
        """One optimizer step minimising the token-level mean of `loss` over `sequences`.

        `loss(batch, logprobs)` gives a micro-batch's mean loss over its trained tokens and
        further per-token means to report (`names` lists every metric reported so). The
        learning rate is multiplied by the number of trajectories trained raised to
        `trajectories_power` (ART's num_trajectories_learning_rate_multiplier_power).
        `memory` is the model's `StepMemory` with the step's LM-head chunk; `row_tokens`
        (ART's packed_sequence_length) bounds a packed row, and longer sequences are left
        out of the step, as ART leaves them out.
        """
        memory = memory or self._memory
        dropped = 0
        if row_tokens is not None:
            kept = [s for s in sequences if len(s.token_ids) <= row_tokens]
            dropped = len(sequences) - len(kept)
            if dropped:
                longest = max(len(s.token_ids) for s in sequences)
                warnings.warn(
                    f"left {dropped} of {len(sequences)} sequences out of the step: longer "
                    f"than packed_sequence_length={row_tokens} (the longest: {longest} tokens)",
                    stacklevel=2,
                )
            sequences = kept
        sequences, truncated = truncate(sequences, self.init_args.max_seq_length)
        # Position 0 predicts nothing, so only tokens 1.. count.
        local_tokens = sum(sum(sequence.trained[1:]) for sequence in sequences)
        trajectories = {(s.group_index, s.trajectory_index) for s in sequences}
        counts = torch.tensor(
            [
                float(len(sequences)) if local_tokens else 0.0,
                local_tokens,
                truncated,
                float(len(trajectories)) if local_tokens else 0.0,
                dropped,
            ],
            dtype=torch.float64,
        )
        if self.sync is not None:  # every worker weights its micro-batches by the step's total
            self.sync.sum(counts)
        tokens = int(counts[1])
        metrics = {
            "sequences_trained": float(counts[0]),
            "tokens_trained": float(counts[1]),
            "truncated_tokens": float(counts[2]),
        }
        if row_tokens is not None:
            metrics["sequences_dropped"] = float(counts[4])
            if tokens == 0 and counts[4]:
                raise TrainingError(
                    f"every sequence with a trained token is longer than "
                    f"packed_sequence_length={row_tokens}, so none is left to train; nothing "
                    "was trained or saved. Raise packed_sequence_length, or leave it None"
                )
        sums = dict.fromkeys(names, 0.0)
        if tokens == 0:  # every worker sees the same total, so all of them return here
            return metrics | sums | {"grad_norm": 0.0}

        lower = self.device.type == "cpu" and not self.overlaps_decoding
        if lower and self.trainer_args.memory_budget_gb is not None:
            # A configured budget is read against the RSS: without this, what glibc kept
            # from the step before counted as in use, and a budget that fitted one step
            # refused the next (2.4-2.9 GiB in use where 1.3 was live).
            return_free_heap()
        plan = (
            self._plan(sequences, max_sequences, memory, row_tokens)
            if local_tokens
            else _Plan([], 0, 0)
        )
        self.model.set_adapter(self.adapter)  # inference may have switched to another
        self._train_mode()
        progress = tqdm(
            total=len(plan.batches), desc=f"train {self.adapter}", unit="micro-batch", disable=None
        )
        frees = large_frees_returned() if lower else contextlib.nullcontext()
        peak = PeakMemory(self.device)
        peak.start()
        try:
            with self._own_rng(), frees, self._head.reusing_logits():
                for planned in plan.batches:
                    if lower and planned.checkpointed:
                        # What the rollouts or the micro-batches before left in the heap
                        # goes back first: glibc keeps freed blocks under the mmap
                        # threshold, and a long micro-batch's peak would stand on them.
                        return_free_heap()
                    self._checkpoint(planned.checkpointed_layers)
                    chosen = [sequences[i] for i in planned.indices]
                    batch = MicroBatch.of(
                        chosen, advantages, self.device, share_prefixes=planned.shares_prefixes
                    )
                    long_rows = (
                        long_rows_returned()
                        if lower and planned.checkpointed_layers >= memory.layers
                        else contextlib.nullcontext()
                    )
                    with long_rows:
                        flat, entropy = self._logprobs(batch, memory.head_rows)
                        value, terms = loss(batch, flat)
                        # Each micro-batch's mean weighted by its share of the tokens: the
                        # sum of the gradients is one token-level mean's over the step.
                        share = float(batch.mask.sum()) / tokens
                        torch.autograd.backward(value * share)
                    sums["loss"] += float(value.detach()) * share
                    sums["entropy"] += float(entropy.sum()) / tokens
                    for name, term in terms.items():
                        sums[name] += term * share
                    progress.update()
                    progress.set_postfix(peak_memory_gb=f"{peak.peak_gib():.2f}")

            if lower and any(planned.checkpointed for planned in plan.batches):
                return_free_heap()  # the last long micro-batch's, before the next rollouts
            if self.sync is not None:
                self._sum_over_workers(sums)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.parameters, max_grad_norm))
            if not math.isfinite(grad_norm):
                raise TrainingError(
                    f"the gradient norm is {grad_norm}; the adapter was left unchanged. "
                    "Lower the learning rate, or check the rewards and sampler logprobs"
                )
            if trajectories_power:
                learning_rate *= float(counts[3]) ** trajectories_power
                metrics["learning_rate"] = learning_rate
            for param_group in self.optimizer.param_groups:
                param_group["lr"] = learning_rate
            self.optimizer.step()
            self.steps += 1
        finally:
            peak.stop()
            progress.close()
            self.optimizer.zero_grad(set_to_none=True)
            self._eval_mode()
        return (
            metrics
            | sums
            | {
                "grad_norm": grad_norm,
                "peak_memory_gb": peak.peak_gib(),
                "estimated_memory_gb": plan.estimated_bytes / GIB,
                "estimated_step_memory_gb": plan.step_bytes / GIB,
                "micro_batches": float(len(plan.batches)),
                "forward_tokens": float(sum(b.tokens for b in plan.batches)),
                "checkpointed_micro_batches": float(sum(b.checkpointed for b in plan.batches)),
            }
        )

    def forward_backward(
        self,
        datums: list[TokenDatum],
        loss_fn: str,
        loss_config: Mapping[str, float],
        *,
        backward: bool,
    ) -> tuple[list[dict[str, list[float]]], dict[str, float]]:
        """Tinker's `forward` / `forward_backward`: each datum's target logprobs and loss
        (`token_losses`); with `backward`, the loss's gradients are added to the adapter's
        until `optim_step`. Dropout is off, so a state scores the same each time. Datums
        are right-padded into batches of a bounded number of tokens.

        Returns each datum's outputs (`logprobs`, `elementwise_loss`) and `loss:sum`.
        """
        for index, datum in enumerate(datums):
            check_datum(datum, loss_fn, index)
            if len(datum.input_ids) > self.init_args.max_seq_length:
                raise ConfigError(
                    f"forward_backward_input.data[{index}].model_input",
                    f"{len(datum.input_ids)} tokens exceed InitArgs.max_seq_length="
                    f"{self.init_args.max_seq_length}",
                    "Give shorter sequences, or register the model with a longer max_seq_length",
                )
        self.model.set_adapter(self.adapter)
        self.model.eval()
        outputs: list[dict[str, list[float]]] = []
        total = 0.0
        with torch.set_grad_enabled(backward):
            for batch in _padded_batches(datums, max(self.init_args.max_seq_length, 4096)):
                longest = max(len(datum.input_ids) for datum in batch)
                ids = torch.zeros(len(batch), longest, dtype=torch.long, device=self.device)
                mask = torch.zeros(len(batch), longest, dtype=torch.long, device=self.device)
                for row, datum in enumerate(batch):
                    ids[row, : len(datum.input_ids)] = torch.tensor(datum.input_ids)
                    mask[row, : len(datum.input_ids)] = 1
                with torch.autocast(
                    self.device.type,
                    dtype=self._autocast_dtype or torch.bfloat16,
                    enabled=self._autocast_dtype is not None,
                ):
                    hidden = self._decoder(
                        input_ids=ids, attention_mask=mask, use_cache=False
                    ).last_hidden_state
                    real = mask.bool()  # right-padded: each row's tokens come first
                    targets = torch.tensor(
                        [t for d in batch for t in d.inputs["target_tokens"]], device=self.device
                    ).long()
                    flat, _ = sampled_logprobs(
                        hidden[real], targets, self._head, self._memory.head_rows
                    )
                loss = flat.new_zeros(())
                for datum, logprobs in zip(
                    batch, torch.split(flat, [len(d.input_ids) for d in batch]), strict=True
                ):
                    inputs = {
                        key: torch.tensor(values, device=self.device, dtype=torch.float32)
                        for key, values in datum.inputs.items()
                        if key != "target_tokens"
                    }
                    elementwise = token_loss(loss_fn, logprobs, inputs, loss_config)
                    loss = loss + elementwise.sum()
                    outputs.append(
                        {
                            "logprobs": logprobs.detach().tolist(),
                            "elementwise_loss": elementwise.detach().tolist(),
                        }
                    )
                if backward:
                    loss.backward()  # type: ignore[no-untyped-call]
                total += float(loss.detach())
        return outputs, {"loss:sum": total}

    def optim_step(
        self,
        learning_rate: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
    ) -> dict[str, float]:
        """Tinker's `optim_step`: one AdamW step (decoupled weight decay) on the gradients
        `forward_backward` summed, clipped to `grad_clip_norm` (0: not clipped); they are
        then cleared. A non-finite gradient norm raises `TrainingError`, the adapter left
        unchanged."""
        try:
            norm = float(
                torch.nn.utils.clip_grad_norm_(
                    self.parameters, grad_clip_norm if grad_clip_norm > 0 else math.inf
                )
            )
            if not math.isfinite(norm):
                raise TrainingError(
                    f"the gradient norm is {norm}; the adapter was left unchanged. Check the "
                    "advantages, weights and sampler logprobs of the last forward_backward"
                )
            for group in self.optimizer.param_groups:
                group.update(
                    lr=learning_rate, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay
                )
            self.optimizer.step()
            self.steps += 1
        finally:
            self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm, "learning_rate": learning_rate}

    def prompt_logprobs(
        self, token_ids: list[int], directory: Path | None, *, own: bool = False
    ) -> list[float]:
        """The logprob of each token after the first (Tinker's `compute_logprobs`) under
        this trainer's adapter as it is (`own`), else under the adapter saved in
        `directory`, loaded beside ours for the call (None: the base model)."""
        self.model.eval()
        ids = torch.tensor([token_ids], device=self.device)
        name = f"{self.adapter}_scored"
        load = directory is not None and not own
        if load:
            self.model.load_adapter(str(directory), adapter_name=name, is_trainable=False)
        try:
            with (
                torch.no_grad(),
                self.model.disable_adapter()
                if directory is None and not own
                else contextlib.nullcontext(),
                torch.autocast(
                    self.device.type,
                    dtype=self._autocast_dtype or torch.bfloat16,
                    enabled=self._autocast_dtype is not None,
                ),
            ):
                self.model.set_adapter(name if load else self.adapter)
                hidden = self._decoder(input_ids=ids, use_cache=False).last_hidden_state[0]
                logprobs, _ = sampled_logprobs(
                    hidden[:-1], ids[0, 1:], self._head, self._memory.head_rows
                )
            return [float(value) for value in logprobs.tolist()]
        finally:
            self.model.set_adapter(self.adapter)
            if load:
                self.model.delete_adapter(name)

    def load(self, directory: Path, *, with_optimizer: bool) -> None:
        """Set the adapter to the checkpoint in `directory`, and the optimizer to its state
        (`with_optimizer`; else a fresh one); pending gradients are dropped."""
        load_adapter_weights(self.model, self.adapter, directory)
        self.optimizer.zero_grad(set_to_none=True)
        if not (with_optimizer and self.load_optimizer(directory)):
            self.optimizer.state.clear()

    def _sum_over_workers(self, sums: dict[str, float]) -> None:
        """Sum the gradients (before clipping) and the step's metric sums over the workers."""
        assert self.sync is not None
        for parameter in self.parameters:
            if parameter.grad is None:  # a worker whose share held no trained token
                parameter.grad = torch.zeros_like(parameter)
        # One flat buffer, one collective call: the LoRA parameters are small.
        flat = torch.cat([parameter.grad.reshape(-1) for parameter in self.parameters])  # type: ignore[union-attr]
        self.sync.sum(flat)
        offset = 0
        for parameter in self.parameters:
            size = parameter.numel()
            parameter.grad.copy_(flat[offset : offset + size].view_as(parameter))  # type: ignore[union-attr]
            offset += size
        names = list(sums)
        values = torch.tensor([sums[name] for name in names], dtype=torch.float64)
        self.sync.sum(values)
        sums.update(zip(names, values.tolist(), strict=True))

    def save(self, directory: Path) -> None:
        """Write the adapter and `optimizer.pt` into `directory` (the caller makes it atomic).

        The adapter files lie at the top of `directory` whatever the adapter's name (PEFT's
        own `save_pretrained` puts a non-default adapter in a subfolder), so a checkpoint
        is loadable as `base_model` or `adapter_dir` as it is.
        """
        directory.mkdir(parents=True, exist_ok=True)
        config = self.model.peft_config[self.adapter]
        # Our own parameters, not the state of every adapter on the base. Never the base's
        # embeddings (PEFT's "auto" saves them for a LoRA on the LM head, and asks the Hub
        # whether the vocabulary was resized): we never resize it, and they would be the
        # base's weights again, 113 MB per checkpoint of the default model.
        weights = get_peft_model_state_dict(
            self.model,
            state_dict=self._named_parameters,
            adapter_name=self.adapter,
            save_embedding_layers=False,
        )
        # Written through our own file objects, so a full disk raises OSError (which
        # `replace_dir_atomic` explains): given a path, safetensors raises its own error
        # and torch fails with `unexpected pos`, leaving the file open while it is alive.
        tensors = {key: value.detach().contiguous() for key, value in weights.items()}
        with open(directory / "adapter_model.safetensors", "wb") as file:
            file.write(safetensors_bytes(tensors))
        config.save_pretrained(str(directory))
        # Serialized in memory first, for the same reason: torch.save into a file on a full
        # disk fails with `[enforce fail at inline_container.cc] unexpected pos`, no OSError.
        state = io.BytesIO()
        torch.save(self.optimizer.state_dict(), state)
        with open(directory / "optimizer.pt", "wb") as file:
            file.write(state.getbuffer())

    def load_optimizer(self, directory: Path) -> bool:
        """Restore the optimizer state saved in `directory`; False when there is none."""
        path = directory / "optimizer.pt"
        if not path.is_file():
            return False
        self.optimizer.load_state_dict(torch.load(path, weights_only=True))
        return True

    def restore(self, directory: Path) -> None:
        """Set the adapter and the optimizer back to the checkpoint in `directory` (after
        a call of several steps failed part way)."""
        load_adapter_weights(self.model, self.adapter, directory)
        if not self.load_optimizer(directory):
            self.optimizer.state.clear()

    def close(self) -> None:
        """Nothing to free: the model and optimizer go with the service's references."""

    def _sequences(
        self,
        groups: list[TrajectoryGroup],
        dev_config: dev.TrainConfig,
        rendering: ChatRendering | None,
    ) -> tuple[list[TrainingSequence], dict[tuple[int, int], float]]:
        sequences: list[TrainingSequence] = []
        advantages: dict[tuple[int, int], float] = {}
        for i, group in enumerate(groups):
            rewards = [trajectory.reward for trajectory in group.trajectories]
            values = [
                balanced(advantage, dev_config.advantage_balance)
                for advantage in group_advantages(rewards, scale=dev_config.scale_rewards)
            ]
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
                    rendering=rendering,
                    allow_training_without_logprobs=dev_config.allow_training_without_logprobs,
                )
        return sequences, advantages

    def _plan(
        self,
        sequences: Sequence[TrainingSequence],
        max_sequences: int | None,
        memory: StepMemory,
        row_tokens: int | None,
    ) -> _Plan:
        """Micro-batches and checkpointing that fit the memory budget, or a `TrainingError`.

        Sequences are packed into rows of `row_tokens` (ART's packed_sequence_length), or
        of up to `PACKED_ROW_TOKENS` as the budget allows when it is None.
        """
        budget = memory_budget(self.device, self.trainer_args.memory_budget_gb)
        forced = self.trainer_args.gradient_checkpointing
        plain = memory.capacity(budget.available, checkpointed=False)
        capacity = plain if forced is False else memory.capacity(budget.available, True)
        longest = max(sequences, key=lambda s: len(s.token_ids))
        if len(longest.token_ids) > capacity:
            raise TrainingError(self._too_long(longest, budget, forced is not False, memory))
        if row_tokens is not None and row_tokens > capacity:
            need = memory.step_bytes(row_tokens, forced is not False) / GIB
            raise TrainingError(
                f"a packed row of packed_sequence_length={row_tokens} tokens needs about "
                f"{need:.2f} GiB to train, but the budget leaves {budget.available / GIB:.2f}"
                f" GiB (rows of up to {capacity} tokens fit). Nothing was trained or saved. "
                f"To fix: give packed_sequence_length <= {capacity}, or leave it None"
            )
        lengths = [len(sequence.token_ids) for sequence in sequences]
        row = min(capacity, PACKED_ROW_TOKENS) if row_tokens is None else row_tokens
        units = self._units(sequences, row, max_sequences)
        # A unit of several sequences (a prefix tree) is a micro-batch of its own: two trees
        # in one row would make each token's attention span both (see `row_cost`), for
        # nothing. Lone sequences are packed together as before.
        alone = [unit for unit in units if len(unit) == 1]
        packed = pack([lengths[unit[0]] for unit in alone], row, max_sequences)
        bins = [[unit] for unit in units if len(unit) > 1]
        bins += [[alone[i] for i in bin_indices] for bin_indices in packed]
        batches: list[_Batch] = []
        estimated = 0
        for bin_units in bins:
            indices = [i for unit in bin_units for i in unit]
            shares = self._may_share(sequences[i] for i in indices)
            if shares:  # what the forward computes: each distinct prefix once
                tokens = distinct_tokens([sequences[i].token_ids for i in indices])
            else:
                tokens = sum(lengths[i] for i in indices)
            # Each micro-batch on its own: a long one is checkpointed, a short one of the
            # same step keeps its activations and saves the recompute.
            if forced is not None:
                layers = memory.layers if forced else 0
            elif tokens > CHECKPOINT_ABOVE_TOKENS:
                layers = memory.layers
            else:  # none where the budget holds it whole (tokens <= plain)
                room = budget.available
                if not budget.configured and self.device.type == "cpu":
                    room = min(room, CPU_MICRO_BATCH_BYTES)
                layers = memory.layers_to_checkpoint(tokens, room)
            batches.append(_Batch(indices, tokens, layers, shares))
            estimated = max(estimated, memory.step_bytes_checkpointing(tokens, layers))
        return _Plan(batches=batches, in_use_bytes=budget.in_use, step_bytes=estimated)

    def _units(
        self, sequences: Sequence[TrainingSequence], row: int, max_sequences: int | None
    ) -> list[list[int]]:
        """The step's sequences in units that train together in one micro-batch.

        A unit is sequences of one group that share a prefix (the group's prompt), trained
        together so the prefix runs once: a sequence joins while that costs less than a
        row of its own would (`worth_joining`) and the row stays within `row` distinct
        tokens. A sequence longer than a row is a unit alone, as it was before prefixes
        were shared: such micro-batches are the ones gradient checkpointing is for, and
        their attention keeps the causal kernel of a lone sequence rather than a mask.
        """
        by_group: dict[int, list[int]] = {}
        units: list[list[int]] = []
        for i, sequence in enumerate(sequences):
            if len(sequence.token_ids) < row and self._may_share([sequence]):
                by_group.setdefault(sequence.group_index, []).append(i)
            else:
                units.append([i])
        for members in by_group.values():
            # In token order, sequences sharing the longest prefixes are neighbours.
            members.sort(key=lambda i: sequences[i].token_ids)
            trie, unit = PrefixTrie(), list[int]()
            for i in members:
                ids = sequences[i].token_ids
                full = max_sequences is not None and len(unit) >= max_sequences
                tokens, new = len(trie.token_ids), trie.new_tokens(ids)
                if unit and (
                    full or tokens + new > row or not worth_joining(tokens, new, len(ids))
                ):
                    units.append(unit)
                    trie, unit = PrefixTrie(), []
                trie.add(ids)
                unit.append(i)
            units.append(unit)
        return units

    def _may_share(self, sequences: Iterable[TrainingSequence]) -> bool:
        """Whether these sequences may train as a prefix tree under this model's attention."""
        limit = self._share_up_to
        return limit is not None and all(len(s.token_ids) <= limit for s in sequences)

    def _too_long(
        self, sequence: TrainingSequence, budget: Budget, checkpointed: bool, memory: StepMemory
    ) -> str:
        length = len(sequence.token_ids)
        need = memory.step_bytes(length, checkpointed) / GIB
        where = f"group {sequence.group_index}, trajectory {sequence.trajectory_index}"
        if budget.configured:
            limit = f"TrainerArgs.memory_budget_gb={budget.limit / GIB:.2f}"
        else:
            limit = f"the {budget.limit / GIB:.2f} GiB this machine's {self.device.type} has"
        fixes = [
            f"lower InitArgs.max_seq_length (now {self.init_args.max_seq_length}) so longer "
            "sequences are truncated",
            "raise TrainerArgs.memory_budget_gb" if budget.configured else "free memory",
        ]
        if not checkpointed:
            fixes.insert(0, "leave TrainerArgs.gradient_checkpointing unset (or True)")
        if memory.head_rows > self._memory.head_rows:
            fixes.insert(0, f"lower logprob_calculation_chunk_size (now {memory.head_rows})")
        return (
            f"a sequence of {length} tokens ({where}) needs about {need:.2f} GiB to train"
            f"{' with gradient checkpointing' if checkpointed else ' without gradient checkpointing'}"
            f", but {limit} leaves {budget.available / GIB:.2f} GiB beside the "
            f"{budget.in_use / GIB:.2f} GiB in use. Nothing was trained or saved. To fix: "
            + "; or ".join(fixes)
        )

    def _logprobs(self, batch: MicroBatch, head_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's logprob of each trained token of `batch` ([n]), and the entropy there;
        the LM head takes `head_rows` tokens at a time."""
        with torch.autocast(
            self.device.type,
            dtype=self._autocast_dtype or torch.bfloat16,
            enabled=self._autocast_dtype is not None,
        ):
            hidden = self._decoder(
                input_ids=batch.input_ids,
                position_ids=batch.position_ids,
                attention_mask=batch.attention_mask,
                use_cache=False,
            ).last_hidden_state[0]
            return sampled_logprobs(hidden[batch.predict_at], batch.targets, self._head, head_rows)

    def _ref_logprobs(self, batch: MicroBatch, adapter: str | None, head_rows: int) -> torch.Tensor:
        """The reference policy's logprobs: the base model (the adapter switched off: no
        second copy of the weights), or the reference adapter `adapter` loaded beside ours."""
        if adapter is None:
            with torch.no_grad(), self.model.disable_adapter():
                return batch.per_sequence(self._logprobs(batch, head_rows)[0])
        self.model.set_adapter(adapter)
        try:
            with torch.no_grad():
                return batch.per_sequence(self._logprobs(batch, head_rows)[0])
        finally:
            self.model.set_adapter(self.adapter)  # ours again, trainable

    @contextlib.contextmanager
    def _reference_adapter(self, directory: str | None) -> Iterator[str | None]:
        """The adapter in `directory` loaded beside ours for one step (ART's
        kl_ref_adapter_path), by its name; None where the reference is the base model."""
        if directory is None:
            yield None
            return
        name = f"{self.adapter}_kl_reference"
        try:
            self.model.load_adapter(directory, adapter_name=name, is_trainable=False)
        except Exception as error:  # PEFT's: a missing file, another base's shapes
            raise TrainingError(
                f"kl_ref_adapter_path: the adapter in {directory} cannot be loaded beside "
                f"this model's: {type(error).__name__}: {error}"
            ) from error
        try:
            yield name
        finally:
            self.model.set_adapter(self.adapter)
            self.model.delete_adapter(name)

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        # LoRA dropout draws from an RNG seeded from TrainerArgs.seed and the step count,
        # inside a fork: the global RNG that unseeded sampling uses is left as it was.
        with torch.random.fork_rng(devices=_cuda_devices()):
            torch.manual_seed(self.trainer_args.seed + self.steps)
            yield

    def _train_mode(self) -> None:
        self.model.train()
        # Only LoRA's own dropout should act: a base model's dropout (GPT-2 has 0.1) would
        # make the trainer's logprobs disagree with the sampler's and skew the ratio.
        for module in self._base_dropouts:
            module.eval()

    def _checkpoint(self, layers: int) -> None:
        """Gradient (activation) checkpointing for the first `layers` decoder layers (0:
        off, `StepMemory.layers`: all)."""
        if layers <= 0:
            self._stop_checkpointing()
            return
        if not self._checkpointing():
            if hasattr(self._causal_lm, "activation_checkpointing_enable"):
                self._causal_lm.activation_checkpointing_enable({"use_reentrant": False})
            else:  # transformers before 5.23 named it gradient checkpointing
                self._causal_lm.gradient_checkpointing_enable({"use_reentrant": False})  # type: ignore[no-untyped-call]
        # Enabling sets every layer's `gradient_checkpointing` flag, which each layer reads
        # on every call: the flags of the layers past `layers` are cleared. A model whose
        # layers are not transformers' `GradientCheckpointingLayer` checkpoints them all.
        for index, layer in enumerate(self._decoder_layers):
            layer.gradient_checkpointing = index < layers

    def _eval_mode(self) -> None:
        self._stop_checkpointing()
        self.model.eval()

    def _checkpointing(self) -> bool:
        """Whether activation checkpointing is on (transformers' `is_activation_checkpointing`
        without its walk over every module, LoRA's of all adapters included)."""
        return any(module.gradient_checkpointing for module in self._checkpointable)

    def _stop_checkpointing(self) -> None:
        if self._checkpointing():
            if hasattr(self._causal_lm, "activation_checkpointing_disable"):
                self._causal_lm.activation_checkpointing_disable()  # type: ignore[no-untyped-call]
            else:
                self._causal_lm.gradient_checkpointing_disable()  # type: ignore[no-untyped-call]
            # Enabling hooked the input embeddings to require grad, which disabling does not
            # undo for a PEFT-wrapped model; inference needs no grad.
            self._causal_lm.disable_input_require_grads()  # type: ignore[no-untyped-call]


def _padded_batches(datums: list[TokenDatum], tokens: int) -> Iterator[list[TokenDatum]]:
    """Consecutive datums in batches whose padded size (rows x longest) stays within
    `tokens`, so a call's memory is bounded whatever its number of datums."""
    batch: list[TokenDatum] = []
    longest = 0
    for datum in datums:
        length = len(datum.input_ids)
        if batch and (len(batch) + 1) * max(longest, length) > tokens:
            yield batch
            batch, longest = [], 0
        batch.append(datum)
        longest = max(longest, length)
    if batch:
        yield batch


def _prefix_sharing_limit(model: PreTrainedModel) -> int | None:
    """The longest sequence that may train in a prefix tree on `model`; None: none may.

    A tree's attention is a 4D boolean mask, which transformers hands to the attention
    function as it is: right for attention built on SDPA (transformers' `sdpa_mask` is
    what its mask function makes), wrong for eager (which adds a float mask) and flash
    attention (no 4D masks), which keep the packed layout. A given 4D mask also replaces
    a sliding window or an attention chunk, so sequences longer than that keep it too.
    """
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    config = model.config
    if ALL_MASK_ATTENTION_FUNCTIONS.get(config._attn_implementation) is not sdpa_mask:
        return None
    get = getattr(config, "get_text_config", None)
    text = get() if callable(get) else config
    windows = [getattr(text, name, None) for name in ("sliding_window", "attention_chunk_size")]
    bounded = [int(window) for window in windows if isinstance(window, int) and window > 0]
    return min(bounded) if bounded else sys.maxsize


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=_cuda_devices()):
        torch.manual_seed(seed)
        yield


def _cuda_devices() -> list[int]:
    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


__all__ = [
    "CHECKPOINT_ABOVE_TOKENS",
    "CPU_MICRO_BATCH_BYTES",
    "PeftTrainer",
    "StepSync",
    "add_adapter",
    "create_peft_model",
    "load_adapter_weights",
    "lora_config",
]
