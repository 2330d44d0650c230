"""The training driver: one step on a model's adapter, saved, then served.

A step runs with sole use of the training model (`registry.on_training_model`); its
adapter is saved as checkpoint `step + 1` (written whole in a temporary directory, then
renamed) and, for an engine that holds its own weights, loaded into it before the next
request for the model's latest step is routed, so rollouts that follow sample from it.

One writer per model: the first step a process trains takes the model's writer lock
(`ModelStore.hold_writer_lock`), held until the model is unloaded, so a second process
training it is refused naming the first's pid. Other processes may still load the model
to serve or evaluate it. A step whose adapter is older than the latest checkpoint (another
backend trained meanwhile) is refused rather than written on a stale lineage.
"""

from __future__ import annotations

from pathlib import Path

from ...core.data import dev
from ...core.data.errors import ConfigError
from ...core.data.trajectories import TrajectoryGroup
from ...core.data.types import TrainConfig
from ...core.store.atomic import replace_dir_atomic
from ..torch_thread import TorchThread
from .registry import TrainedModel, on_training_model

OPTIMIZER_FILE = "optimizer.pt"  # the optimizer state in a checkpoint, as the trainers write it


def train_step(
    trained: TrainedModel,
    groups: list[TrajectoryGroup],
    config: TrainConfig,
    objective: dev.TrainConfig,
    torch_thread: TorchThread,
) -> dict[str, float]:
    """One optimizer step on `trained`'s adapter; the checkpoint is saved and served."""
    base = trained.base
    claim_writer(trained)

    def step() -> tuple[dict[str, float], int]:
        base.model.set_adapter(trained.adapter)
        metrics: dict[str, float] = trained.trainer.step(groups, config, objective, base.rendering)
        new_step = trained.store.step() + 1

        def save(directory: Path) -> None:
            trained.save(directory)
            # TrainConfig.optimizer_save_interval: the trainers always write the state;
            # a checkpoint that is not to keep it drops it before it is published.
            if not config.keeps_optimizer_state(new_step):
                (directory / OPTIMIZER_FILE).unlink(missing_ok=True)

        replace_dir_atomic(trained.store.checkpoint_dir(new_step), save)
        return metrics, new_step

    metrics, new_step = on_training_model(base, step, torch_thread)
    trained.trained_step = new_step
    publish(trained, new_step)
    return metrics


def claim_writer_lock(trained: TrainedModel) -> None:
    """Hold the model's writer lock; refused (naming the holder) while another process
    trains it."""
    if trained.writer_lock is None:
        trained.writer_lock = trained.store.hold_writer_lock()


def claim_writer(trained: TrainedModel) -> None:
    """Hold the model's writer lock (refused while another process trains it), and refuse
    to train on an adapter older than the latest checkpoint."""
    claim_writer_lock(trained)
    latest = trained.store.step()
    if latest != trained.trained_step:
        raise ConfigError(
            "model",
            f"{trained.store.dir} has checkpoint {latest}, written after this backend loaded "
            f"step {trained.trained_step} (another backend trained it meanwhile); a step here "
            "would continue from the older weights",
            f"Register the model with a new backend to continue from step {latest}; let one "
            "backend at a time train a model",
        )


def publish(trained: TrainedModel, step: int) -> None:
    """Make checkpoint `step` what `name` serves, on an engine with its own weights (one
    that samples from the training model serves the trained adapter already)."""
    engine = trained.base.engine
    assert engine is not None
    if engine.serves_training_weights:
        return
    directory = trained.store.checkpoint_dir(step)
    trained.base.checkpoints.load(engine, trained.adapter, step, directory)
    trained.published = step


__all__ = ["claim_writer", "claim_writer_lock", "publish", "train_step"]
