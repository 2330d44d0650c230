"""The callables a PipelineTrainer runs, with ART's names and signatures."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from ..core.data.trajectories import Trajectory, TrajectoryGroup
from ..core.model import TrainableModel

ScalarMetadataValue = float | int | str | bool | None
"""A value a scenario's fields may hold to be kept as its trajectories' metadata."""

ScenarioT = TypeVar("ScenarioT")
ConfigT = TypeVar("ConfigT")

RolloutFn = Callable[[TrainableModel, ScenarioT, ConfigT], Awaitable[TrajectoryGroup]]
"""One scenario in, one group of rollouts out: `rollout_fn(model, scenario, config)`."""

SingleRolloutFn = Callable[[TrainableModel, ScenarioT, ConfigT], Awaitable[Trajectory]]
"""One rollout of a scenario; `make_group_rollout_fn` runs it n times as a group."""

EvalFn = Callable[
    [TrainableModel, int, ConfigT],
    Awaitable[
        Sequence[Trajectory | TrajectoryGroup]
        | Mapping[str, Sequence[Trajectory | TrajectoryGroup]]
    ],
]
"""`eval_fn(model, step, config)`: trajectories (logged as `val`) or a split -> trajectories map."""

__all__ = ["ConfigT", "EvalFn", "RolloutFn", "ScenarioT", "SingleRolloutFn"]
