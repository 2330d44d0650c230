"""Supervised fine-tuning on a model's adapter: every example checked, then one checkpoint.

The examples come spooled in a file (`art.core.data.sft_data.spool_examples`), so a data set
larger than memory streams through. They are tokenized once to check them (a template
that cannot render one, one longer than the model trains, one with no assistant token:
each named by where it came from) before any step runs; then each batch is one optimizer
step on the same LoRA adapter RL trains, and the adapter is saved as checkpoint
`step + 1` and served, so RL continues from it. A call that fails part way sets the
adapter and optimizer back to the last checkpoint: nothing of it is kept.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from pathlib import Path

from tqdm.auto import tqdm

from ...core.data import dev
from ...core.data.errors import ConfigError, TrainingError
from ...core.data.sft_data import SFTDataError, read_spool
from ...core.data.trajectories import Trajectory
from ...core.store.atomic import replace_dir_atomic
from ..torch_thread import TorchThread
from ..trainer.tokenize import tokenize_trajectory
from .registry import TrainedModel, on_training_model
from .training import claim_writer, publish


def train_sft(
    trained: TrainedModel,
    spool: Path,
    learning_rate: float | list[float],
    batch_size: int,
    dev_config: dev.TrainSFTConfig,
    torch_thread: TorchThread,
) -> list[dict[str, float]]:
    """Train `trained` on the spooled examples, one step per batch of `batch_size` at
    `learning_rate` (one rate, or one per batch); save and serve the checkpoint; return each batch's metrics."""
    base = trained.base
    # Before anything is written, the lock included.
    count = check_examples(trained, spool, last_turn_only=dev_config.assistant_turns == "last")
    batches = math.ceil(count / batch_size)
    rates = learning_rate if isinstance(learning_rate, list) else [learning_rate] * batches
    if len(rates) != batches:
        raise ConfigError(
            "TrainSFTConfig.learning_rate",
            f"{len(rates)} rates for {count} trajectories, which make {batches} batches of "
            f"{batch_size}",
            "Give one rate (a float), or a list of exactly one rate per batch",
        )
    claim_writer(trained)

    def run() -> tuple[list[dict[str, float]], int]:
        base.model.set_adapter(trained.adapter)
        rows: list[dict[str, float]] = []
        progress = tqdm(total=batches, desc=f"sft {trained.name}", unit="batch", disable=None)
        try:
            for k, batch in enumerate(_batches(read_spool(spool), batch_size)):
                started = time.monotonic()
                metrics = trained.trainer.sft_step(batch, rates[k], dev_config, base.rendering)
                rows.append(
                    {
                        "loss": metrics["loss"],
                        "tokens": metrics["tokens_trained"],
                        "trajectories": float(len(batch)),
                        "learning_rate": rates[k],
                        "grad_norm": metrics["grad_norm"],
                        "entropy": metrics["entropy"],
                        "peak_memory_gb": metrics.get("peak_memory_gb", 0.0),
                        "seconds": time.monotonic() - started,
                        "batch": float(k),
                        "batches": float(batches),
                    }
                )
                progress.update()
                progress.set_postfix(loss=f"{metrics['loss']:.4f}")
            new_step = trained.store.step() + 1
            replace_dir_atomic(trained.store.checkpoint_dir(new_step), trained.save)
        except BaseException:
            trained.trainer.restore(trained.store.checkpoint_dir(trained.trained_step))
            raise
        finally:
            progress.close()
        return rows, new_step

    rows, new_step = on_training_model(base, run, torch_thread)
    trained.trained_step = new_step
    publish(trained, new_step)
    return rows


def check_examples(trained: TrainedModel, spool: Path, *, last_turn_only: bool = False) -> int:
    """The number of spooled examples, each rendered and tokenized as training will
    (`last_turn_only`: assistant_turns="last"); `SFTDataError` names every one that cannot
    train."""
    base = trained.base
    limit = min(trained.config.init_args.max_seq_length, base.context_length)
    problems: list[str] = []
    count = 0
    for where, trajectory in read_spool(spool):
        count += 1
        try:
            sequences = tokenize_trajectory(
                trajectory,
                base.tokenizer,
                group_index=0,
                trajectory_index=0,
                rendering=base.rendering,
                allow_training_without_logprobs=True,
                last_turn_only=last_turn_only,
            )
        except TrainingError as error:
            problems.append(f"{where}: {error}")
            continue
        if not sequences:
            problems.append(f"{where}: messages: no assistant token to train")
        longest = max((len(sequence.token_ids) for sequence in sequences), default=0)
        if longest > limit:
            problems.append(
                f"{where}: messages: {longest} tokens, longer than the {limit} this model "
                "trains (InitArgs.max_seq_length, and the model's context); shorten or split it"
            )
    if problems:
        raise SFTDataError("trajectories", problems)
    return count


def _batches(examples: Iterator[tuple[str, Trajectory]], size: int) -> Iterator[list[Trajectory]]:
    while batch := [trajectory for _, trajectory in itertools.islice(examples, size)]:
        yield batch


__all__ = ["check_examples", "train_sft"]
