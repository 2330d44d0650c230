"""PipelineTrainer's hook to `art.pipeline_tuner`: checks `autotune=`, measures each step.

The tuner owns the concurrency settings when it is on, so hand-set sizes are refused
beside it (ART's rule). `StepMeter` adds up what the tuner reads per step: how long the
trainer waited for its batch, the rollouts' seconds and their seconds waiting for queue room.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..core.data.errors import ConfigError
from ..pipeline_tuner.attachment import PipelineAutotunerAttachment
from ..pipeline_tuner.autotune import DECISION_METRIC
from ..pipeline_tuner.config import PipelineAutotuneConfig, PipelineMetric

_SIZE_DEFAULTS = {"num_rollout_workers": 16, "min_batch_size": 4}


def autotune_attachment(
    autotune: object | None, **sizes: int | None
) -> PipelineAutotunerAttachment | None:
    """The attachment for `autotune=` (None when off); a size in `sizes` set away from
    PipelineTrainer's default is refused beside a tuner."""
    if autotune is None:
        return None
    if not isinstance(autotune, PipelineAutotuneConfig):
        raise ConfigError(
            "autotune",
            f"is a {type(autotune).__name__}",
            "Pass art.pipeline_tuner.PipelineAutotuneConfig(mode='online') or leave it None",
        )
    if autotune.mode == "off":
        return None
    for name, value in sizes.items():
        if value is not None and value != _SIZE_DEFAULTS.get(name):
            raise ConfigError(
                name,
                f"is {value}, but autotune mode={autotune.mode!r} owns the pipeline's settings",
                f"Leave {name} unset, or use autotune=None",
            )
    return PipelineAutotunerAttachment(autotune)


@dataclass
class StepMeter:
    """Seconds added up by the rollout workers, read as deltas once per step."""

    rollout_s: float = 0.0
    put_wait_s: float = 0.0
    _reported: tuple[float, float] = (0.0, 0.0)

    def step_metrics(
        self, *, wall_s: float, collect_s: float, trained: int, stale: int, no_variance: int
    ) -> dict[str, float]:
        rollout_s = self.rollout_s - self._reported[0]
        put_wait_s = self.put_wait_s - self._reported[1]
        self._reported = (self.rollout_s, self.put_wait_s)
        return {
            "time/step_wall_s": wall_s,
            "time/step_collect_batch_s": collect_s,
            "time/step_rollout_s": rollout_s,
            "queue/put_wait_s": put_wait_s,
            "data/step_num_groups_trainable": float(trained),
            "discarded/step/stale_groups": float(stale),
            "discarded/step/zero_variance_groups": float(no_variance),
        }


async def report_step(
    attachment: PipelineAutotunerAttachment, step: int, metrics: dict[str, float], score: float
) -> None:
    """Give the tuner one step's metrics, then the score that closes the step."""
    now = time.monotonic()
    for name, value in {**metrics, DECISION_METRIC: score}.items():
        await attachment.on_metric(PipelineMetric(name=name, value=value, t_s=now, step=step))


__all__ = ["StepMeter", "autotune_attachment", "report_step"]
