"""ART's `art.utils.benchmarking.log_constant_metrics_wandb` import path
(`art.integrations.observability.wandb_constants`)."""

from ...integrations.observability.wandb_constants import log_constant_metrics_wandb

__all__ = ["log_constant_metrics_wandb"]
