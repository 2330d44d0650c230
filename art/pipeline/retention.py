"""Which checkpoints a `PipelineTrainer` keeps: ART's retention strategies.

Every `checkpoint_retention_interval` steps the trainer lists the model's checkpoints,
sets aside the ones it still needs (the newest, those rollouts may still sample from,
those waiting for their evaluation) and asks the strategy which of the others to keep;
the rest are deleted. A strategy is any callable from a `CheckpointRetentionContext` to
the steps to keep; `keep_recent_and_top` is ART's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from pydantic import BaseModel, Field

from ..core.data.errors import ArtValueError
from ..core.store.model_store import ModelStore

CHECKPOINT_CREATED_AT_METRIC = "checkpoint/created_at_unix"
CHECKPOINT_EVAL_COMPLETED_METRIC = "checkpoint/eval_completed"
CHECKPOINT_SAVED_METRIC = "checkpoint/saved"


class CheckpointInfo(BaseModel):
    """One checkpoint a strategy may keep or let go: its step's history metrics averaged
    (`val/reward`, ...), and whether it was evaluated (a `val/` or `test/` metric)."""

    step: int
    path: str
    created_at: datetime
    is_eval_step: bool = False
    metrics: dict[str, float] = Field(default_factory=dict)


class CheckpointRetentionContext(BaseModel):
    """What a strategy decides on: the step just trained, and the checkpoints it may drop."""

    current_step: int
    checkpoints: list[CheckpointInfo] = Field(default_factory=list)


CheckpointRetentionStrategy = Callable[[CheckpointRetentionContext], Iterable[int]]


def keep_recent_and_top(
    *, recent: int = 5, top: int = 2, metric: str = "val/reward"
) -> CheckpointRetentionStrategy:
    """Keep the `recent` newest checkpoints, and the `top` best on `metric` (a later step
    first on a tie; checkpoints without the metric are not ranked)."""
    for name, value in (("recent", recent), ("top", top)):
        if value < 0:
            raise ArtValueError(name, f"is {value}", "Use 0 or more")

    def strategy(context: CheckpointRetentionContext) -> set[int]:
        by_step = sorted(context.checkpoints, key=lambda c: c.step)
        keep = {c.step for c in by_step[-recent:]} if recent else set()
        ranked = sorted(
            (c for c in by_step if metric in c.metrics),
            key=lambda c: (c.metrics[metric], c.step),
            reverse=True,
        )
        keep.update(c.step for c in ranked[:top])
        return keep

    return strategy


def eligible_checkpoints(store: ModelStore, protected: set[int]) -> list[CheckpointInfo]:
    """The model's checkpoints outside `protected`, with their steps' history metrics."""
    sums: dict[int, dict[str, list[float]]] = {}
    for row in store.read_history():
        step = row.get("step")
        if not isinstance(step, int):
            continue
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                sums.setdefault(step, {}).setdefault(key, []).append(float(value))
    infos = []
    for step in store.checkpoint_steps():
        if step in protected:
            continue
        metrics = {key: sum(v) / len(v) for key, v in sums.get(step, {}).items()}
        path = store.checkpoint_dir(step)
        created = metrics.get(CHECKPOINT_CREATED_AT_METRIC, path.stat().st_ctime)
        infos.append(
            CheckpointInfo(
                step=step,
                path=str(path),
                created_at=datetime.fromtimestamp(created, UTC),
                is_eval_step=bool(metrics.get(CHECKPOINT_EVAL_COMPLETED_METRIC))
                or any(key.startswith(("val/", "test/")) for key in metrics),
                metrics=metrics,
            )
        )
    return infos


__all__ = [
    "CHECKPOINT_CREATED_AT_METRIC",
    "CHECKPOINT_EVAL_COMPLETED_METRIC",
    "CHECKPOINT_SAVED_METRIC",
    "CheckpointInfo",
    "CheckpointRetentionContext",
    "CheckpointRetentionStrategy",
    "eligible_checkpoints",
    "keep_recent_and_top",
]
