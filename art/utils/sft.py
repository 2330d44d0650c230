"""ART's `art.utils.sft`: supervised fine-tuning from a chat JSONL file.

    await train_sft_from_file(model, "data/train.jsonl", epochs=3, batch_size=4, peak_lr=2e-4)

The file is checked whole first (every bad line named as `file:line`, nothing trained
when one is bad), then streamed: a file larger than memory trains. For trajectories in
memory, `create_sft_dataset_iterator` cuts them into `model.train_sft` calls that share
one learning-rate schedule.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from ..core.data import dev, sft_data
from ..core.data.errors import ArtValueError
from ..core.data.sft_data import (
    ScheduleType,
    SFTChunk,
    SFTDataError,
    check_file,
    create_lr_schedule,
    create_sft_dataset_iterator,
    get_file_row_count,
    resolve_sft_batch_size,
)
from ..core.data.types import TrainSFTConfig
from ..core.training import run_sft

if TYPE_CHECKING:
    from ..core.data.trajectories import Trajectory
    from ..core.model import TrainableModel

logger = logging.getLogger("art")


async def train_sft_from_file(
    model: TrainableModel,
    file_path: str,
    epochs: int = 1,
    batch_size: int = 2,
    peak_lr: float = 2e-4,
    schedule_type: ScheduleType = "linear",
    warmup_ratio: float = 0.1,
    initial_step: int = 0,
    final_step: int | None = None,
    _config: dev.TrainSFTConfig | dict[str, Any] | None = None,
    verbose: bool = False,
    shuffle_buffer_size: int = 10_000,
    log_metrics: bool = True,
    assistant_turns: Literal["all", "last"] = "all",
) -> None:
    """Fine-tune `model` on the conversations of a chat JSONL file (ART's call and defaults).

    Each line is `{"messages": [...], "tools": [...]}`; its assistant turns are trained.
    The examples are seen `epochs` times, shuffled within `shuffle_buffer_size`, in
    batches of `batch_size`, one optimizer step each. The learning rate of batch k is
    `create_lr_schedule(total, peak_lr, schedule_type, int(total * warmup_ratio))[k]`
    over all the file's batches; `initial_step` and `final_step` (exclusive) train a
    slice of them, so a long run can be split into calls with evaluations between (each
    call saves one checkpoint). An empty file, or a slice past the end, trains nothing
    and says so. `log_metrics` and `assistant_turns` are `model.train_sft`'s.
    """
    _check_arguments(epochs, batch_size, peak_lr, warmup_ratio, initial_step, final_step)
    if shuffle_buffer_size < 1:
        raise ArtValueError("shuffle_buffer_size", f"is {shuffle_buffer_size}", "Use 1 or more")
    rows = check_file(file_path)
    total = math.ceil(rows * epochs / batch_size)
    if rows == 0 or initial_step >= total:
        logger.warning(
            "train_sft_from_file: %s has %d example(s), %d batch(es); initial_step=%d leaves "
            "nothing to train",
            file_path,
            rows,
            total,
            initial_step,
        )
        return
    schedule = create_lr_schedule(total, peak_lr, schedule_type, int(total * warmup_ratio))
    rates = schedule[initial_step : min(final_step, total) if final_step is not None else None]
    if verbose:
        print(
            f"[{model.name}] SFT on {file_path}: {rows} examples x {epochs} epoch(s), "
            f"batches {initial_step}..{initial_step + len(rates)} of {total}, "
            f"batch_size={batch_size}, {schedule_type} schedule, peak_lr={peak_lr:g}"
        )
    examples = itertools.islice(
        sft_data.iterate_file(
            file_path,
            epochs=epochs,
            shuffle_buffer_size=shuffle_buffer_size,
            initial_skip=initial_step * batch_size,
        ),
        len(rates) * batch_size,
    )
    config = TrainSFTConfig(
        learning_rate=rates, batch_size=batch_size, assistant_turns=assistant_turns
    )
    await run_sft(
        model, examples, config=config, dev_config=_config, verbose=verbose, log_metrics=log_metrics
    )


def iterate_file(
    file_path: str,
    epochs: int = 1,
    shuffle_buffer_size: int = 10_000,
    seed: int = 42,
    initial_skip: int = 0,
) -> Iterator[Trajectory]:
    """The trajectories of a chat JSONL file, `epochs` times (ART's call and defaults).

    Each epoch is shuffled within a buffer of `shuffle_buffer_size` lines, seeded with
    `seed + epoch`, so the same seed gives the same order; the first `initial_skip` are
    left out (to resume). The file is read as it is iterated, never whole; a bad line
    raises `SFTDataError` naming it as `file:line` (`check_file` names them all first).
    """
    if shuffle_buffer_size < 1:
        raise ArtValueError("shuffle_buffer_size", f"is {shuffle_buffer_size}", "Use 1 or more")
    examples = sft_data.iterate_file(
        file_path,
        epochs=epochs,
        shuffle_buffer_size=shuffle_buffer_size,
        initial_skip=initial_skip,
        seed=seed,
    )
    for _, trajectory in examples:
        yield trajectory


def _check_arguments(
    epochs: int,
    batch_size: int,
    peak_lr: float,
    warmup_ratio: float,
    initial_step: int,
    final_step: int | None,
) -> None:
    checks = [
        ("epochs", epochs >= 1, f"is {epochs}", "Use 1 or more"),
        ("batch_size", batch_size >= 1, f"is {batch_size}", "Use 1 or more"),
        ("peak_lr", peak_lr > 0, f"is {peak_lr}", "Use a positive learning rate"),
        ("warmup_ratio", 0 <= warmup_ratio <= 1, f"is {warmup_ratio}", "Use 0.0 to 1.0"),
        ("initial_step", initial_step >= 0, f"is {initial_step}", "Use 0 or more"),
        (
            "final_step",
            final_step is None or final_step > initial_step,
            f"is {final_step}, not after initial_step={initial_step}",
            "Use a batch index after initial_step, or None for the end of the file",
        ),
    ]
    for field, ok, problem, fix in checks:
        if not ok:
            raise ArtValueError(field, problem, fix)


__all__ = [
    "SFTChunk",
    "SFTDataError",
    "create_lr_schedule",
    "create_sft_dataset_iterator",
    "get_file_row_count",
    "iterate_file",
    "resolve_sft_batch_size",
    "train_sft_from_file",
]
