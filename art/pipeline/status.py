"""`StatusReporter`: what a running PipelineTrainer shows, as ART's reporter is driven.

The trainer tells the reporter what happens through its `note_*` methods (a rollout
started or finished, a group queued or taken, groups dropped, a step trained, an
evaluation run); the reporter keeps the counts and shows them two ways:

- a tqdm bar of the steps trained, its postfix the current counts;
- a status line, `[pipeline] key=value ...`, printed by `log_if_due()` once every
  `log_interval_seconds` (and by `flush()` at once), so a log file shows it too.

What the line shows:

- `step`: the newest step trained (or the step the run started from).
- `rollouts`: rollouts running now / rollout workers.
- `queued`: finished groups waiting for the trainer (their rollouts in brackets).
- `training`: groups in the step being trained now (0 between steps).
- `trained`: groups trained on, over this run.
- `dropped`: groups not trained on: sampled too many steps ago (stale), rewards all
  equal (no-var), and rollouts whose `rollout_fn` raised (errored).
- `staleness`: mean/max steps between sampling and training, in the last batch.
- `scenarios`: scenarios taken from the iterator / `total_scenarios`.
- `reward_ewa`, `step_seconds_ewa`, `reward_std_ewa`: exponentially weighted averages
  (weight `status_ewa_alpha` on the newest step) of each step's mean reward, its
  seconds from starting to collect the batch to the end of training, and the mean of
  its groups' reward standard deviations.
- `val`: the last evaluation's mean `val` reward and its step, and the step of the one
  running now.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from ..core.data.errors import ConfigError
from ..core.data.trajectories import TrajectoryGroup
from ._staleness import has_no_variance, staleness_metrics


@dataclass(frozen=True)
class StatusSnapshot:
    """The counts a `StatusReporter` holds at one moment; `None`: not known yet."""

    step: int | None
    rollouts_in_flight: int
    workers: int
    queued: int
    queued_rollouts: int
    training: int
    trained: int
    stale: int
    zero_variance: int
    errored: int
    scenarios: int
    total_scenarios: int | None
    staleness_mean: float | None
    staleness_max: float | None
    reward_ewa: float | None
    step_seconds_ewa: float | None
    reward_std_ewa: float | None
    val_step: int | None
    val_reward: float | None
    val_running_step: int | None

    def fields(self) -> dict[str, str]:
        """The status line's `key=value` pairs, in order; unknown values are left out."""
        shown: dict[str, str] = {}
        if self.step is not None:
            shown["step"] = str(self.step)
        shown["rollouts"] = f"{self.rollouts_in_flight}/{self.workers}"
        shown["queued"] = f"{self.queued} ({self.queued_rollouts} rollouts)"
        shown["training"] = str(self.training)
        shown["trained"] = str(self.trained)
        shown["dropped"] = (
            f"{self.stale} stale, {self.zero_variance} no-var, {self.errored} errored"
        )
        if self.staleness_mean is not None and self.staleness_max is not None:
            shown["staleness"] = f"{self.staleness_mean:.2f}/{self.staleness_max:.0f}"
        total = "" if self.total_scenarios is None else f"/{self.total_scenarios}"
        shown["scenarios"] = f"{self.scenarios}{total}"
        if self.reward_ewa is not None:
            shown["reward_ewa"] = f"{self.reward_ewa:.3f}"
        if self.step_seconds_ewa is not None:
            shown["step_seconds_ewa"] = f"{self.step_seconds_ewa:.2f}"
        if self.reward_std_ewa is not None:
            shown["reward_std_ewa"] = f"{self.reward_std_ewa:.3f}"
        if self.val_step is not None:
            reward = "n/a" if self.val_reward is None else f"{self.val_reward:.3f}"
            shown["val"] = f"{reward}@{self.val_step}"
        if self.val_running_step is not None:
            shown["val_running"] = str(self.val_running_step)
        return shown

    def line(self) -> str:
        """The status line `log_if_due` prints."""
        return "[pipeline] " + " ".join(f"{key}={value}" for key, value in self.fields().items())


