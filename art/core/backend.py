"""The `Backend` protocol: what a model needs from wherever it is served and trained.

`LocalBackend`, `ServerlessBackend` and `SkyPilotBackend` all implement it; client code
calls these methods (mostly through the model) and never checks which backend it has.

The protocol is generic in the two model types its methods take, so that it need not
import `art.core.model`, which holds and calls a backend: every backend of ours is a
`Backend[Model, TrainableModel]`, and `Backend` alone takes models of any type.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from .data import dev
from .data.trajectories import Trajectory, TrajectoryGroup
from .data.types import TrainConfig, TrainResult, TrainSFTConfig

# The model types a backend's methods take (`Model`, `TrainableModel` for ours).
ModelT = TypeVar("ModelT", contravariant=True)
TrainableModelT = TypeVar("TrainableModelT", contravariant=True)


class InferenceEndpoint(BaseModel):
    """Where a registered model answers OpenAI-compatible chat completions.

    `model_name` is the `model` value the endpoint routes to this model, where it differs
    from the model's name (LocalBackend serves `project/name`). `http_transport` (an
    async transport of the OpenAI SDK's HTTP library, `openai_http()`: httpx2's from SDK 3
    on), where a backend gives one, carries the model's OpenAI
    client's requests: LocalBackend's names a dead service process.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    base_url: str
    api_key: str
    # The `model` name of the latest checkpoint (None: the model's own name), and what
    # joins it to a step for an older one: `name@3`, or W&B's `...:step3`.
    model_name: str | None = None
    step_separator: str = "@"
    http_transport: Any = Field(default=None, exclude=True)


@runtime_checkable
class Backend(Protocol[ModelT, TrainableModelT]):
    """Where a model is served and trained: what `Model` and `TrainableModel` call.

    `LocalBackend`, `RayBackend`, `ServerlessBackend` and `SkyPilotBackend` implement it;
    client code calls these methods (mostly through the model) and never checks which
    backend it has. `train` is ART 0.5.18's `backend.train`: it trains and does not log.
    """

    async def register(self, model: ModelT) -> InferenceEndpoint | None:
        """Set up storage (and, for a trainable model, serving) for `model`.

        Returns the endpoint the model is served at, or None where this backend does
        not serve it (a plain `art.Model` keeps the endpoint it was given).
        """
        ...

    async def get_step(self, model: ModelT) -> int:
        """The model's current training step: its latest checkpoint, 0 before training."""
        ...

    async def log(
        self,
        model: ModelT,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        """Store checked `groups` (if any) and a history row of `metrics` (if any)."""
        ...

    async def train(
        self, model: TrainableModelT, trajectory_groups: Iterable[TrajectoryGroup]
    ) -> TrainResult:
        """ART's training call: one step on `trajectory_groups`, nothing logged.

        Each backend takes ART's keywords for it (`art.core.data.train_options`), honoured or
        refused by name; the result holds the step after training and its metrics.
        """
        ...

    async def train_step(
        self,
        model: TrainableModelT,
        groups: list[TrajectoryGroup],
        *,
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        verbose: bool,
    ) -> dict[str, float]:
        """Take one training step on checked `groups`, save and serve the new checkpoint.

        Returns the trainer's metrics (loss, grad_norm, ...). With `verbose`, the backend
        prints what it does (the step it trains, the checkpoint it saves or the job it
        follows). The one step every caller runs (`art.core.training.run_step`:
        `model.train`, `train`, PipelineTrainer) checks the groups and comes here.
        """
        ...

    async def train_sft(
        self,
        model: TrainableModelT,
        examples: Iterator[tuple[str, Trajectory]],
        *,
        config: TrainSFTConfig,
        dev_config: dev.TrainSFTConfig,
        verbose: bool,
    ) -> list[dict[str, float]]:
        """Supervised fine-tuning on `examples` (each `(where, trajectory)`, read once),
        saved as one new checkpoint and served; returns each batch's metrics.

        Every example is checked before any step runs; bad ones raise `SFTDataError`
        naming each by its `where`, with nothing trained or written. `model.train_sft`
        and `art.utils.sft` come here through `art.core.training.run_sft`, which logs.
        """
        ...

    async def delete_checkpoints(
        self, model: ModelT, *, best_checkpoint_metric: str
    ) -> list[int] | None:
        """Delete all checkpoints but the latest and the best; return the deleted steps
        (None where the backend does not say: one of ART's protocol)."""
        ...

    async def close(self) -> None:
        """Release whatever the backend holds (processes, servers, files)."""
        ...
