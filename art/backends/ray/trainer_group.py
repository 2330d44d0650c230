"""A data-parallel trainer group: M `TrainerWorker` actors training one LoRA adapter.

Each worker holds the base model and the same adapter (loaded from the same checkpoint,
or drawn from the same seed), and takes its share of a step's groups (worker r takes
groups r, r+M, ...). Group-relative advantages need only a group, so a share trains on
its own; torch.distributed (gloo on CPU, NCCL on GPU) then sums what makes the step one
step: the token count that weights every micro-batch, the gradients before clipping, the
additive metrics (`PeftTrainer`'s `StepSync`). Every worker thus takes the same optimizer
step, which is the single-worker step up to the order of floating-point sums.

Rank 0 saves. A worker that dies (or fails) fails the step with a `TrainingError`: the
group is stopped before anything is saved, so the last checkpoint stays as it was, and
the next step starts a new group from that checkpoint.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...core.data import dev
from ...core.data.errors import TrainingError
from ...core.data.trajectories import Trajectory, TrajectoryGroup
from ...core.data.types import TrainConfig
from ...runtime import models
from ...runtime.chat_format import ChatRendering
from ...runtime.service.placement import TrainerSpec

_COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


class TrainerWorker:
    """One rank of the group (`ray.remote(TrainerWorker)`): a `PeftTrainer` on its share."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        resolved: models.ResolvedModel,
        config_json: dict[str, Any],
        adapter: str,
        start_from: str | None,
        collective_backend: str,
    ) -> None:
        import torch

        from ...runtime.trainer.peft_trainer import PeftTrainer, add_adapter

        self.rank = rank
        self.world_size = world_size
        self.collective_backend = collective_backend
        config = dev.InternalModelConfig(**config_json)
        device = "cuda" if collective_backend == "nccl" and torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        base, self.tokenizer = models.load(resolved, config.init_args.dtype, device)
        directory = Path(start_from) if start_from is not None else resolved.adapter_dir
        model = add_adapter(
            base, adapter, config.peft_args, directory, seed=config.trainer_args.seed
        )
        model.set_adapter(adapter)
        self.trainer = PeftTrainer(
            model,
            self.tokenizer,
            init_args=config.init_args,
            trainer_args=config.trainer_args,
            sync=self if world_size > 1 else None,
        )
        if start_from is not None:
            self.trainer.load_optimizer(Path(start_from))

    def ready(self) -> None:
        """Answers once the model and adapter are loaded."""

    def rendezvous(self) -> str:
        """Rank 0's address for the others to join (`tcp://host:port`)."""
        import ray

        with socket.socket() as probe:  # a free port; the process group binds it next
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"  # type: ignore[no-untyped-call]

    def join(self, init_method: str) -> None:
        import torch.distributed as dist

        dist.init_process_group(
            self.collective_backend,
            init_method=init_method,
            rank=self.rank,
            world_size=self.world_size,
            timeout=_COLLECTIVE_TIMEOUT,
        )

    def sum(self, tensor: Any) -> None:
        """`StepSync.sum`: all-reduce `tensor` in place (through the device NCCL needs)."""
        import torch.distributed as dist

        moved = tensor.to(self.device)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM)
        if moved is not tensor:
            tensor.copy_(moved)

    def step(
        self,
        groups_json: list[str],
        config: dict[str, Any],
        dev_config: dict[str, Any],
        rendering: ChatRendering | None,
    ) -> dict[str, float]:
        groups = [TrajectoryGroup.model_validate_json(text) for text in groups_json]
        return self.trainer.step(
            groups,
            TrainConfig.model_validate(config),
            dev.TrainConfig.model_validate(dev_config),
            rendering,
        )

    def sft_step(
        self,
        trajectories_json: list[str],
        learning_rate: float,
        dev_config: dict[str, Any],
        rendering: ChatRendering | None,
    ) -> dict[str, float]:
        trajectories = [Trajectory.model_validate_json(text) for text in trajectories_json]
        return self.trainer.sft_step(
            trajectories,
            learning_rate,
            dev.TrainSFTConfig.model_validate(dev_config),
            rendering,
        )

    def save(self, directory: str) -> None:
        self.trainer.save(Path(directory))

    def restore(self, directory: str) -> None:
        self.trainer.restore(Path(directory))


