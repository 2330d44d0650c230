"""gather_trajectory_groups: concurrency, order, and exact exception counting."""

from __future__ import annotations

import asyncio

import pytest
from helpers import sampled_choice

import art
from art.core.metrics.batch_metrics import group_metrics


class Boom(Exception):
    pass


async def rollout(reward: float, *, fail: bool = False, delay: float = 0.0) -> art.Trajectory:
    await asyncio.sleep(delay)
    if fail:
        raise Boom(f"rollout with reward {reward} failed")
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}])
    trajectory.messages_and_choices.append(sampled_choice("one two three"))
    trajectory.reward = reward
    return trajectory


async def test_groups_come_back_in_order_with_trajectories_in_order() -> None:
    groups = await art.gather_trajectory_groups(
        art.TrajectoryGroup(rollout(g + i / 10, delay=0.01 * (3 - i)) for i in range(3))
        for g in range(4)
    )
    assert [[t.reward for t in group] for group in groups] == [
        [g + i / 10 for i in range(3)] for g in range(4)
    ]


async def test_rollouts_run_concurrently() -> None:
    running = 0
    most = 0

    async def counted() -> art.Trajectory:
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(5):  # yield to the loop: a serial gather would finish this one first
            await asyncio.sleep(0)
        running -= 1
        return await rollout(0)

    await art.gather_trajectory_groups(
        (art.TrajectoryGroup(counted() for _ in range(5)) for _ in range(4)), pbar_desc=None
    )
    assert most == 20  # every rollout of every group was in flight at once


async def test_by_default_one_exception_fails_the_gather_and_cancels_the_rest() -> None:
    finished: list[int] = []

    async def slow(i: int) -> art.Trajectory:
        await asyncio.sleep(5)
        finished.append(i)
        return art.Trajectory()

    # The loop is shared by the session, so other tests' background tasks (LiteLLM's
    # logging worker) may live on it; only the gather's own tasks must be gone.
    before = asyncio.all_tasks()
    with pytest.raises(Boom) as raised:
        await art.gather_trajectory_groups(
            [
                art.TrajectoryGroup([rollout(1.0, fail=True), slow(0)]),
                art.TrajectoryGroup([slow(1), slow(2)]),
            ]
        )
    assert "max_exceptions=0" in "".join(raised.value.__notes__)
    await asyncio.sleep(0)
    assert finished == []
    assert not asyncio.all_tasks() - before


async def test_a_count_budget_keeps_failures_as_data() -> None:
    groups = await art.gather_trajectory_groups(
        (
            art.TrajectoryGroup(rollout(i, fail=(g == 1 and i < 2)) for i in range(4))
            for g in range(3)
        ),
        max_exceptions=2,
    )
    assert [len(group) for group in groups] == [4, 2, 4]
    assert [len(group.exceptions) for group in groups] == [0, 2, 0]
    assert groups[1].exceptions[0].type.endswith("Boom")


async def test_a_count_budget_is_exceeded_by_one_more() -> None:
    with pytest.raises(Boom):
        await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(i, fail=i < 3) for i in range(4)) for _ in range(1)),
            max_exceptions=2,
        )


async def test_a_fraction_budget_counts_against_all_rollouts() -> None:
    # 2 of 8 rollouts fail: exactly 25%, allowed at 0.25 and refused at 0.2.
    def groups() -> list[art.TrajectoryGroup]:
        return [art.TrajectoryGroup(rollout(i, fail=i == 0) for i in range(4)) for _ in range(2)]  # type: ignore[misc]

    kept = await art.gather_trajectory_groups(groups(), max_exceptions=0.25)
    assert sum(len(group.exceptions) for group in kept) == 2
    with pytest.raises(Boom):
        await art.gather_trajectory_groups(groups(), max_exceptions=0.2)


async def test_the_budget_is_checked_even_when_early_rollouts_succeed() -> None:
    # Failures arrive last; a rate over successes so far would have let them through.
    rollouts = [rollout(1.0, delay=0.0) for _ in range(2)] + [
        rollout(0.0, fail=True, delay=0.05) for _ in range(2)
    ]
    with pytest.raises(Boom):
        await art.gather_trajectory_groups([art.TrajectoryGroup(rollouts)], max_exceptions=0.25)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
async def test_a_bad_budget_is_a_clear_error(bad: object) -> None:
    with pytest.raises(art.ConfigError, match="max_exceptions"):
        await art.gather_trajectory_groups([], max_exceptions=bad)  # type: ignore[arg-type]


