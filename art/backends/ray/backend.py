"""`RayBackend`: LocalBackend's storage and OpenAI front, its engines and trainer on Ray.

    backend = RayBackend(config=RayConfig(address="auto", replicas=4, trainer_workers=2))

The rest of a training script is unchanged: models register, rollouts call
`model.openai_client()`, `model.train(groups)` trains. The storage directory (`path`)
must be one the trainer workers can write (shared storage on a multi-node cluster):
rank 0 writes each checkpoint where this process's service put its temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Unpack

from ...core import dev
from ...core.backend import InferenceEndpoint
from ...core.model import Model, TrainableModel
from ...core.train_options import LocalTrainKeywords
from ...core.trajectories import Trajectory, TrajectoryGroup
from ...core.types import LocalTrainResult, TrainConfig, TrainSFTConfig
from ..local.backend import LocalBackend
from .config import RayConfig

if TYPE_CHECKING:
    from .placement import RayPlacement


class RayBackend:
    """Serves, trains and stores models with N inference replicas and M trainer workers.

    Args:
        config: the cluster and what runs on it (`RayConfig`).
        path: where models, checkpoints and trajectory logs are stored.
    """

    def __init__(
        self, *, config: RayConfig | None = None, path: str | os.PathLike[str] = "./.art"
    ) -> None:
        self.config = config if config is not None else RayConfig()
        self.path = os.fspath(path)
        self.placement: RayPlacement | None = None
        self._local = LocalBackend(in_process=True, path=path, placement=self._place)

    def _place(self) -> RayPlacement:
        from .placement import RayPlacement

        self.placement = RayPlacement(self.config)
        return self.placement

    def __repr__(self) -> str:
        return f"RayBackend(path={self.path!r}, config={self.config!r})"

    async def register(self, model: Model) -> InferenceEndpoint | None:
        return await self._local.register(model)

    async def get_step(self, model: Model) -> int:
        return await self._local.get_step(model)

    def _supports_concurrent_training_and_inference(self, model: TrainableModel) -> bool:
        """Always: the replicas serve while the trainer group trains, and the router never
        pauses them (PipelineTrainer asks)."""
        return True

    async def log(
        self,
        model: Model,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        await self._local.log(model, groups, split=split, step=step, metrics=metrics)

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        **keywords: Unpack[LocalTrainKeywords],
    ) -> LocalTrainResult:
        """One training step (ART 0.5.18's call), as `LocalBackend.train`; nothing is logged."""
        return await self._local.train(model, trajectory_groups, **keywords)

    async def train_step(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        *,
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        verbose: bool,
    ) -> dict[str, float]:
        return await self._local.train_step(
            model, groups, config=config, dev_config=dev_config, verbose=verbose
        )

    async def train_sft(
        self,
        model: TrainableModel,
        examples: Iterator[tuple[str, Trajectory]],
        *,
        config: TrainSFTConfig,
        dev_config: dev.TrainSFTConfig,
        verbose: bool,
    ) -> list[dict[str, float]]:
        """Supervised fine-tuning as `LocalBackend`'s, each batch split over the trainer
        group's workers as a step's groups are."""
        return await self._local.train_sft(
            model, examples, config=config, dev_config=dev_config, verbose=verbose
        )

    async def _experimental_fork_checkpoint(
        self, model: Model, from_model: str, **options: Any
    ) -> None:
        """As `LocalBackend._experimental_fork_checkpoint`."""
        await self._local._experimental_fork_checkpoint(model, from_model, **options)

    async def _delete_checkpoint_files(self, model: Model, steps_to_keep: list[int]) -> list[int]:
        """As `LocalBackend._delete_checkpoint_files`."""
        return await self._local._delete_checkpoint_files(model, steps_to_keep)

    async def delete_checkpoints(self, model: Model, *, best_checkpoint_metric: str) -> list[int]:
        return await self._local.delete_checkpoints(
            model, best_checkpoint_metric=best_checkpoint_metric
        )

    def status(self) -> dict[str, Any]:
        """Each engine's replicas (`Replica.status()`, None while restarting), the replica
        failures reported, and the restarts done."""
        if self.placement is None:
            return {"engines": [], "failures": [], "restarts": 0}
        routers = self.placement.routers
        return {
            "engines": [router.status() for router in routers],
            "failures": [line for router in routers for line in router.failures],
            "restarts": sum(router.restarts for router in routers),
        }

    async def close(self) -> None:
        """Stop the replicas and trainer workers; stored files stay."""
        await self._local.close()

    async def __aenter__(self) -> RayBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


__all__ = ["RayBackend"]
