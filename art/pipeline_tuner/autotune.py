"""The pipeline tuner's decisions (ART 0.5.23's rules), as plain functions of measurements.

Every `window_steps` training steps (after `warmup_ignore_steps`) the tuner reads what the
pipeline reported for those steps and classifies each side:

- **trainer**: its underfeed score is the fraction of step wall time spent collecting the
  batch (`time/step_collect_batch_s / time/step_wall_s`): above `trainer_load_under_score`
  the trainer starves ("train_under"), at or below `trainer_load_over_score` it is busy.
- **inference**: the request-seconds waiting for engine capacity over the request-seconds
  running, from samples given to `on_vllm_pressure_sample`; above
  `vllm_pressure_over_ratio` it is over, at or below `vllm_pressure_under_ratio` under.
  Without samples it is "inference_unmeasured" and counts as balanced.

Then, in order: a stale backlog (the fraction of groups dropped as stale reaches
`stale_high_frac`, until it falls to `stale_clear_frac`) raises `min_batch_size` or else
removes workers; both sides loaded plus completed groups waiting for queue room
(`queue_put_severe_frac` of rollout time) removes workers; a starving trainer with
inference not over adds workers. Worker moves need `worker_load_change_windows`
windows in a row and move by `worker_move_fraction` of the count, in multiples of
`worker_step`, at most `max_worker_move`, within `max_rollout_workers` and the freshness
limit (`freshness_worker_limit`). `min_batch_size` is tried lower when the trainer starves
and workers are not being added, kept only if collection time improves, and raised when
the trainer is fed. Settled windows produce recommendations (a `UserWarning` each, once).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections import defaultdict
from collections.abc import Sequence

import pydantic

from .config import (
    PackedGroupObservation,
    PipelineAutotuneConfig,
    PipelineAutotunerProfile,
    PipelineMetric,
    PipelineTuneSettings,
    TunerDecision,
    TunerWindowStats,
)

STEP_METRICS = (
    "time/step_wall_s",
    "time/step_collect_batch_s",
    "time/step_rollout_s",
    "queue/put_wait_s",
    "data/step_num_groups_trainable",
    "discarded/step/stale_groups",
    "discarded/step/zero_variance_groups",
)
"""What the pipeline reports for every step, before `objective/score` closes the step."""

DECISION_METRIC = "objective/score"


class PackingProjection(pydantic.BaseModel):
    """A candidate target batch and its projected spill probability (ART's packing model)."""

    groups: int
    spill_probability: float


class PackingOutcome(pydantic.BaseModel):
    """How many packed sequences a step's groups took."""

    step: int
    groups: int = pydantic.Field(ge=1)
    packed_sequences: int = pydantic.Field(ge=1)


def _multiple_up(value: float, multiple: int, minimum: int = 1) -> int:
    return max(minimum, math.ceil(value / multiple) * multiple)


def _multiple_nearest(value: float, multiple: int, minimum: int = 1) -> int:
    return max(minimum, math.floor(value / multiple + 0.5) * multiple)


def freshness_worker_limit(
    *,
    target_groups_per_step: int,
    limit_steps_off_policy: float,
    running_reserve_fraction: float,
    worker_step: int,
) -> int | None:
    """Most workers whose rollouts in flight still leave one batch within the age limit.

    Completed work may hold `target x max(1, limit)` groups; one batch of it is queued, the
    rest is the running reserve, of which `running_reserve_fraction` counts per worker.
    None when the fraction is 0 (no limit).
    """
    if running_reserve_fraction <= 0.0:
        return None
    target = max(1, target_groups_per_step)
    completed = math.floor(target * max(1.0, limit_steps_off_policy))
    limit = math.floor((completed - target) / running_reserve_fraction)
    step = max(1, worker_step)
    return max(1, (limit // step) * step)


def recommended_queue_size(*, target_groups_per_step: int) -> int:
    """One target batch of completed groups."""
    return max(1, target_groups_per_step)


def build_initial_settings(
    *,
    config: PipelineAutotuneConfig,
    inference_gpu_count: int,
    target_packed_sequences: int,
    policy_age_limit_steps: float,
    rollout_worker_capacity: int | None,
) -> PipelineTuneSettings:
    """The settings a tuning run starts from when no profile is given."""
    slots = max(1, target_packed_sequences)
    target = config.initial_max_groups_per_packed_sequence * slots
    min_batch = min(config.initial_min_groups_per_packed_sequence * slots, target)
    min_batch = max(min_batch, math.ceil(target * config.freshness_min_batch_floor_fraction))
    workers = min(
        config.max_rollout_workers,
        _multiple_up(
            config.initial_model_calls_per_inference_gpu * inference_gpu_count,
            config.worker_step,
            minimum=config.worker_step,
        ),
    )
    limit = freshness_worker_limit(
        target_groups_per_step=target,
        limit_steps_off_policy=policy_age_limit_steps,
        running_reserve_fraction=config.queue_running_reserve_fraction,
        worker_step=config.worker_step,
    )
    if limit is not None:
        workers = min(workers, limit)
    if rollout_worker_capacity is not None:
        workers = min(workers, rollout_worker_capacity)
    return PipelineTuneSettings(
        num_rollout_workers=workers,
        min_batch_size=min_batch,
        max_batch_size=target,
        queue_maxsize=recommended_queue_size(target_groups_per_step=target),
        target_groups_per_step=target,
    )


def inference_pressure(
    samples: Sequence[tuple[float, float, float]],
    *,
    window_start_s: float,
    window_end_s: float,
    max_age_s: float,
) -> tuple[float, float, float, int] | None:
    """(waiting-for-capacity request-seconds, running request-seconds, seconds covered,
    samples used) over the window.

    Each `(t_s, running, waiting_capacity)` sample holds until the next one, at most
    `max_age_s`. None when no sample covers the window.
    """
    times = sorted({t for t, _, _ in samples})
    values = {t: (running, waiting) for t, running, waiting in samples}
    waiting_s = running_s = covered = 0.0
    used = 0
    for index, t in enumerate(times):
        following = times[index + 1] if index + 1 < len(times) else math.inf
        start, end = max(t, window_start_s), min(following, t + max_age_s, window_end_s)
        if end <= start:
            continue
        running, waiting = values[t]
        waiting_s += max(0.0, waiting) * (end - start)
        running_s += max(0.0, running) * (end - start)
        covered += end - start
        used += 1
    return (waiting_s, running_s, covered, used) if covered > 0.0 else None


def pressure_ratio(waiting_request_s: float, running_request_s: float) -> float:
    """Waiting over running request-seconds; infinite when requests only waited."""
    if running_request_s > 0.0:
        return waiting_request_s / running_request_s
    return math.inf if waiting_request_s > 0.0 else 0.0


class PipelineAutotuner:
    """Decides new `PipelineTuneSettings` from the pipeline's measurements.

    Feed it `on_metric` (each step's `STEP_METRICS`, then `objective/score`, which may
    return a `TunerDecision`) and, where an engine gauge exists, `on_vllm_pressure_sample`.
    """

    def __init__(
        self,
        *,
        config: PipelineAutotuneConfig,
        settings: PipelineTuneSettings,
        model_name: str | None,
        backend_name: str | None,
        packed_sequence_length: int,
        target_packed_sequences: int,
        inference_gpu_count: int,
        policy_age_limit_steps: float,
        starting_step: int = 0,
        rollout_worker_capacity: int | None = None,
    ) -> None:
        if rollout_worker_capacity is not None and rollout_worker_capacity < 1:
            raise ValueError("rollout_worker_capacity must be >= 1")
        if rollout_worker_capacity is not None and (
            settings.num_rollout_workers > rollout_worker_capacity
        ):
            raise ValueError("settings.num_rollout_workers exceeds rollout_worker_capacity")
        self.config = config
        self.settings = settings
        self.model_name = model_name
        self.backend_name = backend_name
        self.packed_sequence_length = packed_sequence_length
        self.target_packed_sequences = max(1, target_packed_sequences)
        self.inference_gpu_count = inference_gpu_count
        self.policy_age_limit_steps = policy_age_limit_steps
        self.rollout_worker_capacity = rollout_worker_capacity
        self.metrics: list[PipelineMetric] = []
        self.vllm_pressure_samples: list[tuple[float, float, float]] = []
        self.packed_groups: list[PackedGroupObservation] = []
        self.decisions: list[TunerDecision] = []
        self._last_decision_step = starting_step + config.warmup_ignore_steps
        self._warmup_end_step = self._last_decision_step
        self._worker_direction = 0  # the worker move awaiting evidence, and for how long
        self._worker_windows = 0
        self._stale_backlog = False
        self._trial_collect_s: float | None = None  # a lowered min batch under trial
        self._trial_min_batch: int | None = None
        self._trial_failures = 0
        self._warned: set[str] = set()

    # --- input ------------------------------------------------------------------------

    def on_metric(self, rec: PipelineMetric) -> TunerDecision | None:
        """Record one measurement; `objective/score` of a step may decide."""
        self.metrics.append(rec)
        if rec.name != DECISION_METRIC or rec.step is None:
            return None
        return self.maybe_decide(rec.step)

    def on_vllm_pressure_sample(
        self, *, t_s: float, running: float, waiting_capacity: float
    ) -> None:
        """One engine gauge reading: requests running, requests waiting for capacity."""
        self.vllm_pressure_samples.append((t_s, running, waiting_capacity))

    def on_packed_group(self, rec: PackedGroupObservation) -> None:
        """Kept for the profile; ours does not adapt the target batch from packing."""
        self.packed_groups.append(rec)

    # --- deciding ---------------------------------------------------------------------

    def maybe_decide(self, step: int) -> TunerDecision | None:
        """A decision once a full window of steps after the last one has reported."""
        if step <= self._warmup_end_step:
            return None
        if step - self._last_decision_step < self.config.window_steps:
            return None
        stats = self.window_stats()
        if stats is None or stats.end_step <= self._last_decision_step:
            return None
        decision = self.decide(stats)
        self._last_decision_step = stats.end_step
        self.decisions.append(decision)
        self._recommend(decision)
        self.settings = decision.updated
        cutoff = stats.window_end_s - 2.0 * self.config.vllm_metric_interval_s
        self.metrics = [m for m in self.metrics if m.step is not None and m.step > stats.end_step]
        self.vllm_pressure_samples = [s for s in self.vllm_pressure_samples if s[0] >= cutoff]
        return decision

    def window_stats(self) -> TunerWindowStats | None:
        """The last `window_steps` complete steps' measurements, or None before there are."""
        by_step: dict[int, dict[str, PipelineMetric]] = defaultdict(dict)
        for rec in self.metrics:
            if rec.step is not None and rec.step > self._warmup_end_step:
                by_step[rec.step][rec.name] = rec
        steps = sorted(s for s, values in by_step.items() if DECISION_METRIC in values)
        if len(steps) < self.config.window_steps:
            return None
        window = steps[-self.config.window_steps :]

        def total(name: str) -> float:
            missing = [s for s in window if name not in by_step[s]]
            if missing:
                raise RuntimeError(
                    f"the pipeline tuner needs metric {name!r} for every step of its "
                    f"window; steps {missing} lack it"
                )
            return sum(by_step[s][name].value for s in window)

        wall, collect = total("time/step_wall_s"), total("time/step_collect_batch_s")
        rollout_s, put_wait_s = total("time/step_rollout_s"), total("queue/put_wait_s")
        trained = total("data/step_num_groups_trainable")
        stale = total("discarded/step/stale_groups")
        no_variance = total("discarded/step/zero_variance_groups")
        predicted = [
            by_step[s]["queue/predicted_stale_fraction"].value
            for s in window
            if "queue/predicted_stale_fraction" in by_step[s]
        ]
        end_s = max(rec.t_s for s in window for rec in by_step[s].values())
        start_s = end_s - wall
        pressure = inference_pressure(
            self.vllm_pressure_samples,
            window_start_s=start_s,
            window_end_s=end_s,
            max_age_s=2.0 * self.config.vllm_metric_interval_s,
        )
        waiting_s, running_s, covered_s, used = pressure or (0.0, 0.0, 0.0, 0)
        return TunerWindowStats(
            start_step=window[0],
            end_step=window[-1],
            window_start_s=start_s,
            window_end_s=end_s,
            collect_batch_s=collect / len(window),
            trainer_underfeed_score=collect / wall if wall > 0 else 0.0,
            vllm_pressure=pressure_ratio(waiting_s, running_s),
            vllm_waiting_capacity_request_s=waiting_s,
            vllm_running_request_s=running_s,
            queue_put_wait_frac=put_wait_s / max(put_wait_s + rollout_s, 1e-9),
            predicted_stale_frac=statistics.fmean(predicted) if predicted else 0.0,
            actual_stale_frac=stale / max(trained + stale + no_variance, 1.0),
            vllm_poll_samples=used,
            vllm_poll_successes=used,
            vllm_poll_coverage=covered_s / wall if wall > 0 else 0.0,
        )

    def decide(self, stats: TunerWindowStats) -> TunerDecision:
        """The decision for one window's `stats` (updates the tuner's hysteresis state)."""
        cfg = self.config
        measured = stats.vllm_poll_samples > 0
        inference_over = measured and stats.vllm_pressure > cfg.vllm_pressure_over_ratio
        inference_under = measured and stats.vllm_pressure <= cfg.vllm_pressure_under_ratio
        train_under = stats.trainer_underfeed_score > cfg.trainer_load_under_score
        train_over = stats.trainer_underfeed_score <= cfg.trainer_load_over_score
        inference = (
            "inference_unmeasured"
            if not measured
            else "inference_over"
            if inference_over
            else "inference_under"
            if inference_under
            else "inference_balanced"
        )
        trainer = "train_under" if train_under else "train_over" if train_over else "train_balanced"
        state = f"{inference}_{trainer}"
        previous = self.settings
        updated = previous
        action, reason = "hold", "inside hysteresis band or already balanced"
        wanted = "hold"
        severe_put_wait = stats.queue_put_wait_frac >= cfg.queue_put_severe_frac

        if self._update_stale_backlog(stats):
            self._forget_worker_move()
            if updated.min_batch_size < updated.max_batch_size:
                updated = self._with_min_batch(updated, self._raised_min_batch(updated))
                action = "raise_min_batch_size"
                reason = "stale backlog requires dense batches before reducing workers"
            else:
                updated = self._with_workers(updated, -1)
                action = "decrease_workers"
                reason = "predicted or actual stale backlog exceeds the freshness target"
        else:
            if inference_over and train_over and severe_put_wait:
                wanted = "decrease_workers"
                if self._worker_move_ready(-1):
                    updated, action = self._with_workers(updated, -1), wanted
                    reason = "sustained inference pressure plus queue backpressure: excess workers"
                else:
                    reason = self._awaiting("decrease")
            elif severe_put_wait:
                self._forget_worker_move()
                reason = "completed-group queue backpressure is active"
            elif train_under and not inference_over:
                wanted = "increase_workers"
                if self._worker_move_ready(+1):
                    updated, action = self._with_workers(updated, +1), wanted
                    reason = "trainer is underfed and inference is not saturated"
                else:
                    reason = self._awaiting("increase")
            else:
                self._forget_worker_move()
                if inference_over and train_over:
                    reason = "both sides are loaded; no throughput-safe online change"
            change = self._min_batch_change(
                updated, stats, wanted if wanted == "increase_workers" else action, inference_over
            )
            if change is not None:
                self._forget_worker_move()
                updated, action, reason = change

        limit = freshness_worker_limit(
            target_groups_per_step=updated.target_groups_per_step,
            limit_steps_off_policy=self.policy_age_limit_steps,
            running_reserve_fraction=cfg.queue_running_reserve_fraction,
            worker_step=cfg.worker_step,
        )
        if limit is not None and updated.num_rollout_workers > limit:
            updated = updated.model_copy(update={"num_rollout_workers": limit})
            if previous.num_rollout_workers > limit:
                self._forget_worker_move()
                action, reason = "decrease_workers", "running rollouts exceed the policy-age budget"
        if updated == previous:
            action = "hold"
        return TunerDecision(
            step=stats.end_step,
            state=state,
            action=action,
            reason=reason,
            previous=previous,
            updated=updated,
            stats=stats,
        )

    # --- the parts of a decision --------------------------------------------------------

    def _update_stale_backlog(self, stats: TunerWindowStats) -> bool:
        fractions = (stats.predicted_stale_frac, stats.actual_stale_frac)
        if self._stale_backlog:
            self._stale_backlog = any(f > self.config.stale_clear_frac for f in fractions)
        else:
            self._stale_backlog = any(f >= self.config.stale_high_frac for f in fractions)
        return self._stale_backlog

    def _worker_move_ready(self, direction: int) -> bool:
        if self._worker_direction == direction:
            self._worker_windows += 1
        else:
            self._worker_direction, self._worker_windows = direction, 1
        if self._worker_windows < self.config.worker_load_change_windows:
            return False
        self._forget_worker_move()
        return True

    def _awaiting(self, direction: str) -> str:
        return (
            f"worker {direction} awaits sustained evidence "
            f"({self._worker_windows}/{self.config.worker_load_change_windows})"
        )

    def _forget_worker_move(self) -> None:
        self._worker_direction, self._worker_windows = 0, 0

    def _with_workers(self, settings: PipelineTuneSettings, direction: int) -> PipelineTuneSettings:
        cfg = self.config
        current = settings.num_rollout_workers
        move = max(
            cfg.worker_step, _multiple_nearest(current * cfg.worker_move_fraction, cfg.worker_step)
        )
        move = min(move, _multiple_up(cfg.max_worker_move, cfg.worker_step))
        floor = min(cfg.worker_step, self.rollout_worker_capacity or cfg.worker_step)
        workers = min(max(floor, current + direction * move), cfg.max_rollout_workers)
        if self.rollout_worker_capacity is not None:
            workers = min(workers, self.rollout_worker_capacity)
        return settings.model_copy(update={"num_rollout_workers": workers})

    def _raised_min_batch(self, settings: PipelineTuneSettings) -> int:
        grown = max(settings.min_batch_size + 1, round(settings.min_batch_size * 1.15))
        return min(settings.max_batch_size, grown)

    @staticmethod
    def _with_min_batch(settings: PipelineTuneSettings, value: int) -> PipelineTuneSettings:
        return settings.model_copy(update={"min_batch_size": value})

    def _min_batch_change(
        self,
        settings: PipelineTuneSettings,
        stats: TunerWindowStats,
        action: str,
        inference_over: bool,
    ) -> tuple[PipelineTuneSettings, str, str] | None:
        cfg = self.config
        fed = (
            not inference_over
            and stats.trainer_underfeed_score <= cfg.trainer_min_batch_raise_score
        )
        if self._trial_collect_s is not None:  # judge the lowered min batch under trial
            baseline = self._trial_collect_s
            if settings.min_batch_size != self._trial_min_batch:
                self._end_trial()
            elif fed:
                self._end_trial()
                return self._raise(
                    settings, "trainer collection idle fell below the min-batch threshold"
                )
            elif stats.collect_batch_s >= baseline * cfg.min_batch_collect_improvement_ratio:
                if inference_over:
                    return None
                self._trial_failures += 1
                if self._trial_failures >= cfg.min_batch_trial_windows:
                    self._end_trial()
                    return self._raise(
                        settings, "smaller batches did not reduce collection time enough"
                    )
                return None
            else:
                self._end_trial()
        if (
            action != "increase_workers"
            and stats.trainer_underfeed_score > cfg.trainer_min_batch_lower_score
        ):
            floor = max(
                1,
                math.ceil(settings.target_groups_per_step * cfg.freshness_min_batch_floor_fraction),
            )
            lowered = max(floor, round(settings.min_batch_size * 0.85))
            if lowered < settings.min_batch_size:
                self._trial_collect_s, self._trial_min_batch = stats.collect_batch_s, lowered
                self._trial_failures = 0
                return (
                    self._with_min_batch(settings, lowered),
                    "lower_min_batch_size",
                    "trainer is severely underfed and rollout workers are not being increased",
                )
        if fed:
            return self._raise(
                settings, "trainer collection idle is low enough to use denser batches"
            )
        return None

    def _raise(
        self, settings: PipelineTuneSettings, reason: str
    ) -> tuple[PipelineTuneSettings, str, str] | None:
        if settings.min_batch_size >= settings.max_batch_size:
            return None
        return (
            self._with_min_batch(settings, self._raised_min_batch(settings)),
            "raise_min_batch_size",
            reason,
        )

    def _end_trial(self) -> None:
        self._trial_collect_s, self._trial_min_batch, self._trial_failures = None, None, 0

    # --- recommendations and the profile ---------------------------------------------

    def _recommend(self, decision: TunerDecision) -> None:
        """Once the last `recommendation_consecutive_holds` decisions held, say what only
        the user can change (more inference or training hardware, bigger groups)."""
        cfg = self.config
        recent = self.decisions[-cfg.recommendation_consecutive_holds :]
        if (
            len(self.decisions) < cfg.recommendation_min_windows
            or any(d.action != "hold" for d in recent)
            or len(recent) < cfg.recommendation_consecutive_holds
        ):
            return
        keys = set.intersection(*(set(self._advice(d)) for d in recent))
        for key in sorted(keys):
            message = self._advice(decision)[key]
            decision.recommendations.append(message)
            if key not in self._warned:
                self._warned.add(key)
                warnings.warn(message, UserWarning, stacklevel=3)

    def _advice(self, decision: TunerDecision) -> dict[str, str]:
        stats = decision.stats
        if stats is None or stats.vllm_poll_samples == 0:
            return {}
        cfg = self.config
        advice: dict[str, str] = {}
        if (
            stats.vllm_pressure > cfg.vllm_pressure_over_ratio
            and stats.trainer_underfeed_score >= cfg.trainer_load_severe_under_score
        ):
            advice["increase_inference_gpus"] = (
                "pipeline tuner: inference is saturated while the trainer is severely "
                "underfed; give inference more devices if you can"
            )
        if (
            stats.vllm_pressure <= cfg.vllm_pressure_under_ratio
            and stats.trainer_underfeed_score <= cfg.trainer_load_over_score
        ):
            advice["increase_group_size_or_training_gpus"] = (
                "pipeline tuner: inference has spare capacity while the trainer is "
                "saturated; use larger rollout groups, or give training more devices"
            )
        return advice

    def profile(self) -> PipelineAutotunerProfile:
        """What this run learned, to save and start a later run from."""
        seen: dict[str, None] = {}
        for decision in self.decisions:
            seen.update(dict.fromkeys(decision.recommendations))
        return PipelineAutotunerProfile(
            model_name=self.model_name,
            backend=self.backend_name,
            packed_sequence_length=self.packed_sequence_length,
            target_packed_sequences=self.target_packed_sequences,
            inference_gpu_count=self.inference_gpu_count,
            rollout_worker_capacity=self.rollout_worker_capacity,
            policy_age_limit_steps=self.policy_age_limit_steps,
            settings=self.settings,
            config=self.config,
            decisions=self.decisions,
            notes=[
                "The first warmup_ignore_steps steps are left out of every decision.",
                "The target batch (max_batch_size) and queue_maxsize stay at their start.",
                *seen,
            ],
        )


__all__ = [
    "DECISION_METRIC",
    "STEP_METRICS",
    "PackingOutcome",
    "PackingProjection",
    "PipelineAutotuner",
    "build_initial_settings",
    "freshness_worker_limit",
    "inference_pressure",
    "pressure_ratio",
    "recommended_queue_size",
]
