"""ART 0.5.23's pipeline tuner: PipelineTrainer tunes its own concurrency while it runs.

`PipelineTrainer(..., autotune=PipelineAutotuneConfig(mode="online"))` starts from
settings derived from the machine (or a saved profile), measures each window of training
steps (how long the trainer waits for its batch, queue backpressure, stale groups, and
inference pressure where an engine gauge is fed), moves the number of rollout workers and
`min_batch_size`, and saves what it learned under the model's directory
(`art.pipeline_tuner.store`). `mode="profile"` starts from a saved profile without tuning.
"""

from __future__ import annotations

from .attachment import PipelineAutotunerAttachment
from .config import (
    PackedGroupObservation,
    PackedGroupShape,
    PackingLeafShape,
    PipelineAutotuneConfig,
    PipelineAutotunerProfile,
    PipelineMetric,
    PipelineRuntimeConfig,
    PipelineTuneSettings,
)
from .worker_controller import RolloutWorkerController

__all__ = [
    "PackedGroupObservation",
    "PackedGroupShape",
    "PackingLeafShape",
    "PipelineAutotuneConfig",
    "PipelineAutotunerAttachment",
    "PipelineAutotunerProfile",
    "PipelineMetric",
    "PipelineRuntimeConfig",
    "PipelineTuneSettings",
    "RolloutWorkerController",
]
