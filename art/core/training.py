"""One training step, written once: what every caller of a step runs.

`model.train`, each backend's `train` (ART 0.5.18's `backend.train`), PipelineTrainer
and `model.train_sft` / `art.utils.sft` all come here; the backend's part is its public
`Backend.train_step` (or `Backend.train_sft`), which trains checked groups and nothing
more. What a step does, in order:

1. coerce the groups and check that something in them is trainable (an error before
   anything is written);
2. with `log`, store the groups under the `train` split of the current step, so a failed
   step loses no data;
3. `backend.train_step`: one optimizer step, saved as checkpoint `step + 1` and served;
   a `TrainingError` that does not know its step is given `step + 1`;
4. the step's metrics: the groups' (rewards, exception_rate, ...), the trainer's (loss,
   grad_norm, ...) and `train_seconds`; with `log`, also `rollout_seconds` (since the
   previous step ended) and any `extra_metrics`, stored as one history row under ART's
   names (`history_keys`: `loss/train`, `data/step_num_trajectories`, `train/reward`).

The row is stored at the step the groups were sampled from (`step`), where ART's
`model.log(metrics=result.metrics, step=result.step)` puts a trainer's row at the step it
made: a step's `train/reward` and its loss then share a row, and a checkpoint's history
(`delete_checkpoints`' best step) is what its own samples scored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .data import dev, observe
from .data.errors import ConfigError, TrainingError
from .data.trajectories import Trajectory, TrajectoryGroup
from .data.types import TrainConfig, TrainSFTConfig
from .data.validation import check_trainable, coerce_groups
from .metrics.batch_metrics import group_costs, group_metrics
from .metrics.history_keys import (
    METRIC_SECTIONS,
    SFT_TRAINER_KEYS,
    batch_keys,
    qualify_metric_key,
    trainer_keys,
    user_metric_keys,
    wandb_metrics,
)
from .metrics.metrics_taxonomy import SFT_METRIC_PREFIX, average_metric_samples

if TYPE_CHECKING:
    from .backend import Backend
    from .step_ledger import StepLedger
    from .store.model_store import ModelStore

logger = logging.getLogger("art")


class TrainedModel(observe.ReportingModel, Protocol):
    """What a step needs of a model (`art.Model` and `TrainableModel` are ones): its name,
    its step ledger, and the store its running totals are kept in. The model itself is
    handed on to the backend as it is."""

    @property
    def name(self) -> str: ...

    @property
    def ledger(self) -> StepLedger: ...

    def state_store(self) -> ModelStore: ...


@dataclass(frozen=True)
class StepResult:
    """One step's outcome: the step it trained from (its new checkpoint is `step + 1`)
    and its metrics under ART's names (`loss/train`, `data/step_*`, `train/reward`), so
    that ART's `model.log(metrics=result.metrics, step=result.step)` logs them as ART's."""

    step: int
    metrics: dict[str, float]


async def run_step(
    model: TrainedModel,
    trajectory_groups: Iterable[TrajectoryGroup],
    *,
    config: TrainConfig | None = None,
    dev_config: dev.TrainConfig | None = None,
    verbose: bool = False,
    log: bool = True,
    extra_metrics: dict[str, float] | None = None,
    backend: Backend[Any, Any] | None = None,
) -> StepResult:
    """One training step of `model` on `trajectory_groups` (see the module docstring).

    `backend` is the model's own unless given (ART's `backend.train(model, ...)` gives
    itself); `log=False` is that call's: nothing is stored. `extra_metrics` join the
    step's `train/` row (PipelineTrainer's staleness and dropped-group counts), so a
    step keeps one row.
    """
    backend = backend or model.ledger.registered_backend(model.name, "train")
    config = config or TrainConfig()
    groups = coerce_groups(trajectory_groups, "trajectory_groups")
    dev_config = _with_accumulation(config, dev_config or dev.TrainConfig())
    check_trainable(groups, allow_without_logprobs=dev_config.allow_training_without_logprobs)
    step = await backend.get_step(model)
    if log:
        # The store keeps one copy of each trajectory, so a retried step does not log it twice.
        await backend.log(model, groups, split="train", step=step, metrics={})
        builder = model.ledger.builder_for_split("train")
        for key, value in group_costs(groups).items():
            builder.add_cost(key.removeprefix("costs/"), value)
    started = time.monotonic()
    try:
        trainer_metrics = await backend.train_step(
            model, groups, config=config, dev_config=dev_config, verbose=verbose
        )
    except TrainingError as error:
        if error.step is None:  # the trainer does not know which step it was making
            error.step = step + 1
        raise
    figures = group_metrics(groups)
    metrics: dict[str, float] = figures | trainer_metrics | (extra_metrics or {})
    metrics["train_seconds"] = time.monotonic() - started
    extra = extra_metrics or {}
    if not log:
        # ART 0.5.23's backend.train returns its metrics under ART's names, so that
        # `model.log(metrics=result.metrics, step=result.step)` logs them as ART does.
        return StepResult(step, _art_named(metrics, figures, extra))
    if metrics["num_trajectories"] and not metrics["trainable_groups"]:
        logger.warning(
            "%s step %d: every group's rewards are equal, so this step learned nothing; "
            "a reward (or RULER judge) that tells a group's rollouts apart is needed",
            model.name,
            step + 1,
        )
    if (rollout_seconds := model.ledger.step_ended(started)) is not None:
        metrics["rollout_seconds"] = rollout_seconds
    if verbose:
        shown = ", ".join(f"{key}={value:.4g}" for key, value in sorted(metrics.items()))
        print(f"[{model.name}] step {step} -> {step + 1}: {shown}")
    row = _art_named(metrics, figures, extra)
    # What ART's trainer returns is logged directly (`model.log(metrics=result.metrics)`),
    # so W&B gets all of it, as it gets the groups' own metrics and `extra_metrics`.
    trained = trainer_keys("train", {k: v for k, v in metrics.items() if k not in figures})
    await record(
        backend, model, [], "train", step, row, user_metric_keys("train", groups) | set(trained)
    )
    return StepResult(step, row)


def _art_named(
    metrics: dict[str, float], figures: dict[str, float], extra: dict[str, float]
) -> dict[str, float]:
    """A step's metrics as its history row names them (ART's taxonomy, ours beside)."""
    trained = {k: v for k, v in metrics.items() if k not in figures and k not in extra}
    return (
        batch_keys("train", figures)
        | trainer_keys("train", trained)
        | {qualify_metric_key(k, "train"): v for k, v in extra.items()}
    )


async def run_sft(
    model: TrainedModel,
    examples: Iterator[tuple[str, Trajectory]],
    *,
    config: TrainSFTConfig | None = None,
    dev_config: dev.TrainSFTConfig | dict[str, Any] | None = None,
    verbose: bool = False,
    log_metrics: bool = True,
) -> None:
    """Supervised fine-tuning of `model` on `examples` (each `(where, trajectory)`, read
    once) through its backend's `train_sft`; one `sft/` history row per batch at the step
    the call made (ART's: `sft/loss/train`, `sft/gradient_step` from 1), or none with
    `log_metrics=False` (ART 0.5.23's switch)."""
    backend = model.ledger.registered_backend(model.name, "train_sft")
    if isinstance(dev_config, dict):  # ART's dev.TrainSFTConfig is a dict
        dev_config = dev.TrainSFTConfig(**dev_config)
    config = config or TrainSFTConfig()
    started = time.monotonic()
    rows = await backend.train_sft(
        model,
        examples,
        config=config,
        dev_config=_with_assistant_turns(config, dev_config or dev.TrainSFTConfig()),
        verbose=verbose,
    )
    elapsed = time.monotonic() - started
    if not log_metrics:
        return
    step = await backend.get_step(model)
    for row in rows:
        await record(
            backend, model, [], SFT_METRIC_PREFIX, step, trainer_keys(SFT_METRIC_PREFIX, row)
        )
    if rows:
        # ART's summary of the call: the batches' mean under `train` at the new step.
        summary = _sft_summary(rows) | {"time/step_backend_train_s": elapsed}
        await record(backend, model, [], "train", step, summary, summary.keys())


def _sft_summary(rows: list[dict[str, float]]) -> dict[str, float]:
    """The mean of the batches' figures that ART's SFT trainers report (`loss/train`,
    `loss/grad_norm`, ...); our own (tokens, seconds) stay in the `sft/` rows."""
    named = [
        {
            k: v
            for k, v in row.items()
            if k in SFT_TRAINER_KEYS or k.split("/")[0] in METRIC_SECTIONS
        }
        for row in rows
    ]
    return trainer_keys("train", average_metric_samples(named))


async def record(
    backend: Backend[Any, Any],
    model: TrainedModel,
    groups: list[TrajectoryGroup],
    split: str,
    step: int,
    metrics: dict[str, float],
    user_keys: Collection[str] = (),
) -> None:
    """Store groups and a history row, then send the row to W&B where that is on.

    The row takes what the model's `MetricsBuilder` holds for `split` (the step's
    `costs/...` and their running totals), which starts the next step empty. W&B gets
    what ART sends it: the canonical keys and the user's own (`user_keys`, the row's
    keys that name the user's metrics); history.jsonl keeps every key.
    """
    ledger, store = model.ledger, model.state_store()
    await asyncio.to_thread(ledger.read_totals, store)  # a model logged unregistered
    metrics = metrics | await ledger.flush(split)
    if not groups and not metrics:
        return  # `model.log(metrics={})` with nothing held: no row, as in ART
    await backend.log(model, groups, split=split, step=step, metrics=metrics)
    await asyncio.to_thread(ledger.write_totals, store)  # totals continue after a restart
    observe.history_row(model, step, wandb_metrics(metrics, user_keys))


def _with_assistant_turns(
    config: TrainSFTConfig, dev_config: dev.TrainSFTConfig
) -> dev.TrainSFTConfig:
    """`dev_config` with `TrainSFTConfig.assistant_turns` in it, which the trainers read;
    the two set to different values is refused."""
    if "assistant_turns" in dev_config.model_fields_set:
        if dev_config.assistant_turns != config.assistant_turns:
            raise ConfigError(
                "config.assistant_turns",
                f"is {config.assistant_turns!r}, and _config.assistant_turns is "
                f"{dev_config.assistant_turns!r}",
                "Set it on art.TrainSFTConfig only",
            )
        return dev_config
    if config.assistant_turns == "all":  # the default: nothing to add
        return dev_config
    return dev_config.model_copy(update={"assistant_turns": config.assistant_turns})


def _with_accumulation(config: TrainConfig, dev_config: dev.TrainConfig) -> dev.TrainConfig:
    """`dev_config` with ART's `TrainConfig.grad_accumulation_sequences` in it; the same
    setting given two different values is refused."""
    wanted = config.grad_accumulation_sequences
    if wanted is None:
        return dev_config
    given = dev_config.gradient_accumulation_sequences
    if given is not None and given != wanted:
        raise ConfigError(
            "config.grad_accumulation_sequences",
            f"is {wanted}, and _config.gradient_accumulation_sequences is {given}",
            "Set one of them",
        )
    return dev_config.model_copy(update={"gradient_accumulation_sequences": wanted})


__all__ = ["StepResult", "TrainedModel", "record", "run_sft", "run_step"]
