"""Where a model service runs its engine and trainer: this process, or elsewhere.

`ModelService` loads the base model, keeps the store and serves the OpenAI front. By
default it samples with an engine and trains with a `PeftTrainer` on the model it loaded.
A `Placement` puts both elsewhere: `art.backends.ray.RayPlacement` runs replicas of the
engine and a data-parallel trainer group on a Ray cluster. The service publishes every
checkpoint to the engine it is given, and trains through the `Trainer` it is given, so the
storage and publication rules stay in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...core.data import dev
from ...core.data.trajectories import Trajectory, TrajectoryGroup
from ...core.data.types import TrainConfig
from ..chat_format import ChatRendering
from ..engines.base import Engine, EngineSpec
from ..models import ResolvedModel


class Trainer(Protocol):
    """Takes the training steps of one trainable model (a `PeftTrainer` is one)."""

    def step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]: ...

    def sft_step(
        self,
        trajectories: list[Trajectory],
        learning_rate: float,
        dev_config: dev.TrainSFTConfig,
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]:
        """One supervised optimizer step on the assistant turns of `trajectories`."""
        ...

    def save(self, directory: Path) -> None:
        """Write the adapter and optimizer state into `directory`."""
        ...

    def restore(self, directory: Path) -> None:
        """Set the adapter and optimizer back to the checkpoint in `directory`."""
        ...

    def close(self) -> None:
        """Free what the trainer holds outside the training model (a process, a group)."""
        ...


@dataclass(frozen=True)
class TrainerSpec:
    """What a trainer for one trainable model needs to start."""

    resolved: ResolvedModel
    config: dev.InternalModelConfig
    adapter: str  # the adapter's name, as the service's engine knows it
    start_from: Path | None  # the checkpoint to resume from; None: a fresh adapter
    latest_checkpoint: Callable[[], Path]  # where to restart from after a failure


class Placement(Protocol):
    """Starts engines and trainers somewhere other than the service's own process."""

    def start_engine(self, spec: EngineSpec) -> Engine: ...

    def start_trainer(self, spec: TrainerSpec) -> Trainer: ...

    def close(self) -> None: ...


__all__ = ["Placement", "Trainer", "TrainerSpec"]
