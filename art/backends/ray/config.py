"""`RayConfig`: how many replicas and trainer workers, and what each one holds.

Checked twice: the fields when the config is made (a `ConfigError` naming the field), and
against the cluster before anything starts (`check_fits`), so a request the cluster can
never place fails at once with the field to change rather than hanging in Ray's queue.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from ...core.data.config_errors import ConfigModel
from ...core.data.errors import ConfigError

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class RayConfig(ConfigModel):
    """A Ray cluster's share of the work: inference replicas and a trainer group."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str | None = Field(
        default=None,
        description="The cluster to join (`ray.init(address=...)`, e.g. 'auto' or "
        "'ray://head:10001'); None: the cluster this process already joined, else a new "
        "local one.",
    )
    replicas: int = Field(default=2, ge=1, description="Inference replicas (Ray actors).")
    replica_cpus: float = Field(default=1.0, gt=0, description="CPUs reserved per replica.")
    replica_gpus: float = Field(
        default=0.0,
        ge=0,
        description="GPUs per replica; more than one runs vLLM with that tensor parallelism.",
    )
    trainer_workers: int = Field(
        default=1, ge=1, description="Data-parallel trainer workers (Ray actors)."
    )
    trainer_cpus: float = Field(default=1.0, gt=0, description="CPUs reserved per trainer worker.")
    trainer_gpus: float = Field(
        default=0.0,
        ge=0,
        description="GPUs per trainer worker: 0 trains on CPU with gloo, 1 on a GPU with NCCL.",
    )
    placement_strategy: PlacementStrategy = Field(
        default="PACK",
        description="Ray placement group strategy for the replicas and for the trainer group.",
    )
    ready_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long the placement groups may wait for their resources.",
    )

    def model_post_init(self, context: Any, /) -> None:
        if self.trainer_gpus not in (0.0, 1.0):
            raise ConfigError(
                "RayConfig.trainer_gpus",
                f"{self.trainer_gpus} GPUs per trainer worker is not supported",
                "Use 0 (CPU, gloo) or 1 (one GPU per worker, NCCL); add workers for more GPUs",
            )
        if self.replica_gpus > 1:  # refused here, before a trainer or a checkpoint exists
            raise ConfigError(
                "RayConfig.replica_gpus",
                f"{self.replica_gpus:g} GPUs per replica asks for tensor parallelism, which "
                "this version's replicas do not start yet",
                "Use replica_gpus <= 1 and more replicas",
            )

    @property
    def collective_backend(self) -> Literal["gloo", "nccl"]:
        """torch.distributed's backend for the trainer group."""
        return "nccl" if self.trainer_gpus else "gloo"

    def check_fits(self, nodes: list[dict[str, float]]) -> None:
        """Raise `ConfigError` naming the field if the cluster (each node's resources) cannot
        hold every replica and trainer worker; nothing has started yet."""
        for kind, cpus, gpus in (
            ("replica", self.replica_cpus, self.replica_gpus),
            ("trainer", self.trainer_cpus, self.trainer_gpus),
        ):
            if any(_holds(node, cpus, gpus) for node in nodes):
                continue
            gpus_short = gpus > 0 and not any(_holds(node, 0, gpus) for node in nodes)
            largest = max(nodes, key=lambda node: node.get("CPU", 0.0), default={})
            raise ConfigError(
                f"RayConfig.{kind}_{'gpus' if gpus_short else 'cpus'}",
                f"one {kind} needs {cpus:g} CPUs and {gpus:g} GPUs on one node, but the "
                f"largest node has {largest.get('CPU', 0.0):g} CPUs and "
                f"{largest.get('GPU', 0.0):g} GPUs",
                f"Lower {kind}_cpus/{kind}_gpus, or add a larger node to the cluster",
            )
        total_cpus = sum(node.get("CPU", 0.0) for node in nodes)
        total_gpus = sum(node.get("GPU", 0.0) for node in nodes)
        need_cpus = self.replicas * self.replica_cpus + self.trainer_workers * self.trainer_cpus
        need_gpus = self.replicas * self.replica_gpus + self.trainer_workers * self.trainer_gpus
        if need_cpus > total_cpus or need_gpus > total_gpus:
            raise ConfigError(
                "RayConfig.replicas",
                f"{self.replicas} replicas and {self.trainer_workers} trainer workers need "
                f"{need_cpus:g} CPUs and {need_gpus:g} GPUs; the cluster has {total_cpus:g} "
                f"CPUs and {total_gpus:g} GPUs",
                "Lower replicas or trainer_workers (or their cpus/gpus), or grow the cluster",
            )


def _holds(node: dict[str, float], cpus: float, gpus: float) -> bool:
    return node.get("CPU", 0.0) >= cpus and node.get("GPU", 0.0) >= gpus


__all__ = ["PlacementStrategy", "RayConfig"]
