"""ART's `art.pipeline_trainer.types` import path."""

from ..pipeline._types import (
    ConfigT,
    EvalFn,
    RolloutFn,
    ScalarMetadataValue,
    ScenarioT,
    SingleRolloutFn,
)

__all__ = ["ConfigT", "EvalFn", "RolloutFn", "ScalarMetadataValue", "ScenarioT", "SingleRolloutFn"]
