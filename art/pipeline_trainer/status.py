"""ART's `art.pipeline_trainer.status` import path."""

from ..pipeline.status import StatusReporter

__all__ = ["StatusReporter"]