async def test_after_each_can_drop_replace_or_split_groups() -> None:
    async def after_each(
        group: art.TrajectoryGroup,
    ) -> art.TrajectoryGroup | list[art.TrajectoryGroup] | None:
        first = group.trajectories[0].reward
        if first == 0:
            return None
        if first == 1:
            return [art.TrajectoryGroup([t]) for t in group]
        return art.TrajectoryGroup([t for t in group if t.reward > 2.05])

    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(g + i / 10) for i in range(2)) for g in range(3)),
        after_each=after_each,
    )
    assert [[t.reward for t in group] for group in groups] == [[1.0], [1.1], [2.1]]


async def test_a_rollout_that_returns_something_else_counts_as_an_exception() -> None:
    async def bad() -> str:
        return "oops"

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([bad(), rollout(1.0)])],  # type: ignore[list-item]
        max_exceptions=1,
    )
    assert "expected an art.Trajectory, got str" in groups[0].exceptions[0].message


async def test_prebuilt_groups_pass_through_and_their_exceptions_count() -> None:
    ready = art.TrajectoryGroup([art.Trajectory(reward=1.0), Boom("earlier")])
    with pytest.raises(Exception, match="earlier"):
        await art.gather_trajectory_groups([ready])
    assert await art.gather_trajectory_groups([ready], max_exceptions=1) == [ready]


async def test_gather_trajectories_keeps_failures_in_place_within_the_budget() -> None:
    results = await art.gather_trajectories(
        [rollout(0.0), rollout(1.0, fail=True), rollout(2.0)], max_exceptions=1
    )
    assert isinstance(results[1], Boom)
    assert [r.reward for r in results if isinstance(r, art.Trajectory)] == [0.0, 2.0]
    with pytest.raises(Boom):
        await art.gather_trajectories([rollout(1.0, fail=True)])


async def test_cancellation_is_not_swallowed_as_a_rollout_failure() -> None:
    started: list[asyncio.Task[object]] = []
    all_started = asyncio.Event()

    async def endless() -> art.Trajectory:
        task = asyncio.current_task()
        assert task is not None
        started.append(task)
        if len(started) == 3:
            all_started.set()
        await asyncio.Event().wait()  # never set: only cancellation ends it
        raise AssertionError("unreachable")

    rollouts = [art.TrajectoryGroup(endless() for _ in range(3))]
    gathering = asyncio.create_task(art.gather_trajectory_groups(rollouts, max_exceptions=10))
    await all_started.wait()
    gathering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gathering
    # No rollout is left running, and none was counted as a failed rollout.
    assert all(task.done() and task.cancelled() for task in started)


# --- the progress bar shows what history.jsonl will record ------------------------------


async def measured(text: str, reward: float, calls: int) -> art.Trajectory:
    await asyncio.sleep(0)
    trajectory = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}])
    trajectory.messages_and_choices.append(sampled_choice(text))
    trajectory.reward = reward
    trajectory.metrics["calls"] = calls
    return trajectory


def bar_postfix(stderr: str) -> dict[str, str]:
    """The `key=value` figures of the bar as last drawn (tqdm redraws after each '\\r')."""
    last = stderr.strip().split("\r")[-1]
    inside = last[last.rindex("[") + 1 : last.rindex("]")]
    return dict(part.split("=", 1) for part in inside.split(", ") if "=" in part)


async def test_the_bar_shows_the_means_that_history_records(
    capsys: pytest.CaptureFixture[str],
) -> None:
    groups = await art.gather_trajectory_groups(
        [
            art.TrajectoryGroup([measured("a b c d", 1.0, 2), measured("a b", 0.0, 0)]),
            art.TrajectoryGroup([measured("a b c d e f", 0.5, 1), measured("a b c d", 0.5, 1)]),
        ]
    )
    history = group_metrics(groups)  # the row model.log / model.train write
    shown = bar_postfix(capsys.readouterr().err)
    assert history["completion_tokens"] == 4.0  # a mean per trajectory, not the sum 16
    assert shown == {"reward": "0.500", "calls": "1", "completion_tokens": "4.0"}


async def test_the_bar_shows_no_reward_until_a_group_is_scored(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def drop(group: art.TrajectoryGroup) -> None:
        return None  # a judge that could score nothing

    await art.gather_trajectory_groups(
        [art.TrajectoryGroup([measured("a b", 0.0, 1), measured("a", 0.0, 1)])], after_each=drop
    )
    assert bar_postfix(capsys.readouterr().err) == {}  # nothing kept, nothing to report

    async def score(group: art.TrajectoryGroup) -> art.TrajectoryGroup:
        for trajectory, reward in zip(group, (0.25, 0.75), strict=True):
            trajectory.reward = reward
        return group

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([measured("a b", 0.0, 1), measured("a", 0.0, 1)])], after_each=score
    )
    assert group_metrics(groups)["reward"] == 0.5
    assert bar_postfix(capsys.readouterr().err)["reward"] == "0.500"
