"""Connects a `PipelineAutotuner` to a running PipelineTrainer (ART's attachment).

At the start it picks the settings (a saved profile, or `build_initial_settings`) and
applies them before any rollout starts; in "online" mode it then feeds the tuner every
metric the trainer reports, applies each decision to the running pipeline and saves the
profile after each (`PipelineTunerProfileStore`, under the model's directory).
"""

from __future__ import annotations

from typing import Any

from .._refusals import refused_name
from ..core.data.errors import ConfigError
from .autotune import PipelineAutotuner, build_initial_settings
from .config import (
    UNMEASURED_FIELDS,
    PackedGroupObservation,
    PipelineAutotuneConfig,
    PipelineMetric,
    PipelineTuneSettings,
)
from .store import PipelineTunerProfileStore


def check_config(config: PipelineAutotuneConfig) -> None:
    """Refuse, by name, a field this version honours only at its default."""
    defaults = PipelineAutotuneConfig()
    for name, why in UNMEASURED_FIELDS.items():
        if getattr(config, name) != getattr(defaults, name):
            raise ConfigError(
                f"autotune.{name}",
                f"is {getattr(config, name)!r}: {why}",
                "Leave it at its default",
            )


class PipelineAutotunerAttachment:
    """The tuner's side of a PipelineTrainer run; the trainer calls its `on_*` hooks.

    The trainer provides `model`, `apply_pipeline_settings(settings)`,
    `rollout_worker_capacity`, `max_steps_off_policy`, `grad_accumulation_sequences` and
    `packed_sequence_length`.
    """

    def __init__(self, config: PipelineAutotuneConfig) -> None:
        check_config(config)
        self.config = config
        self.trainer: Any | None = None
        self.store: PipelineTunerProfileStore | None = None
        self.tuner: PipelineAutotuner | None = None
        self.settings: PipelineTuneSettings | None = None
        self.profile_name = config.output_name

    async def on_start(self, trainer: Any) -> None:
        """Choose and apply the starting settings; in "online" mode, start the tuner."""
        if self.config.mode == "off":
            return
        self.trainer = trainer
        self.store = PipelineTunerProfileStore.for_model(trainer.model)
        internal = trainer.model.internal_config
        gpu_ids = getattr(internal, "inference_gpu_ids", None)
        if isinstance(internal, dict):
            gpu_ids = internal.get("inference_gpu_ids")
        inference_devices = max(1, len(gpu_ids or []))  # a CPU engine counts as one
        target_sequences = max(1, trainer.grad_accumulation_sequences or 1)
        capacity = trainer.rollout_worker_capacity
        age_limit = float(trainer.max_steps_off_policy or 1.0)
        if self.config.mode == "profile" or self.config.profile:
            settings = self._load(capacity)
        else:
            settings = build_initial_settings(
                config=self.config,
                inference_gpu_count=inference_devices,
                target_packed_sequences=target_sequences,
                policy_age_limit_steps=age_limit,
                rollout_worker_capacity=capacity,
            )
        self.settings = settings
        trainer.apply_pipeline_settings(settings)
        if self.config.mode == "online":
            self.tuner = PipelineAutotuner(
                config=self.config,
                settings=settings,
                model_name=trainer.model.name,
                backend_name=type(trainer.backend).__name__,
                packed_sequence_length=trainer.packed_sequence_length or 0,
                target_packed_sequences=target_sequences,
                inference_gpu_count=inference_devices,
                policy_age_limit_steps=age_limit,
                starting_step=await trainer.model.get_step(),
                rollout_worker_capacity=capacity,
            )
            self._save()

    async def on_metric(self, metric: PipelineMetric) -> None:
        """Feed one measurement; apply and save a decision if it makes one."""
        if self.tuner is None:
            return
        decision = self.tuner.on_metric(metric)
        if decision is None:
            return
        assert self.trainer is not None
        self.settings = decision.updated
        self.trainer.apply_pipeline_settings(decision.updated)
        self._save()

    async def on_packed_group(self, observation: PackedGroupObservation) -> None:
        if self.tuner is not None:
            self.tuner.on_packed_group(observation)

    def on_vllm_pressure_sample(
        self, *, t_s: float, running: float, waiting_capacity: float
    ) -> None:
        """An inference gauge reading (requests running, waiting for capacity) to weigh."""
        if self.tuner is not None:
            self.tuner.on_vllm_pressure_sample(
                t_s=t_s, running=running, waiting_capacity=waiting_capacity
            )

    async def on_stop(self, *, training_failed: bool = False) -> None:
        """Save the profile once more (with the last decisions)."""
        if self.tuner is not None:
            self._save()

    def _save(self) -> None:
        assert self.store is not None
        assert self.tuner is not None
        self.store.save(self.profile_name, self.tuner.profile())

    def _load(self, capacity: int | None) -> PipelineTuneSettings:
        assert self.store is not None
        path = self.store.resolve(self.config.profile)
        if not path.exists():
            raise ConfigError(
                "autotune.profile",
                f"names {path}, which does not exist",
                "Run once with mode='online' to write it, or name an existing profile",
            )
        settings = self.store.load(self.config.profile).settings
        if settings.num_rollout_workers > self.config.max_rollout_workers:
            raise ConfigError(
                "autotune.profile",
                f"asks for {settings.num_rollout_workers} rollout workers, above "
                f"max_rollout_workers={self.config.max_rollout_workers}",
                "Raise max_rollout_workers or tune a new profile",
            )
        if capacity is not None and settings.num_rollout_workers > capacity:
            raise ConfigError(
                "autotune.profile",
                f"asks for {settings.num_rollout_workers} rollout workers, above the rollout "
                f"executor's capacity {capacity}",
                "Use an executor with more capacity or tune a new profile",
            )
        self.profile_name = self.config.profile or self.config.output_name
        return settings


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["PipelineAutotunerAttachment", "check_config"]