class StatusReporter:
    """Counts what a PipelineTrainer does and shows it as a bar and a periodic line.

    Args (keyword-only, as ART's):
        get_scenario_offset: returns how many scenarios have been taken so far.
        log_interval_seconds: seconds between status lines (> 0).
        status_ewa_alpha: weight of the newest step in the averages, in (0, 1].
        total_scenarios: the number of scenarios, shown beside the count taken (>= 0).
        num_workers: rollout workers, shown beside the rollouts running (>= 1).
        total_steps: ours, not ART's: the steps the bar counts up to (None: unknown).
    """

    def __init__(
        self,
        *,
        get_scenario_offset: Callable[[], int],
        log_interval_seconds: float = 60.0,
        status_ewa_alpha: float = 0.2,
        total_scenarios: int | None = None,
        num_workers: int = 1,
        total_steps: int | None = None,
    ) -> None:
        if not callable(get_scenario_offset):
            raise ConfigError(
                "get_scenario_offset",
                f"is a {type(get_scenario_offset).__name__}, not a callable",
                "Pass a function returning the number of scenarios taken so far",
            )
        if log_interval_seconds <= 0:
            raise ConfigError(
                "log_interval_seconds", f"is {log_interval_seconds}", "Use a value > 0"
            )
        if not 0 < status_ewa_alpha <= 1:
            raise ConfigError("status_ewa_alpha", f"is {status_ewa_alpha}", "Use a value in (0, 1]")
        if total_scenarios is not None and total_scenarios < 0:
            raise ConfigError(
                "total_scenarios", f"is {total_scenarios}", "Use a value >= 0, or None"
            )
        if num_workers < 1:
            raise ConfigError("num_workers", f"is {num_workers}", "Use a value >= 1")
        if total_steps is not None and total_steps < 0:
            raise ConfigError("total_steps", f"is {total_steps}", "Use a value >= 0, or None")
        self.get_scenario_offset = get_scenario_offset
        self.log_interval_seconds = log_interval_seconds
        self.status_ewa_alpha = status_ewa_alpha
        self.total_scenarios = total_scenarios
        self.num_workers = num_workers
        self.total_steps = total_steps

        self._step: int | None = None
        self._rollouts_in_flight = 0
        self._queued = 0
        self._queued_rollouts = 0
        self._training = 0
        self._trained = 0
        self._stale = 0
        self._zero_variance = 0
        self._errored = 0
        self._staleness: dict[str, float] = {}
        self._reward_ewa: float | None = None
        self._step_seconds_ewa: float | None = None
        self._reward_std_ewa: float | None = None
        self._val_step: int | None = None
        self._val_reward: float | None = None
        self._val_running_step: int | None = None

        self._started = False
        self._bar: tqdm[Any] | None = None
        self._bar_first_step: int | None = None  # the step the bar counts from
        self._last_line = 0.0

    # --- the run ----------------------------------------------------------------------

    def start(self, *, initial_step: int | None = None) -> None:
        """Open the bar; the first `log_if_due()` prints a line. A second call does nothing."""
        if self._started:
            return
        self._started = True
        if initial_step is not None:
            self._step = initial_step
        self._bar_first_step = self._step
        self._bar = tqdm(total=self.total_steps, desc="pipeline steps", unit="step")
        self._last_line = time.monotonic() - self.log_interval_seconds
        self._refresh()

    def close(self) -> None:
        """Close the bar; `start()` may open a new one."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._started = False

    def flush(self) -> None:
        """Print the status line now."""
        self.log_if_due(force=True)

    def set_step(self, step: int) -> None:
        """The newest step trained (or resumed from)."""
        self._step = step
        self._refresh()

    def log_if_due(self, *, force: bool = False) -> None:
        """Print the status line if `log_interval_seconds` have passed (or `force`)."""
        if not self._started:
            return
        now = time.monotonic()
        if not force and now - self._last_line < self.log_interval_seconds:
            return
        self._last_line = now
        line = self.snapshot().line()
        (self._bar.write if self._bar is not None else print)(line)

    def snapshot(self) -> StatusSnapshot:
        """The counts now."""
        return StatusSnapshot(
            step=self._step,
            rollouts_in_flight=self._rollouts_in_flight,
            workers=self.num_workers,
            queued=self._queued,
            queued_rollouts=self._queued_rollouts,
            training=self._training,
            trained=self._trained,
            stale=self._stale,
            zero_variance=self._zero_variance,
            errored=self._errored,
            scenarios=self.get_scenario_offset(),
            total_scenarios=self.total_scenarios,
            staleness_mean=self._staleness.get("staleness_mean"),
            staleness_max=self._staleness.get("staleness_max"),
            reward_ewa=self._reward_ewa,
            step_seconds_ewa=self._step_seconds_ewa,
            reward_std_ewa=self._reward_std_ewa,
            val_step=self._val_step,
            val_reward=self._val_reward,
            val_running_step=self._val_running_step,
        )

    # --- what happened ----------------------------------------------------------------

    def note_rollout_started(self) -> None:
        """A rollout began."""
        self._rollouts_in_flight += 1
        self._refresh()

    def note_rollout_finished(self, *, errored: bool) -> None:
        """A rollout ended; `errored`: its `rollout_fn` raised."""
        self._rollouts_in_flight = max(self._rollouts_in_flight - 1, 0)
        self._errored += int(errored)
        self._refresh()

    def note_group_enqueued(self, group: TrajectoryGroup) -> None:
        """A finished group went into the queue."""
        self._queued += 1
        self._queued_rollouts += len(group.trajectories)
        self._refresh()

    def note_group_dequeued(self, group: TrajectoryGroup) -> None:
        """The trainer took a group from the queue."""
        self._queued = max(self._queued - 1, 0)
        self._queued_rollouts = max(self._queued_rollouts - len(group.trajectories), 0)
        self._refresh()

    def note_stale(self, count: int) -> None:
        """`count` groups were dropped as sampled too many steps ago."""
        self._stale += max(count, 0)
        self._refresh()

    def note_zero_variance_discarded(self, count: int) -> None:
        """`count` groups were dropped because their rewards were all equal."""
        self._zero_variance += max(count, 0)
        self._refresh()

    def note_training_start(self, group_count: int) -> None:
        """A step began training on `group_count` groups."""
        self._training = group_count
        self._refresh()

    def note_training_end(self) -> None:
        """The step being trained finished (or failed)."""
        self._training = 0
        self._refresh()

    def note_training_batch(
        self, batch: list[TrajectoryGroup], *, step: int, step_seconds: float
    ) -> None:
        """`batch` was trained, making `step`, in `step_seconds`.

        Its groups with reward variance count as trained, the others as no-var; the
        averages take the batch's mean reward, `step_seconds` and mean group reward std.
        """
        no_variance = sum(1 for group in batch if has_no_variance(group))
        self._trained += len(batch) - no_variance
        self._zero_variance += no_variance
        rewards = [t.reward for group in batch for t in group.trajectories]
        if rewards:
            self._reward_ewa = self._average(self._reward_ewa, sum(rewards) / len(rewards))
        self._step_seconds_ewa = self._average(self._step_seconds_ewa, step_seconds)
        if batch:
            std = sum(_reward_std(group) for group in batch) / len(batch)
            self._reward_std_ewa = self._average(self._reward_std_ewa, std)
        # the batch trained at the step before the one it made
        self._staleness = staleness_metrics(batch, step - 1)
        self._step = step
        self._refresh()

    def note_val_started(self, step: int) -> None:
        """An evaluation of `step` began."""
        self._val_running_step = step
        self._refresh()

    def note_val_finished(self, step: int, reward: float | None) -> None:
        """The evaluation of `step` ended; `reward`: its mean `val` reward (None: none)."""
        self._val_step = step
        self._val_reward = reward
        if self._val_running_step == step:
            self._val_running_step = None
        self._refresh()

    # --- helpers ----------------------------------------------------------------------

    def _average(self, previous: float | None, value: float) -> float:
        if previous is None:
            return value
        return self.status_ewa_alpha * value + (1 - self.status_ewa_alpha) * previous

    def _refresh(self) -> None:
        """Bring the bar up to the newest step and its postfix up to the counts."""
        if self._bar is None:
            return
        if self._step is not None:
            if self._bar_first_step is None:
                self._bar_first_step = self._step
            behind = self._step - self._bar_first_step - self._bar.n
            if behind > 0:
                self._bar.update(behind)
        self._bar.set_postfix(self.snapshot().fields(), refresh=False)


def _reward_std(group: TrajectoryGroup) -> float:
    """The population standard deviation of a group's rewards (0 for fewer than two)."""
    rewards = [t.reward for t in group.trajectories]
    if len(rewards) < 2:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))


__all__ = ["StatusReporter", "StatusSnapshot"]
