"""What a log call may write: metric names and values, split names, non-empty groups.

Checked before anything is written, so a bad call loses nothing already stored.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping

from .errors import ConfigError, TrajectoryValidationError
from .trajectories import TrajectoryGroup

# Columns every history row has, which no logged metric may overwrite.
RESERVED_METRICS = frozenset({"step", "recorded_at", "training_step"})
# What a split may be called: its name is a directory under `trajectories/`.
SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
# A history row's metrics are read back as floats: a larger integer cannot be.
_LARGEST = int(sys.float_info.max)


def check_metrics(metrics: Mapping[str, object], where: str = "metrics") -> None:
    """Refuse a metric a history row cannot hold: a reserved or empty name, or a non-number."""
    for key, value in metrics.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(
                where, f"metric name {key!r} is not a non-empty string", "Name every metric"
            )
        if key in RESERVED_METRICS:
            raise ConfigError(
                f"{where}[{key!r}]",
                f"{key!r} is a column every history row already has",
                "Pass the step as `step=`, and give the metric another name",
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(
                f"{where}[{key!r}]",
                f"a metric must be a number (int or float), got {type(value).__name__}",
                "Log plain numbers (`float(value)` for numpy or torch scalars); put text in a "
                "trajectory's metadata",
            )
        if isinstance(value, int) and not -_LARGEST <= value <= _LARGEST:
            raise ConfigError(
                f"{where}[{key!r}]",
                f"an integer of {value.bit_length()} bits is beyond a float's range",
                "Log a number a float can hold (up to about 1.8e308)",
            )


def check_logged_groups(groups: list[TrajectoryGroup], where: str = "trajectory_groups") -> None:
    """Refuse a group with neither trajectories nor exceptions: it records nothing."""
    for index, group in enumerate(groups):
        if not group.trajectories and not group.exceptions:
            raise TrajectoryValidationError(
                f"{where}[{index}]",
                "the group is empty",
                "Give every group at least one trajectory, or leave the group out",
            )


def check_split(split: str) -> str:
    if not isinstance(split, str) or not SPLIT_NAME.fullmatch(split):
        raise ConfigError(
            "split",
            f"{split!r} cannot be used as a directory name",
            "Use letters, digits, '_' or '-', such as 'train' or 'val'",
        )
    return split


__all__ = ["RESERVED_METRICS", "SPLIT_NAME", "check_logged_groups", "check_metrics", "check_split"]
