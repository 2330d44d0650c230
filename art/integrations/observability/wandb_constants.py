"""Constant baselines in W&B: the same metrics at every step, drawn as flat reference lines."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...core.data.errors import ConfigError

if TYPE_CHECKING:
    from ...core.model import Model


async def log_constant_metrics_wandb(
    model: Model,
    num_steps: int,
    split_metrics: Mapping[str, Mapping[str, float]],
    logged_run_name: str | None = None,
) -> None:
    """Log `split_metrics` at every step 0..num_steps in a new W&B run of the model's
    entity and project, as `<split>/<metric>`, so a baseline (a prompted model's score)
    shows as a horizontal line beside trained models' curves.

    Args:
        model: the run's entity and project are the model's; its name is the run's name.
        num_steps: the last step logged (the training run's length).
        split_metrics: e.g. `{"val": {"reward": 0.4, "accuracy": 0.8}}`.
        logged_run_name: the run's name instead of the model's.

    Needs wandb (`pip install 'art-grpo[wandb]'`) and a W&B key, or `WANDB_MODE=offline`
    for a local run to `wandb sync` later. W&B's blocking calls run in a worker thread.
    """
    if num_steps < 0:
        raise ConfigError("num_steps", f"{num_steps} is negative", "Pass the last step, 0 or more")
    prefixed = {
        f"{split}/{key}": float(value)
        for split, metrics in split_metrics.items()
        for key, value in metrics.items()
    }
    if not prefixed:
        raise ConfigError("split_metrics", "holds no metrics", "Pass e.g. {'val': {'reward': 0.4}}")
    await asyncio.to_thread(
        _log, model.entity, model.project, logged_run_name or model.name, num_steps, prefixed
    )


def _log(
    entity: str | None, project: str, name: str, num_steps: int, metrics: dict[str, float]
) -> None:
    import wandb

    run = wandb.init(entity=entity, project=project, name=name, reinit="create_new")
    try:
        for step in range(num_steps + 1):
            run.log(metrics, step=step)
    finally:
        run.finish()


__all__ = ["log_constant_metrics_wandb"]
