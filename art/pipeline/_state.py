"""What a PipelineTrainer keeps between runs, beside the model's checkpoints.

The checkpoints are the truth about the step (a crash loses none: each is written whole
and renamed into place); this file adds how far the scenario iterator got and the counts
of dropped groups, rewritten atomically after every step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..core.store.atomic import write_text_atomic

STATE_FILE = "pipeline_state.json"


@dataclass
class PipelineState:
    training_step: int = 0  # the model's step when this was written
    scenario_offset: int = 0  # scenarios taken from the iterator, over all runs
    groups_trained: int = 0
    groups_dropped_stale: int = 0
    groups_dropped_no_variance: int = 0
    completed_eval_steps: list[int] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> PipelineState:
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        return cls(**known)

    def write(self, path: Path) -> None:
        write_text_atomic(path, json.dumps(asdict(self), indent=2))


__all__ = ["STATE_FILE", "PipelineState"]
