"""ART's `art.metrics_taxonomy` import path."""

from .core.metrics_taxonomy import (
    SFT_GRADIENT_STEP_KEY,
    SFT_METRIC_PREFIX,
    SFT_WANDB_GRADIENT_STEP_KEY,
    TRAIN_GRADIENT_STEPS_KEY,
    TrajectoryBatchSummary,
    average_metric_samples,
    build_data_metrics_from_summary,
    build_training_summary_metrics,
    summarize_trajectory_groups,
)

__all__ = [
    "SFT_GRADIENT_STEP_KEY",
    "SFT_METRIC_PREFIX",
    "SFT_WANDB_GRADIENT_STEP_KEY",
    "TRAIN_GRADIENT_STEPS_KEY",
    "TrajectoryBatchSummary",
    "average_metric_samples",
    "build_data_metrics_from_summary",
    "build_training_summary_metrics",
    "summarize_trajectory_groups",
]
