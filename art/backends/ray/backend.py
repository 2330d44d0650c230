"""`RayBackend`: LocalBackend's storage and OpenAI front, its engines and trainer on Ray.

    backend = RayBackend(config=RayConfig(address="auto", replicas=4, trainer_workers=2))

The rest of a training script is unchanged: models register, rollouts call
`model.openai_client()`, `model.train(groups)` trains. The storage directory (`path`)
must be one the trainer workers can write (shared storage on a multi-node cluster):
rank 0 writes each checkpoint where this process's service put its temporary directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from ...core.model import TrainableModel
from ..local.backend import LocalBackend
from .config import RayConfig

if TYPE_CHECKING:
    from .placement import RayPlacement


P = ParamSpec("P")
R = TypeVar("R")


class _OfLocal(Generic[P, R]):
    """A `LocalBackend` method that `RayBackend` offers as its own, called on the
    LocalBackend it holds: the delegation declared once, with the method's signature."""

    def __init__(self, method: Callable[Concatenate[LocalBackend, P], R]) -> None:
        self._method = method
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, backend: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, backend: RayBackend, owner: type[Any] | None = None) -> Callable[P, R]: ...

    def __get__(
        self, backend: RayBackend | None, owner: type[Any] | None = None
    ) -> Self | Callable[P, R]:
        if backend is None:
            return self
        bound: Callable[P, R] = MethodType(self._method, backend._local)
        return bound


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

    # The Backend protocol and ART's extras, as LocalBackend's: its service runs the
    # engines and trainers on the cluster (`RayPlacement`), so each call is its call.
    register = _OfLocal(LocalBackend.register)
    get_step = _OfLocal(LocalBackend.get_step)
    log = _OfLocal(LocalBackend.log)
    train = _OfLocal(LocalBackend.train)
    train_step = _OfLocal(LocalBackend.train_step)
    train_sft = _OfLocal(LocalBackend.train_sft)  # each batch split over the trainer group
    delete_checkpoints = _OfLocal(LocalBackend.delete_checkpoints)
    close = _OfLocal(LocalBackend.close)
    _experimental_fork_checkpoint = _OfLocal(LocalBackend._experimental_fork_checkpoint)
    _delete_checkpoint_files = _OfLocal(LocalBackend._delete_checkpoint_files)

    def _supports_concurrent_training_and_inference(self, model: TrainableModel) -> bool:
        """Always: the replicas serve while the trainer group trains, and the router never
        pauses them (PipelineTrainer asks)."""
        return True

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

    async def __aenter__(self) -> RayBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


__all__ = ["RayBackend"]
