"""Checks run on trajectory groups right before they are logged or trained.

Pydantic validates a trajectory when it is built and when a field is assigned, but
not when a list inside it is mutated (`trajectory.messages_and_choices.append(...)`),
so everything is checked again here, with the full path of any bad value.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import TrajectoryValidationError
from .trajectories import (
    History,
    Trajectory,
    TrajectoryGroup,
    check_message_or_choice,
    check_metadata_value,
    check_metric,
    check_reward,
    check_tool,
)


def _check_history(history: History | Trajectory, where: str) -> None:
    for index, item in enumerate(history.messages_and_choices):
        check_message_or_choice(item, f"{where}.messages_and_choices[{index}]")
    for index, tool in enumerate(history.tools or []):
        check_tool(tool, f"{where}.tools[{index}]")


def check_trajectory(trajectory: Trajectory, where: str) -> None:
    """Raise `TrajectoryValidationError` naming the first bad value in `trajectory`."""
    _check_history(trajectory, where)
    for index, history in enumerate(trajectory.additional_histories):
        _check_history(history, f"{where}.additional_histories[{index}]")
    check_reward(trajectory.reward, f"{where}.reward")
    for key, metric in trajectory.metrics.items():
        check_metric(metric, f"{where}.metrics[{key!r}]")
    for key, value in trajectory.metadata.items():
        check_metadata_value(value, f"{where}.metadata[{key!r}]")


def coerce_groups(
    items: Iterable[TrajectoryGroup | Trajectory | BaseException], where: str
) -> list[TrajectoryGroup]:
    """Accept groups, or loose trajectories (which become one group), and check them all."""
    items = list(items)
    if not items:
        raise TrajectoryValidationError(
            where, "no trajectory groups given", "Pass the groups from `gather_trajectory_groups`"
        )
    if all(isinstance(item, TrajectoryGroup) for item in items):
        groups = [item for item in items if isinstance(item, TrajectoryGroup)]
    elif all(isinstance(item, Trajectory | BaseException) for item in items):
        groups = [TrajectoryGroup(item for item in items if not isinstance(item, TrajectoryGroup))]
    else:
        kinds = sorted({type(item).__name__ for item in items})
        raise TrajectoryValidationError(
            where,
            f"expected TrajectoryGroups or Trajectories, got {', '.join(kinds)}",
            "Pass a list of `art.TrajectoryGroup` (or of `art.Trajectory`), "
            "awaited: `await art.gather_trajectory_groups(...)`",
        )
    for group_index, group in enumerate(groups):
        group_where = f"{where}[{group_index}]"
        if not group.trajectories and not group.exceptions:
            raise TrajectoryValidationError(
                group_where,
                "the group is empty",
                "Give every group at least one trajectory, or leave the group out",
            )
        for index, trajectory in enumerate(group.trajectories):
            check_trajectory(trajectory, f"{group_where}.trajectories[{index}]")
    return groups
