"""`RayPlacement`: the model service's engines and trainers on a Ray cluster.

It joins the cluster (`RayConfig.address`, or the one this process already joined, or a
new local one), checks that the cluster can hold what the config asks before starting
anything, and reserves resources with placement groups: one for an engine's replicas,
one for a model's trainer group (gang-scheduled, so a group never starts half-placed).
"""

from __future__ import annotations

from typing import Any

from ...core.data.errors import BackendError, ConfigError
from ...runtime.engines.base import EngineSpec
from ...runtime.engines.structured import Grammars
from ...runtime.service.placement import TrainerSpec
from .config import RayConfig
from .replica import Replica
from .router import ReplicaRouter
from .trainer_group import TrainerGroup, TrainerWorker


class RayPlacement:
    """Starts `ReplicaRouter`s and `TrainerGroup`s on the cluster `config` names."""

    def __init__(self, config: RayConfig) -> None:
        import ray

        self.config = config
        if ray.is_initialized():
            if config.address is not None:
                raise ConfigError(
                    "RayConfig.address",
                    f"this process already joined a Ray cluster, so {config.address!r} "
                    "cannot be joined too",
                    "Leave address unset to use the joined cluster, or ray.shutdown() first",
                )
        else:
            ray.init(address=config.address, include_dashboard=False)
        nodes = [
            {key: float(value) for key, value in node["Resources"].items()}
            for node in ray.nodes()  # type: ignore[no-untyped-call]
            if node.get("Alive")
        ]
        config.check_fits(nodes)
        self.routers: list[ReplicaRouter] = []
        self.trainer_groups: list[TrainerGroup] = []
        self._placement_groups: list[Any] = []

    def start_engine(self, spec: EngineSpec) -> ReplicaRouter:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        config = self.config
        group = self._placement_group(config.replicas, config.replica_cpus, config.replica_gpus)
        actor = ray.remote(Replica)
        config_json = spec.config.model_dump(mode="json")

        def start_replica(index: int) -> Any:
            handle = actor.options(
                num_cpus=config.replica_cpus,
                num_gpus=config.replica_gpus,
                max_restarts=0,  # the router restarts it, and reloads its adapters first
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=index
                ),
            ).remote(
                index,
                spec.resolved,
                config_json,
                spec.dtype,
                spec.context_length,
                spec.stop_token_ids,
                str(spec.log_dir / f"ray-replica-{spec.index}-{index}"),  # per base, per replica
            )
            ray.get(handle.status.remote())  # type: ignore[attr-defined]  # loaded, or its error raised here
            return handle

        router = ReplicaRouter(
            start_replica,
            config.replicas,
            Grammars(spec.tokenizer, set(spec.stop_token_ids)),
        )
        self.routers.append(router)
        return router

    def start_trainer(self, spec: TrainerSpec) -> TrainerGroup:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        config = self.config
        group = self._placement_group(
            config.trainer_workers, config.trainer_cpus, config.trainer_gpus
        )
        actor = ray.remote(TrainerWorker)
        config_json = spec.config.model_dump(mode="json")

        def start_worker(rank: int, start_from: str | None) -> Any:
            return actor.options(
                num_cpus=config.trainer_cpus,
                num_gpus=config.trainer_gpus,
                max_restarts=0,  # a dead worker fails the step; the group restarts whole
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group, placement_group_bundle_index=rank
                ),
            ).remote(
                rank,
                config.trainer_workers,
                spec.resolved,
                config_json,
                spec.adapter,
                start_from,
                config.collective_backend,
            )

        trainer = TrainerGroup(spec, config.trainer_workers, start_worker)
        self.trainer_groups.append(trainer)
        return trainer

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for router in self.routers:
            router.close()
        for trainer in self.trainer_groups:
            trainer.close()
        for group in self._placement_groups:
            remove_placement_group(group)
        self._placement_groups.clear()

    def _placement_group(self, count: int, cpus: float, gpus: float) -> Any:
        from ray.util.placement_group import placement_group, remove_placement_group

        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
        group = placement_group(
            [dict(bundle) for _ in range(count)], self.config.placement_strategy
        )
        if not group.wait(timeout_seconds=self.config.ready_timeout_s):
            remove_placement_group(group)
            raise BackendError(
                f"the Ray cluster did not grant {count} x {bundle} "
                f"({self.config.placement_strategy}) within {self.config.ready_timeout_s:g} s: "
                "other work holds the resources. Free them, grow the cluster, or raise "
                "RayConfig.ready_timeout_s"
            )
        self._placement_groups.append(group)
        return group


__all__ = ["RayPlacement"]
