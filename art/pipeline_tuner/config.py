"""The pipeline tuner's typed settings, measurements and saved profile (ART 0.5.23's names).

`PipelineAutotuneConfig` is what a user passes as `PipelineTrainer(autotune=...)`;
`PipelineTuneSettings` is what the tuner sets on the running pipeline; a
`PipelineAutotunerProfile` is what it saves (art.pipeline_tuner.store) and can start from.
"""

from __future__ import annotations

from array import array
from typing import Literal

import pydantic


class PipelineRuntimeConfig(pydantic.BaseModel):
    """PipelineTrainer's concurrency, chosen by hand (ART 0.5.23's defaults)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    num_rollout_workers: int = pydantic.Field(default=16, ge=1)
    min_batch_size: int = pydantic.Field(default=4, ge=1)
    max_batch_size: int | None = pydantic.Field(default=None, ge=1)
    queue_maxsize: int | None = pydantic.Field(default=None, ge=1)
    score_reference_groups_per_step: float | None = pydantic.Field(default=8.0, gt=0.0)
    score_reference_rollouts_per_group: float | None = pydantic.Field(default=None, gt=0.0)

    @pydantic.model_validator(mode="after")
    def _batch_bounds(self) -> PipelineRuntimeConfig:
        if self.max_batch_size is not None and self.max_batch_size < self.min_batch_size:
            raise ValueError("max_batch_size must be >= min_batch_size")
        return self


class PipelineAutotuneConfig(pydantic.BaseModel):
    """How PipelineTrainer tunes its own concurrency while it runs.

    `mode`: "off" (hand settings), "online" (start from `build_initial_settings` or from
    `profile`, measure every `window_steps` steps and move the settings, saving the profile
    as `output_name` after each decision), "profile" (start from a saved profile, no moves).
    See `art.pipeline_tuner.autotune` for the decision rules each threshold feeds, and
    `UNMEASURED_FIELDS` for the fields this version honours only at their defaults.
    """

    mode: Literal["off", "online", "profile"] = "off"
    profile: str | None = None
    output_name: str = "latest"
    window_steps: int = pydantic.Field(default=4, ge=1)
    warmup_ignore_steps: int = pydantic.Field(default=3, ge=0)
    target_spill_probability: float = pydantic.Field(default=0.03, ge=0.0, le=1.0)
    worker_step: int = pydantic.Field(default=2, ge=1)
    worker_move_fraction: float = pydantic.Field(default=0.10, gt=0.0, le=1.0)
    worker_load_change_windows: int = pydantic.Field(default=2, ge=1)
    max_worker_move: int = pydantic.Field(default=16, ge=4)
    max_rollout_workers: int = pydantic.Field(default=1024, ge=1)
    initial_model_calls_per_inference_gpu: int = pydantic.Field(default=8, ge=1)
    initial_min_groups_per_packed_sequence: int = pydantic.Field(default=8, ge=1)
    initial_max_groups_per_packed_sequence: int = pydantic.Field(default=8, ge=1)
    packing_trials: int = pydantic.Field(default=48, ge=16)
    packing_reservoir_multiplier: int = pydantic.Field(default=2, ge=2)
    packing_reservoir_min_groups: int = pydantic.Field(default=32, ge=16)
    packing_history_steps: int = pydantic.Field(default=64, ge=1)
    packing_spill_prior_alpha: float = pydantic.Field(default=1.0, gt=0.0)
    packing_spill_prior_beta: float = pydantic.Field(default=8.0, gt=0.0)
    packing_spill_confidence: float = pydantic.Field(default=0.8, gt=0.0, lt=1.0)
    queue_running_reserve_fraction: float = pydantic.Field(default=0.75, ge=0.0, le=1.0)
    trainer_load_under_score: float = pydantic.Field(default=0.08, ge=0.0)
    trainer_load_severe_under_score: float = pydantic.Field(default=0.50, ge=0.0)
    trainer_load_over_score: float = pydantic.Field(default=0.04, ge=0.0)
    vllm_pressure_over_ratio: float = pydantic.Field(default=0.80, ge=0.0)
    vllm_pressure_under_ratio: float = pydantic.Field(default=0.50, ge=0.0)
    queue_put_severe_frac: float = pydantic.Field(default=1.0 / 3.0, ge=0.0, le=1.0)
    stale_high_frac: float = pydantic.Field(default=0.20, ge=0.0, le=1.0)
    stale_clear_frac: float = pydantic.Field(default=0.10, ge=0.0, le=1.0)
    unused_and_dummy_high_frac: float = pydantic.Field(default=0.25, ge=0.0, le=1.0)
    trainer_min_batch_lower_score: float = pydantic.Field(default=0.15, ge=0.0)
    trainer_min_batch_raise_score: float = pydantic.Field(default=0.10, ge=0.0)
    min_batch_collect_improvement_ratio: float = pydantic.Field(default=0.85, gt=0.0, le=1.0)
    min_batch_trial_windows: int = pydantic.Field(default=2, ge=1)
    recommendation_min_windows: int = pydantic.Field(default=5, ge=1)
    recommendation_consecutive_holds: int = pydantic.Field(default=2, ge=1)
    freshness_min_batch_floor_fraction: float = pydantic.Field(default=0.85, gt=0.0, le=1.0)
    target_group_change_windows: int = pydantic.Field(default=1, ge=1)
    target_group_increase_fraction: float = pydantic.Field(default=0.20, gt=0.0, le=1.0)
    target_group_max_increase: int = pydantic.Field(default=64, ge=1)
    target_group_min_relative_change: float = pydantic.Field(default=0.10, ge=0.0, le=1.0)
    target_group_immediate_decrease_fraction: float = pydantic.Field(default=0.25, ge=0.0, le=1.0)
    vllm_metric_interval_s: float = pydantic.Field(default=1.0, gt=0.0)
    vllm_metric_timeout_window_frac: float = pydantic.Field(default=0.35, ge=0.0, le=1.0)

    @pydantic.model_validator(mode="after")
    def _hysteresis(self) -> PipelineAutotuneConfig:
        if self.stale_clear_frac > self.stale_high_frac:
            raise ValueError("stale_clear_frac must be <= stale_high_frac")
        if self.trainer_min_batch_raise_score > self.trainer_min_batch_lower_score:
            raise ValueError(
                "trainer_min_batch_raise_score must be <= trainer_min_batch_lower_score"
            )
        return self


UNMEASURED_FIELDS: dict[str, str] = {
    **{
        name: "the target batch is adapted in ART by simulating Megatron's packing of "
        "groups into fixed-length sequences; our trainer packs no fixed-length sequences, "
        "so the target batch stays where it starts"
        for name in (
            "target_spill_probability",
            "packing_trials",
            "packing_reservoir_multiplier",
            "packing_reservoir_min_groups",
            "packing_history_steps",
            "packing_spill_prior_alpha",
            "packing_spill_prior_beta",
            "packing_spill_confidence",
            "target_group_change_windows",
            "target_group_increase_fraction",
            "target_group_max_increase",
            "target_group_min_relative_change",
            "target_group_immediate_decrease_fraction",
            "unused_and_dummy_high_frac",
        )
    },
    **{
        name: "ART polls vLLM's Prometheus gauges (requests running and waiting for KV-cache "
        "capacity) on a timer; our engines expose no such gauge, so inference pressure is "
        "measured only from samples given to PipelineAutotuner.on_vllm_pressure_sample"
        for name in ("vllm_metric_interval_s", "vllm_metric_timeout_window_frac")
    },
}
"""Fields honoured only at their defaults here, with why; another value is refused."""


class PipelineTuneSettings(pydantic.BaseModel):
    """The settings the tuner moves; applied to the running PipelineTrainer."""

    num_rollout_workers: int = pydantic.Field(ge=1)
    min_batch_size: int = pydantic.Field(ge=1)
    max_batch_size: int = pydantic.Field(ge=1)
    queue_maxsize: int = pydantic.Field(ge=1)
    target_groups_per_step: int = pydantic.Field(ge=1)


class PipelineMetric(pydantic.BaseModel):
    """One measurement: `step` set for a per-step value, None for a timed sample."""

    name: str
    value: float
    t_s: float
    step: int | None = None
    tags: dict[str, str] = pydantic.Field(default_factory=dict)


class PackingLeafShape(pydantic.BaseModel):
    """One trajectory's token ids (uint32 array) and how many lead tokens it shares."""

    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)

    token_ids: array  # type: ignore[type-arg]
    shareable_length: int = pydantic.Field(ge=0)

    @pydantic.model_validator(mode="after")
    def _shape(self) -> PackingLeafShape:
        if self.token_ids.typecode != "I":
            raise ValueError("token_ids must be an array('I', ...) of unsigned 32-bit ids")
        if self.shareable_length > len(self.token_ids):
            raise ValueError("shareable_length exceeds the number of token_ids")
        return self


