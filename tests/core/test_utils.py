"""iterate_dataset, limit_concurrency and retry."""

from __future__ import annotations

import asyncio
import random

import pytest

import art
from art.utils import iterate_dataset, limit_concurrency


def test_iterate_dataset_covers_each_epoch_once_in_a_seeded_order() -> None:
    data = list(range(10))
    batches = list(iterate_dataset(data, groups_per_step=3, num_epochs=2, use_tqdm=False))
    assert [b.step for b in batches] == list(range(8))
    assert [len(b.items) for b in batches] == [3, 3, 3, 1] * 2
    for epoch in (0, 1):
        seen = [x for b in batches if b.epoch == epoch for x in b.items]
        assert sorted(seen) == data
    assert [b.items for b in batches[:4]] != [b.items for b in batches[4:]]
    assert [b.items for b in batches] == [
        b.items for b in iterate_dataset(data, groups_per_step=3, num_epochs=2, use_tqdm=False)
    ]


def test_iterate_dataset_resumes_exactly_where_a_run_stopped() -> None:
    data = list("abcdefghij")
    full = list(iterate_dataset(data, 4, num_epochs=3, use_tqdm=False))
    resumed = list(iterate_dataset(data, 4, num_epochs=3, initial_step=5, use_tqdm=False))
    assert resumed == full[5:]


def test_iterate_dataset_leaves_the_global_random_state_alone() -> None:
    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    list(iterate_dataset(list(range(5)), 2, use_tqdm=False))
    assert random.random() == expected


def test_iterate_dataset_rejects_bad_arguments() -> None:
    with pytest.raises(art.ConfigError, match="groups_per_step"):
        list(iterate_dataset([1], groups_per_step=0))
    with pytest.raises(art.ConfigError, match="dataset"):
        list(iterate_dataset([], groups_per_step=1))


async def test_limit_concurrency_bounds_running_calls_per_key() -> None:
    running: dict[str, int] = {"a": 0, "b": 0}
    peak: dict[str, int] = {"a": 0, "b": 0}

    @limit_concurrency(2, derive_key=lambda key: key)
    async def work(key: str) -> None:
        running[key] += 1
        peak[key] = max(peak[key], running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1

    await asyncio.gather(*(work(k) for k in "ab" * 6))
    assert peak == {"a": 2, "b": 2}


async def test_retry_retries_then_raises_the_last_error() -> None:
    calls: list[int] = []

    @art.retry(max_attempts=3, delay=0.001, exceptions=(ConnectionError,))
    async def flaky(succeed_on: int) -> int:
        calls.append(1)
        if len(calls) < succeed_on:
            raise ConnectionError(f"attempt {len(calls)}")
        return len(calls)

    assert await flaky(3) == 3
    calls.clear()
    with pytest.raises(ConnectionError, match="attempt 3"):
        await flaky(10)
    assert len(calls) == 3


async def test_retry_does_not_retry_other_exceptions() -> None:
    calls: list[int] = []

    @art.retry(max_attempts=5, delay=0.001, exceptions=(ConnectionError,))
    async def broken() -> None:
        calls.append(1)
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await broken()
    assert len(calls) == 1
