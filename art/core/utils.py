"""Helpers for training loops: batching a dataset into steps, bounding concurrency, retrying."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, ParamSpec, TypeVar

from .data.errors import ConfigError

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("art")


@dataclass(frozen=True)
class DatasetBatch(Generic[T]):
    """The items of one training step."""

    items: list[T]
    step: int
    epoch: int
    epoch_step: int


def iterate_dataset(
    dataset: Sequence[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    *,
    seed: int = 0,
    use_tqdm: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """Yield `groups_per_step` items per step, reshuffled every epoch, from `initial_step` on.

    The shuffle of epoch `e` depends only on `seed` and `e` (a private RNG, so the global
    `random` state is untouched), which is what makes resuming at `initial_step` yield
    exactly the batches an uninterrupted run would have. The last batch of an epoch may
    be smaller.
    """
    if groups_per_step < 1:
        raise ConfigError("groups_per_step", f"got {groups_per_step}", "Use 1 or more")
    if num_epochs < 1:
        raise ConfigError("num_epochs", f"got {num_epochs}", "Use 1 or more")
    if initial_step < 0:
        raise ConfigError("initial_step", f"got {initial_step}", "Use 0 or more")
    if len(dataset) == 0:
        raise ConfigError("dataset", "is empty", "Pass at least one item")
    steps_per_epoch = -(-len(dataset) // groups_per_step)
    total = steps_per_epoch * num_epochs
    bar = None
    if use_tqdm:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=min(initial_step, total), desc="steps", unit="step")
    try:
        for epoch in range(num_epochs):
            order = list(range(len(dataset)))
            random.Random(f"{seed}:{epoch}").shuffle(order)
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                chunk = order[epoch_step * groups_per_step : (epoch_step + 1) * groups_per_step]
                yield DatasetBatch([dataset[i] for i in chunk], step, epoch, epoch_step)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def limit_concurrency(
    n: int, derive_key: Callable[..., Hashable] | None = None
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Let at most `n` calls of the decorated async function run at once.

    With `derive_key`, the limit applies per key computed from the call's arguments
    (for example, per scenario).
    """
    if n < 1:
        raise ConfigError("n", f"got {n}", "Allow at least 1 concurrent call")

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        semaphores: dict[Hashable, asyncio.Semaphore] = {}

        @functools.wraps(function)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> R:
            key = derive_key(*args, **kwargs) if derive_key is not None else None
            semaphore = semaphores.setdefault(key, asyncio.Semaphore(n))
            async with semaphore:
                return await function(*args, **kwargs)

        return limited

    return decorate


def retry(
    max_attempts: int = 3,
    delay: float = 0.5,
    backoff: float = 2.0,
    exceptions: tuple[type[BaseException], ...] = (Exception,),
    on_retry: Callable[[BaseException, int], None] | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Retry the decorated async function on `exceptions`, waiting `delay * backoff**k`.

    The last failure is raised as is once `max_attempts` calls have failed.
    """
    if max_attempts < 1:
        raise ConfigError("max_attempts", f"got {max_attempts}", "Use 1 or more")

    def decorate(function: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(function)
        async def retried(*args: P.args, **kwargs: P.kwargs) -> R:
            wait = delay
            for attempt in range(1, max_attempts + 1):
                try:
                    return await function(*args, **kwargs)
                except exceptions as error:
                    if attempt == max_attempts:
                        raise
                    if on_retry is not None:
                        on_retry(error, attempt)
                    else:
                        logger.warning(
                            "%s failed (attempt %d of %d): %r; retrying in %.1fs",
                            function.__qualname__,
                            attempt,
                            max_attempts,
                            error,
                            wait,
                        )
                    await asyncio.sleep(wait)
                    wait *= backoff
            raise AssertionError("unreachable")

        return retried

    return decorate


__all__ = ["DatasetBatch", "iterate_dataset", "limit_concurrency", "retry"]
