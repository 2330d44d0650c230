"""`ServiceAPI`: what a LocalBackend calls on its model service, stated once.

`ModelService` implements it in this process; `art.runtime.process.ServiceProcess`
implements it by sending each call to a `ModelService` in a child process. The proxy is
the only place that serializes: in-process, groups and configs pass as the objects they
are. The calls are blocking (a backend runs them in a worker thread).
"""

from __future__ import annotations

from typing import Any, Protocol

from ...core.data import dev
from ...core.data.trajectories import TrajectoryGroup
from ...core.data.types import TrainConfig


class ServiceAPI(Protocol):
    """The model service's calls from a backend: register, train, fork, forget, close."""

    def register(self, record: dict[str, Any]) -> dict[str, str]:
        """Load (or reuse) the model `record` (model.json's fields) describes and serve it;
        returns its `base_url`, `api_key` and served `model_name`."""
        ...

    def train(
        self,
        project: str,
        name: str,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        dev_config: dev.TrainConfig,
    ) -> dict[str, float]:
        """One step on checked `groups` (the caller checks them: `check_trainable`), saved
        as the next checkpoint and served; returns the trainer's metrics."""
        ...

    def train_sft(
        self,
        project: str,
        name: str,
        spool: str,
        learning_rate: float | list[float],
        batch_size: int,
        dev_config: dev.TrainSFTConfig,
    ) -> list[dict[str, float]]:
        """Supervised fine-tuning on the examples spooled at `spool` (checked first), one
        step per batch, saved as the next checkpoint and served; each batch's metrics."""
        ...

    def continue_from_latest(self, project: str, name: str) -> int:
        """Train and serve on from the model's latest checkpoint, written from outside a
        step (a fork); returns that step."""
        ...

    def forget_deleted_checkpoints(self, project: str, name: str) -> None:
        """Stop serving checkpoints of the model whose directories were deleted."""
        ...

    def unload(self, project: str, name: str) -> None:
        """Stop serving and training the model: its adapter and checkpoints are unloaded;
        requests still waiting for it fail (`AdapterGone`)."""
        ...

    def engine_state(self) -> list[dict[str, Any]]:
        """Each loaded base model's engine now: `base_model`, `engine` (its class),
        `active_rows` (sequences being sampled), `kv_cache_bytes` (their keys and values)
        and `prefix_cache_bytes` (prompt prefixes kept between requests), the bytes those
        held in the service's process (0 for vLLM's and Ray replicas' own)."""
        ...

    def close(self) -> None:
        """Stop serving and training; stored files stay."""
        ...


__all__ = ["ServiceAPI"]