StartWorker = Callable[[int, str | None], Any]  # (rank, checkpoint or None) -> actor handle


class TrainerGroup:
    """The driver's handle on the group: a `Trainer` for the model service."""

    def __init__(self, spec: TrainerSpec, world_size: int, start_worker: StartWorker) -> None:
        self.spec = spec
        self.world_size = world_size
        self._start_worker = start_worker
        self._workers: list[Any] | None = None
        self._start(str(spec.start_from) if spec.start_from is not None else None)

    def step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]:
        workers = self._running()
        calls = [
            worker.step.remote(
                [group.model_dump_json() for group in groups[rank :: self.world_size]],
                config.model_dump(mode="json"),
                dev_config.model_dump(mode="json"),
                rendering,
            )
            for rank, worker in enumerate(workers)
        ]
        results: list[dict[str, float]] = self._gather(calls, "a training step")
        return results[0]  # every rank holds the summed metrics

    def sft_step(
        self,
        trajectories: list[Trajectory],
        learning_rate: float,
        dev_config: dev.TrainSFTConfig,
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]:
        """A supervised step, each worker on its share of the batch (as `step`)."""
        workers = self._running()
        calls = [
            worker.sft_step.remote(
                [t.model_dump_json() for t in trajectories[rank :: self.world_size]],
                learning_rate,
                dev_config.model_dump(mode="json"),
                rendering,
            )
            for rank, worker in enumerate(workers)
        ]
        results: list[dict[str, float]] = self._gather(calls, "a supervised step")
        return results[0]

    def restore(self, directory: Path) -> None:
        """Every worker back to the checkpoint in `directory` (a new group if it failed)."""
        if self._workers is None:
            self._start(str(directory))
            return
        self._gather([w.restore.remote(str(directory)) for w in self._workers], "restoring")

    def _running(self) -> list[Any]:
        if self._workers is None:  # the last group failed: start from the last checkpoint
            self._start(str(self.spec.latest_checkpoint()))
        assert self._workers is not None
        return self._workers

    def save(self, directory: Path) -> None:
        workers = self._workers
        if workers is None:
            raise TrainingError("the trainer group failed; nothing to save")
        self._gather([workers[0].save.remote(str(directory))], "saving a checkpoint")

    def workers(self) -> list[Any]:
        """The worker actor handles (empty while the group is down)."""
        return list(self._workers or [])

    def close(self) -> None:
        import ray

        for worker in self._workers or []:
            ray.kill(worker)
        self._workers = None

    def _start(self, start_from: str | None) -> None:
        workers = [self._start_worker(rank, start_from) for rank in range(self.world_size)]
        self._workers = workers
        if self.world_size > 1:
            init_method = self._gather([workers[0].rendezvous.remote()], "starting")[0]
            self._gather([worker.join.remote(init_method) for worker in workers], "starting")
        else:
            self._gather([workers[0].ready.remote()], "starting")

    def _gather(self, calls: list[Any], what: str) -> list[Any]:
        """Every call's answer; on the first failure, stop the whole group and raise."""
        import ray
        from ray.exceptions import RayActorError

        pending = list(calls)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except RayActorError as error:
                rank = calls.index(done[0])
                self.close()  # the others would wait in the collective forever
                raise TrainingError(
                    f"trainer worker {rank} of {self.world_size} died during {what} "
                    f"({str(error).strip().splitlines()[0] if str(error).strip() else error!r}). "
                    "Nothing was saved: the last checkpoint is intact, and the next step "
                    "starts a new trainer group from it"
                ) from error
            except BaseException:
                self.close()
                raise
        return list(ray.get(calls))


__all__ = ["TrainerGroup", "TrainerWorker"]
