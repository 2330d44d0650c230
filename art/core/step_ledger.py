"""What a model carries from one step to the next, beside its checkpoints.

A `StepLedger` holds the backend the model was registered with (ours, or the wrapper
that drives a third party's backend by ART's protocol), the metrics builder whose costs
and running totals go into each history row, and when the model's last training step
ended (the next step's `rollout_seconds`). The running totals are also kept in the
model's `state.json` under ART's key, so a new process continues them.

`Model.ledger` is the seam between a model and `art.core.training`, which records its
steps: what training needs of a model beyond ART's public API is here, not in the
model's private attributes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .backend import Backend
from .data.errors import ModelNotRegisteredError
from .metrics.metrics_builder import MetricsBuilder
from .store.model_store import METRICS_BUILDER_STATE_KEY, ModelStore

# Serializes state.json writes in this process (a lock per model would not pickle).
_STATE_WRITES = threading.Lock()


class StepLedger:
    """One model's backend, metrics builder and step timing (see the module docstring)."""

    def __init__(self) -> None:
        self.backend: Backend[Any, Any] | None = None
        self.builder = MetricsBuilder(cost_context="train")
        self.last_step_end: float | None = None
        self._totals_read = False

    def registered_backend(self, model_name: str, action: str) -> Backend[Any, Any]:
        """The backend, or `ModelNotRegisteredError` saying the model cannot `action` yet."""
        if self.backend is None:
            raise ModelNotRegisteredError(model_name, action)
        return self.backend

    def builder_for_split(self, split: str) -> MetricsBuilder:
        """The builder's view whose metrics go into `split`'s history rows."""
        # ART's mapping: the validation and test splits share the `eval` context.
        context = "eval" if split in ("val", "test") else split
        return self.builder.for_cost_context(context, buffer_scope=context)

    async def flush(self, split: str) -> dict[str, float]:
        """The builder's metrics for `split`'s next history row (costs and their
        running totals under ART's `costs/...` names), emptied for the next step."""
        return await self.builder_for_split(split).flush()

    def read_totals(self, store: ModelStore) -> None:
        """Continue the running totals (`costs/cum/...`) stored with the model by an
        earlier process, as ART does; once per ledger, and only into a builder that has
        no totals of its own yet."""
        if self._totals_read:
            return
        self._totals_read = True
        saved = store.read_state().get(METRICS_BUILDER_STATE_KEY)
        if isinstance(saved, dict):
            self.builder.continue_totals(saved)

    def write_totals(self, store: ModelStore) -> None:
        """Store the builder's running totals under ART's key of the model's `state.json`."""
        with _STATE_WRITES:  # the snapshot and its write together: the newest one wins
            store.merge_state({METRICS_BUILDER_STATE_KEY: self.builder.state_dict()})

    def step_ended(self, started: float) -> float | None:
        """Mark a training step (begun at monotonic time `started`) ended; the seconds
        between the previous step's end and `started` (the rollouts'), None for the first."""
        rollout_seconds = None if self.last_step_end is None else started - self.last_step_end
        self.last_step_end = time.monotonic()
        return rollout_seconds


__all__ = ["StepLedger"]
