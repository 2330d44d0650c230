"""Training by the token: Tinker's calls on a model's adapter (`art serve`'s Tinker API).

Where `training.py` takes a whole step per call, these split it as Tinker does:
`forward_backward` adds gradients, `optim_step` applies them, and a save writes the
adapter (and the optimizer's state) as the model's next checkpoint, which the engine then
serves as `name@step`. Each call has sole use of the training model, as a step does. Only
the PEFT trainer takes them (the Unsloth and Ray trainers are refused by name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ...core.data.errors import ConfigError
from ...core.store.atomic import replace_dir_atomic
from ..torch_thread import TorchThread
from ..trainer.token_losses import TokenDatum, check_loss
from .registry import TrainedModel, on_training_model
from .training import claim_writer_lock, publish


class TokenTrainer(Protocol):
    """A trainer that takes Tinker's calls (`PeftTrainer` does)."""

    def forward_backward(
        self,
        datums: list[TokenDatum],
        loss_fn: str,
        loss_config: dict[str, float],
        *,
        backward: bool,
    ) -> tuple[list[dict[str, list[float]]], dict[str, float]]: ...

    def optim_step(
        self,
        learning_rate: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float,
        grad_clip_norm: float,
    ) -> dict[str, float]: ...

    def prompt_logprobs(
        self, token_ids: list[int], directory: Path | None, *, own: bool = False
    ) -> list[float]: ...

    def load(self, directory: Path, *, with_optimizer: bool) -> None: ...


def token_trainer(trained: TrainedModel) -> TokenTrainer:
    """`trained`'s trainer, if it takes Tinker's calls."""
    trainer = trained.trainer
    if not all(hasattr(trainer, name) for name in ("forward_backward", "optim_step", "load")):
        raise ConfigError(
            "trainer_backend",
            f"the {type(trainer).__name__} of {trained.project}/{trained.name} does not take "
            "Tinker's forward_backward and optim_step calls",
            "Use the PEFT trainer (the default) for models trained through Tinker's API",
        )
    return trainer  # type: ignore[return-value]


def forward_backward(
    trained: TrainedModel,
    datums: list[TokenDatum],
    loss_fn: str,
    loss_config: dict[str, float | str] | None,
    *,
    backward: bool,
    torch_thread: TorchThread,
) -> tuple[list[dict[str, list[float]]], dict[str, float]]:
    """Each datum's logprobs and loss; with `backward`, their gradients added."""
    config = check_loss(loss_fn, loss_config)
    trainer = token_trainer(trained)
    return on_training_model(
        trained.base,
        lambda: trainer.forward_backward(datums, loss_fn, config, backward=backward),
        torch_thread,
    )


def optim_step(
    trained: TrainedModel,
    adam: dict[str, float],
    torch_thread: TorchThread,
) -> dict[str, float]:
    """One optimizer step on the summed gradients (`adam`: Tinker's AdamParams)."""
    trainer = token_trainer(trained)
    metrics = on_training_model(trained.base, lambda: trainer.optim_step(**adam), torch_thread)
    trained.unsaved = True
    return metrics


def save_checkpoint(trained: TrainedModel, torch_thread: TorchThread) -> int:
    """The adapter and optimizer state saved as the model's next checkpoint, then served;
    returns its step. Tinker's saves make the steps: an optimizer step alone writes none."""
    claim_writer_lock(trained)

    def save() -> int:
        step = trained.store.step() + 1
        replace_dir_atomic(trained.store.checkpoint_dir(step), trained.save)
        return step

    step = on_training_model(trained.base, save, torch_thread)
    trained.trained_step = step
    trained.unsaved = False
    publish(trained, step)
    return step


def load_checkpoint(
    trained: TrainedModel, directory: Path, *, with_optimizer: bool, torch_thread: TorchThread
) -> None:
    """Set the adapter (and, `with_optimizer`, the optimizer) to the checkpoint in
    `directory`."""
    trainer = token_trainer(trained)
    if not directory.is_dir():
        raise ConfigError("path", "that checkpoint's files are gone", "Name a saved state")
    on_training_model(
        trained.base,
        lambda: trainer.load(directory, with_optimizer=with_optimizer),
        torch_thread,
    )
    trained.unsaved = True


def prompt_logprobs(
    trained: TrainedModel, step: int | None, token_ids: list[int], torch_thread: TorchThread
) -> list[float]:
    """Each token's logprob after the first, under checkpoint `step` (None: the base).
    The step the adapter holds unchanged is scored with the adapter itself, not loaded
    again from its files (about 1 s a call for the default model here)."""
    trainer = token_trainer(trained)
    directory = None if step is None else trained.store.checkpoint_dir(step)
    own = step is not None and step == trained.trained_step and not trained.unsaved
    return on_training_model(
        trained.base,
        lambda: trainer.prompt_logprobs(token_ids, directory, own=own),
        torch_thread,
    )


__all__ = [
    "TokenTrainer",
    "forward_backward",
    "load_checkpoint",
    "optim_step",
    "prompt_logprobs",
    "save_checkpoint",
    "token_trainer",
]
