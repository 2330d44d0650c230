"""ART's `art.pipeline_trainer.trainer` import path."""

from typing import Any

from .._refusals import refused_name
from ..pipeline.trainer import PipelineTrainer, make_group_rollout_fn


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["PipelineTrainer", "make_group_rollout_fn"]
