"""ART's `art.pipeline_trainer.state` import path: what a PipelineTrainer keeps between
runs (here in `<model dir>/pipeline_state.json`)."""

from ..pipeline._state import PipelineState

__all__ = ["PipelineState"]