class PackedGroupShape(pydantic.BaseModel):
    """A trained group's trajectories as packing leaves."""

    leaves: tuple[PackingLeafShape, ...] = pydantic.Field(min_length=1)


class PackedGroupObservation(PackedGroupShape):
    """A `PackedGroupShape` seen at a training step."""

    step: int


class TunerWindowStats(pydantic.BaseModel):
    """What the tuner measured over one decision window (means or fractions)."""

    start_step: int
    end_step: int
    window_start_s: float = 0.0
    window_end_s: float = 0.0
    collect_batch_s: float = 0.0
    trainer_underfeed_score: float = 0.0
    vllm_pressure: float = 0.0
    vllm_waiting_capacity_request_s: float = pydantic.Field(default=0.0, ge=0.0)
    vllm_running_request_s: float = pydantic.Field(default=0.0, ge=0.0)
    queue_put_wait_frac: float = 0.0
    predicted_stale_frac: float = 0.0
    actual_stale_frac: float = 0.0
    unused_and_dummy_ratio_mean: float = 0.0
    vllm_poll_samples: int = 0
    vllm_poll_successes: int = 0
    vllm_poll_timeouts: int = 0
    vllm_poll_errors: int = 0
    vllm_poll_skipped: int = 0
    vllm_poll_coverage: float = 0.0
    vllm_poll_schedule_lag_p99_s: float = 0.0
    vllm_poll_request_latency_p99_s: float = 0.0


