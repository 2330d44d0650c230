"""Scoring MCP rollouts: RULER or a reward function, and evaluation without training.

A scorer takes a finished `TrajectoryGroup` and returns it with rewards set (or None to
drop it); it has the shape of `gather_trajectory_groups(after_each=...)`, so scoring
overlaps the rollouts still running.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.data.errors import ConfigError
from ...core.data.trajectories import PydanticException, Trajectory, TrajectoryGroup
from ...core.gather import gather_trajectory_groups
from .rollout import MCPRolloutConfig, mcp_rollout
from .session import MCPSession
from .types import GeneratedScenario

if TYPE_CHECKING:
    from ...core.model import Model

Scorer = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None]]
RewardFn = Callable[[Trajectory], float | Awaitable[float]]


def reward_scorer(reward_fn: RewardFn) -> Scorer:
    """A scorer that sets each trajectory's reward to `reward_fn(trajectory)` (sync or async)."""

    async def score(group: TrajectoryGroup) -> TrajectoryGroup:
        for trajectory in group.trajectories:
            value = reward_fn(trajectory)
            trajectory.reward = await value if inspect.isawaitable(value) else value
        return group

    return score


def ruler_scorer(
    judge_model: str | Model,
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str | None = None,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
) -> Scorer:
    """A scorer that ranks each group with RULER (`art.rewards.ruler_score_group`).

    The judge sees each trajectory's tools, so it knows what the agent could call.
    `judge_model` is a LiteLLM model name, or an `art.Model` (its endpoint is used).
    """
    if isinstance(judge_model, str):
        model_name, params = judge_model, dict(extra_litellm_params or {})
    else:
        params = judge_model.litellm_completion_params() | dict(extra_litellm_params or {})
        model_name = params.pop("model")

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        from ... import rewards  # lazily: RULER (and LiteLLM) only when scoring

        options: dict[str, Any] = {"swallow_exceptions": swallow_exceptions, "debug": debug}
        if rubric is not None:
            options["rubric"] = rubric
        scored: TrajectoryGroup | None = await rewards.ruler_score_group(
            group, model_name, params or None, **options
        )
        return scored

    return score


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's rollouts after scoring, and their mean reward (NaN if all failed)."""

    scenario: GeneratedScenario | str
    trajectories: list[Trajectory]
    exceptions: list[PydanticException] = field(default_factory=list)

    @property
    def task(self) -> str:
        return self.scenario.task if isinstance(self.scenario, GeneratedScenario) else self.scenario

    @property
    def mean_reward(self) -> float:
        rewards = [t.reward for t in self.trajectories]
        return sum(rewards) / len(rewards) if rewards else math.nan


@dataclass(frozen=True)
class MCPEvaluation:
    """The result of `evaluate`: one `ScenarioResult` per scenario, in order."""

    results: list[ScenarioResult]

    @property
    def mean_reward(self) -> float:
        """Mean reward over every scored trajectory (NaN when none finished)."""
        rewards = [t.reward for result in self.results for t in result.trajectories]
        return sum(rewards) / len(rewards) if rewards else math.nan

    @property
    def groups(self) -> list[TrajectoryGroup]:
        """The scored groups, ready for `model.log(evaluation.groups, split='val')`."""
        return [
            TrajectoryGroup(result.trajectories, exceptions=result.exceptions)
            for result in self.results
        ]


async def evaluate(
    model: Model,
    scenarios: Iterable[GeneratedScenario | str],
    sessions: MCPSession | Sequence[MCPSession],
    scorer: Scorer,
    *,
    config: MCPRolloutConfig | None = None,
    rollouts_per_scenario: int = 1,
    max_exceptions: int | float = 0,
    pbar_desc: str | None = "evaluate",
) -> MCPEvaluation:
    """Score `model` (served or external) on `scenarios` with the tools of `sessions`.

    Nothing is trained or logged: the result holds per-scenario trajectories and rewards,
    and their mean. RULER compares rollouts of one scenario, so give it
    `rollouts_per_scenario >= 2`.
    """
    if rollouts_per_scenario < 1:
        raise ConfigError(
            "rollouts_per_scenario",
            f"must be at least 1, got {rollouts_per_scenario}",
            "Pass 1 for a reward function, 2 or more for RULER",
        )
    scenario_list = list(scenarios)
    if not scenario_list:
        raise ConfigError("scenarios", "is empty", "Pass at least one scenario")
    groups = await gather_trajectory_groups(
        (
            TrajectoryGroup(
                mcp_rollout(model, scenario, sessions, config) for _ in range(rollouts_per_scenario)
            )
            for scenario in scenario_list
        ),
        pbar_desc=pbar_desc,
        max_exceptions=max_exceptions,
        # scored as each group finishes, so the bar shows rewards, not the rollouts' 0
        after_each=lambda group: _score(scorer, group),
    )
    return MCPEvaluation(
        [
            ScenarioResult(scenario, group.trajectories, group.exceptions)
            for scenario, group in zip(scenario_list, groups, strict=True)
        ]
    )


async def _score(scorer: Scorer, group: TrajectoryGroup) -> TrajectoryGroup:
    """The scored group; one the scorer drops (returns None) keeps no trajectories."""
    if not group.trajectories:
        return group
    scored = await scorer(group)
    if scored is None:
        return TrajectoryGroup(exceptions=group.exceptions)
    return scored