class TunerDecision(pydantic.BaseModel):
    """One decision: the state seen, the action taken and why, before and after."""

    step: int
    state: str
    action: str
    reason: str
    previous: PipelineTuneSettings
    updated: PipelineTuneSettings
    stats: TunerWindowStats | None = None
    recommendations: list[str] = pydantic.Field(default_factory=list)


class PipelineAutotunerProfile(pydantic.BaseModel):
    """What a tuning run learned: its final settings, its config and every decision."""

    schema_version: int = 1
    model_name: str | None = None
    backend: str | None = None
    packed_sequence_length: int | None = None
    target_packed_sequences: int | None = None
    inference_gpu_count: int | None = None
    rollout_worker_capacity: int | None = pydantic.Field(default=None, ge=1)
    policy_age_limit_steps: float | None = None
    settings: PipelineTuneSettings
    config: PipelineAutotuneConfig
    decisions: list[TunerDecision] = pydantic.Field(default_factory=list)
    notes: list[str] = pydantic.Field(default_factory=list)


__all__ = [
    "UNMEASURED_FIELDS",
    "PackedGroupObservation",
    "PackedGroupShape",
    "PackingLeafShape",
    "PipelineAutotuneConfig",
    "PipelineAutotunerProfile",
    "PipelineMetric",
    "PipelineRuntimeConfig",
    "PipelineTuneSettings",
    "TunerDecision",
    "TunerWindowStats",
]
