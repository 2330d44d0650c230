"""`PipelineTrainer`: rollouts never wait for training (ART's API and defaults).

Three stages run at once on one event loop:

1. **Rollout workers** (`num_rollout_workers`) take scenarios from the iterator, run
   `rollout_fn(model, scenario, config)` against the model's newest published checkpoint,
   stamp each trajectory with the policy step that sampled it (the endpoint reports it on
   every choice as `policy_version`), and queue the finished group.
2. **The trainer** takes at least `min_batch_size` (at most `max_batch_size`) groups from
   the queue, drops those sampled more than `max_steps_off_policy` steps before the step
   they would train at and those whose rewards are all equal, and takes one step on the
   rest; the backend saves the checkpoint and loads it into the engine before the step
   returns, so the next rollouts sample from it. Rollouts in flight keep their adapter.
3. **Evaluation** (`eval_fn(model, step, config)`) every `eval_every_n_steps` steps, in its
   own task.

As in ART, each rollout runs in the model's `train` cost context and each evaluation in
its `eval` one (`model.activate_metrics_context`): an API cost either records
(`art.metrics.track_api_cost`, RULER's judge) lands in the next `train` or `val` history
row as `costs/train/...` or `costs/eval/...`.

With `max_steps_off_policy=k` a worker waits to start a rollout while the policy is more
than `k` steps behind the step being trained, so `k=0` is the synchronous loop with
prefetching. Each step's `train/` history row adds `staleness_mean`, `staleness_max`,
`groups_dropped_stale` and `groups_dropped_no_variance`. While it runs, the trainer
tells a `StatusReporter` (`art.pipeline.status`) what happens through ART's `note_*`
methods, and the reporter shows the counts as a bar and a status line.

Only a backend that serves while it trains runs this (ART's rule): LocalBackend in
dedicated mode. A shared LocalBackend pauses inference during every step, which would
make the pipeline the synchronous loop with extra staleness.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, cast

from ..core.data import dev
from ..core.data.errors import ConfigError, RolloutError
from ..core.data.trajectories import Trajectory, TrajectoryGroup
from ..core.data.types import TrainConfig
from ..core.model import TrainableModel
from ..core.store.model_store import ModelStore
from ..core.training import run_step
from ..pipeline_tuner.config import (
    PipelineAutotuneConfig,
    PipelineRuntimeConfig,
    PipelineTuneSettings,
)
from ..pipeline_tuner.worker_controller import RolloutWorkerController
from ._arguments import (
    check_backend_serves_while_training,
    check_kl_lag,
    check_ranges,
    refuse_unsupported,
    runtime_config,
)
from ._staleness import has_no_variance, is_stale, staleness_metrics, stamp_versions
from ._state import STATE_FILE, PipelineState
from ._types import ConfigT, EvalFn, RolloutFn, ScenarioT, SingleRolloutFn
from .autotune import StepMeter, autotune_attachment, report_step
from .executor import LocalRolloutExecutor, RolloutExecutor, check_executor
from .retention import CheckpointRetentionContext, CheckpointRetentionStrategy, eligible_checkpoints
from .score import ScoreReference, score_metrics
from .status import StatusReporter

logger = logging.getLogger("art.pipeline")

_END = object()  # the queue's end: every worker is done
_STOPPED = object()  # request_stop() while the trainer waited for groups


class PipelineTrainer(Generic[ScenarioT, ConfigT]):
    """Runs rollouts continuously and trains on complete groups as they finish.

    Args follow ART's `PipelineTrainer`; each is honoured, or refused with a
    `ConfigError` naming it where this version cannot honour it.
    """

    def __init__(
        self,
        model: TrainableModel,
        backend: Any,
        rollout_fn: RolloutFn[ScenarioT, ConfigT],
        scenarios: AsyncIterator[ScenarioT] | AsyncIterable[ScenarioT] | Iterable[ScenarioT],
        config: ConfigT,
        eval_fn: EvalFn[ConfigT] | None = None,
        *,
        num_rollout_workers: int | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        queue_maxsize: int | None = None,
        pipeline: PipelineRuntimeConfig | None = None,
        autotune: PipelineAutotuneConfig | None = None,
        learning_rate: float = 1e-5,
        loss_fn: str = "cispo",
        loss_fn_config: dict[str, Any] | None = None,
        normalize_advantages: bool = True,
        grad_accumulation_sequences: int | None = None,
        adam_params: object | None = None,
        packed_sequence_length: int | None = None,
        kl_penalty_coef: float = 0.0,
        kl_penalty_step_lag: int | None = None,
        max_steps: int | None = None,
        discard_queue_multiplier: int = 100,
        max_steps_off_policy: int | None = 4,
        limit_mean_steps_off_policy: float | None = None,
        score_reference_groups_per_step: float | None = None,
        score_reference_rollouts_per_group: float | None = None,
        log_interval_seconds: float = 60.0,
        status_ewa_alpha: float = 0.2,
        total_scenarios: int | None = None,
        eval_every_n_steps: int = 20,
        eval_at_start: bool = True,
        save_checkpoint: bool = True,
        optimizer_save_interval: int = 1,
        checkpoint_retention_strategy: CheckpointRetentionStrategy | None = None,
        checkpoint_retention_interval: int = 1,
        resume: bool = True,
        rollout_executor: RolloutExecutor | None = None,
    ) -> None:
        refuse_unsupported(loss_fn_config=loss_fn_config, adam_params=adam_params)
        runtime = runtime_config(
            pipeline,
            autotune,
            num_rollout_workers=num_rollout_workers,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            queue_maxsize=queue_maxsize,
        )
        check_ranges(
            max_steps=max_steps,
            discard_queue_multiplier=discard_queue_multiplier,
            max_steps_off_policy=max_steps_off_policy,
            eval_every_n_steps=eval_every_n_steps,
            grad_accumulation_sequences=grad_accumulation_sequences,
            kl_penalty_coef=kl_penalty_coef,
            kl_penalty_step_lag=kl_penalty_step_lag,
            limit_mean_steps_off_policy=limit_mean_steps_off_policy,
            score_reference_groups_per_step=score_reference_groups_per_step,
            score_reference_rollouts_per_group=score_reference_rollouts_per_group,
        )
        check_kl_lag(kl_penalty_step_lag, kl_penalty_coef)
        executor = check_executor(rollout_executor or LocalRolloutExecutor())
        runtime = _fit_capacity(runtime, executor.max_workers, num_rollout_workers, pipeline)
        if loss_fn not in ("cispo", "ppo"):
            raise ConfigError(
                "loss_fn",
                f"is {loss_fn!r}; the LocalBackend trains with 'cispo' or 'ppo'",
                "Use loss_fn='cispo' (the default) or 'ppo'",
            )
        if not save_checkpoint:
            raise ConfigError(
                "save_checkpoint",
                "is False, but every step's checkpoint is what the engine serves next",
                "Leave save_checkpoint=True; delete old ones with model.delete_checkpoints()",
            )
        if optimizer_save_interval != 1:
            raise ConfigError(
                "optimizer_save_interval",
                f"is {optimizer_save_interval}; the LocalBackend saves the optimizer state "
                "with every checkpoint",
                "Leave optimizer_save_interval=1",
            )
        if checkpoint_retention_interval < 1:
            raise ConfigError(
                "checkpoint_retention_interval",
                f"is {checkpoint_retention_interval}",
                "Use 1 or more (steps between retention passes)",
            )
        if checkpoint_retention_strategy is not None and not callable(
            checkpoint_retention_strategy
        ):
            raise ConfigError(
                "checkpoint_retention_strategy",
                f"is a {type(checkpoint_retention_strategy).__name__}, not a callable",
                "Pass art.pipeline_trainer.keep_recent_and_top(...) or a function from a "
                "CheckpointRetentionContext to the steps to keep",
            )
        self._autotune = autotune_attachment(
            autotune,
            num_rollout_workers=num_rollout_workers,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            queue_maxsize=queue_maxsize,
        )
        self._meter = StepMeter()
        self.grad_accumulation_sequences = grad_accumulation_sequences
        self.packed_sequence_length = packed_sequence_length
        self.rollout_worker_capacity = executor.max_workers
        self.rollout_executor = executor
        self.retention = checkpoint_retention_strategy
        self.retention_interval = checkpoint_retention_interval
        if not isinstance(model, TrainableModel):
            raise ConfigError(
                "model", "is not an art.TrainableModel", "Pass the TrainableModel to train"
            )
        check_backend_serves_while_training(backend, model)
        self.model = model
        self.backend = backend
        self.rollout_fn = rollout_fn
        self.config = config
        self.eval_fn = eval_fn
        self.pipeline = runtime
        self.num_rollout_workers = runtime.num_rollout_workers
        executor.set_target(self.num_rollout_workers)
        self.min_batch_size = runtime.min_batch_size
        self.max_batch_size = runtime.max_batch_size or 10 * runtime.min_batch_size
        self.max_steps_off_policy = max_steps_off_policy
        self.limit_mean_steps_off_policy = limit_mean_steps_off_policy
        window = _freshness_window(max_steps_off_policy, limit_mean_steps_off_policy)
        self.queue_maxsize = runtime.queue_maxsize or max(1, window) * self.max_batch_size
        # As ART's PipelineTrainer: the KL penalty compares the sampler's logprobs with the
        # reference's, which is the base model or, with a lag, the checkpoint that many
        # steps behind the one being trained from.
        self.kl_penalty_step_lag = kl_penalty_step_lag
        self.train_config = TrainConfig(
            learning_rate=learning_rate,
            kl_penalty_coef=kl_penalty_coef,
            kl_penalty_source="sample",
        )
        self.score_reference = ScoreReference(
            groups_per_step=_given_or(
                score_reference_groups_per_step, runtime.score_reference_groups_per_step
            ),
            rollouts_per_group=_given_or(
                score_reference_rollouts_per_group, runtime.score_reference_rollouts_per_group
            ),
        )
        self.dev_config = dev.TrainConfig(
            ppo=loss_fn == "ppo",
            scale_rewards=normalize_advantages,
            gradient_accumulation_sequences=grad_accumulation_sequences,
            packed_sequence_length=packed_sequence_length,
        )
        self.max_steps = max_steps
        self.discard_limit = discard_queue_multiplier * self.min_batch_size
        self.eval_every_n_steps = eval_every_n_steps
        self.eval_at_start = eval_at_start
        self.resume = resume
        self._scenarios = _async_iterator(scenarios)
        self._scenario_lock = asyncio.Lock()
        self._state = PipelineState()
        self._status = StatusReporter(
            get_scenario_offset=lambda: self._state.scenario_offset,
            log_interval_seconds=log_interval_seconds,
            status_ewa_alpha=status_ewa_alpha,
            total_scenarios=total_scenarios,
            num_workers=self.num_rollout_workers,
            total_steps=max_steps,
        )
        self._stop = asyncio.Event()
        self._policy_changed = asyncio.Condition()
        self._policy_step = 0
        self._training = False
        self._queue: asyncio.Queue[object] | None = None
        self._evals: list[asyncio.Task[None]] = []
        self._eval_steps: list[int] = []
        self._failure: BaseException | None = None  # a worker's, raised by train()
        self._unqueued = 0  # finished groups waiting for room in the queue
        self.collapsed = False  # stopped for too many groups without reward variance

    # --- the run ----------------------------------------------------------------------

    async def train(self, *, handle_signals: bool = True) -> None:
        """Run the pipeline until `max_steps` steps are trained or the scenarios run out.

        Started again on the same model (in this process or a new one), it continues
        from the last checkpoint and skips the scenarios already taken (`resume=True`).
        SIGINT/SIGTERM (with `handle_signals`) finish the step being trained, then stop.
        """
        start_step = await self.model.get_step()
        state_path = self._state_path()
        if self.resume and state_path is not None:
            self._state = PipelineState.read(state_path)
        self._state.training_step = start_step
        self._policy_step = start_step
        await self._skip_scenarios(self._state.scenario_offset)
        self._workers = RolloutWorkerController(self, self.num_rollout_workers)
        self._queue = None
        if self._autotune is not None:
            await self._autotune.on_start(self)  # sets the sizes before the queue exists
        self._queue = asyncio.Queue(maxsize=self.queue_maxsize)
        self._stop = asyncio.Event()
        stop_at = None if self.max_steps is None else start_step + self.max_steps
        self._status.start(initial_step=start_step)
        removers = self._install_signal_handlers() if handle_signals else []
        self._failure = None
        closer = asyncio.create_task(self._end_queue_after(self._workers))
        ticker = asyncio.create_task(self._tick())
        try:
            if self.eval_at_start and start_step not in self._state.completed_eval_steps:
                self._schedule_eval(start_step)
            await self._training_stage(stop_at)
            if self._failure is not None:
                raise self._failure
        finally:
            self.request_stop()
            self._save_state()  # drops counted after the last step, too
            for task in [closer, ticker]:
                task.cancel()
            await asyncio.gather(closer, ticker, return_exceptions=True)
            if self._autotune is not None:
                await self._autotune.on_stop(training_failed=self._failure is not None)
            try:
                await asyncio.gather(*self._evals)  # evals already scheduled still run
            finally:
                for remove in removers:
                    remove()
                self._status.flush()
                self._status.close()

    @property
    def groups_dropped_stale(self) -> int:
        """Groups dropped for staleness, over every run of this model (resumed ones too)."""
        return self._state.groups_dropped_stale

    @property
    def groups_dropped_no_variance(self) -> int:
        """Groups dropped because their rewards were all equal, over every run."""
        return self._state.groups_dropped_no_variance

    def rollout_worker_ended(self, task: asyncio.Task[None]) -> None:
        """Told of each finished rollout worker: a worker's error stops the run."""
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()  # raised by train() once the trainer stops
            self.request_stop()

    @property
    def stop_requested(self) -> asyncio.Event:
        """Set once the run is to stop (`request_stop`, an error, the last step)."""
        return self._stop

    def request_stop(self) -> None:
        """Stop after the step being trained; rollouts in flight are abandoned."""
        self._stop.set()
        asyncio.get_running_loop().create_task(self._notify_policy())

    async def _training_stage(self, stop_at: int | None) -> None:
        while not self._stop.is_set() and (stop_at is None or self._policy_step < stop_at):
            step_started = time.monotonic()  # a step's seconds include collecting its batch
            batch, dropped_stale, dropped_no_variance, ended = await self._collect_batch()
            collect_s = time.monotonic() - step_started
            if batch:
                await self._train_step(batch, dropped_stale, dropped_no_variance, step_started)
                if self._autotune is not None:
                    metrics = self._meter.step_metrics(
                        wall_s=time.monotonic() - step_started,
                        collect_s=collect_s,
                        trained=len(batch),
                        stale=dropped_stale,
                        no_variance=dropped_no_variance,
                    )
                    rewards = [t.reward for g in batch for t in g.trajectories]
                    score = sum(rewards) / len(rewards) if rewards else 0.0
                    await report_step(self._autotune, self._policy_step, metrics, score)
            if ended or not batch:
                return

    async def _train_step(
        self,
        batch: list[TrajectoryGroup],
        dropped_stale: int,
        dropped_no_variance: int,
        step_started: float,
    ) -> None:
        train_step = self._policy_step
        staleness = staleness_metrics(batch, train_step)
        extra = {
            **staleness,
            **score_metrics(batch, train_step, self.score_reference),
            "groups_dropped_stale": float(dropped_stale),
            "groups_dropped_no_variance": float(dropped_no_variance),
            "queue_depth": float(self._queue.qsize() if self._queue else 0),
            "rollouts_in_flight": float(self._status.snapshot().rollouts_in_flight),
        }
        self._training = True
        self._status.note_training_start(len(batch))
        try:
            await run_step(
                self.model,
                batch,
                config=self.train_config,
                dev_config=self._kl_reference(train_step),
                extra_metrics=extra,
            )
        finally:
            self._training = False
            self._status.note_training_end()
        new_step = await self.model.get_step()
        self._policy_step = new_step
        await self._notify_policy()
        self._state.training_step = new_step
        self._state.groups_trained += len(batch)
        self._save_state()
        self._status.note_training_batch(
            batch, step=new_step, step_seconds=time.monotonic() - step_started
        )
        if self.eval_every_n_steps and new_step % self.eval_every_n_steps == 0:
            self._schedule_eval(new_step)
        if self.retention is not None and new_step % self.retention_interval == 0:
            await self._retain_checkpoints(new_step)

    def kl_reference_step(self, train_step: int) -> int:
        """The checkpoint the KL penalty compares with when training from `train_step`
        (ART's rule): `kl_penalty_step_lag` steps back, or 0 (the base model) without one."""
        lag = self.kl_penalty_step_lag
        return 0 if lag is None else max(0, train_step - lag)

    def _kl_reference(self, train_step: int) -> dev.TrainConfig:
        """This step's dev config, naming the KL reference adapter where it is not the base.

        Step 0 is the base model (a fresh LoRA adapter changes nothing), so it needs none.
        """
        step = self.kl_reference_step(train_step)
        if not self.train_config.kl_penalty_coef or step == 0:
            return self.dev_config
        directory = self._store_or_refuse("kl_penalty_step_lag").checkpoint_dir(step)
        if not directory.is_dir():
            raise ConfigError(
                "kl_penalty_step_lag",
                f"needs checkpoint {step} as the KL reference at step {train_step}, but it "
                "is gone (deleted outside this trainer?)",
                "Keep the last kl_penalty_step_lag checkpoints, or use a smaller lag",
            )
        return self.dev_config.model_copy(update={"kl_ref_adapter_path": str(directory)})

    def _store_or_refuse(self, field: str) -> ModelStore:
        path = getattr(self.backend, "path", None)  # a backend that stores on this machine
        if not isinstance(path, str):
            raise ConfigError(
                field,
                f"needs a backend that stores checkpoints on this machine; "
                f"{type(self.backend).__name__} does not",
                f"Leave {field} None",
            )
        return ModelStore(path, self.model.project, self.model.storage_name)

    async def _retain_checkpoints(self, step: int) -> None:
        """Delete the checkpoints the strategy lets go, never one still needed: the newest,
        any rollouts may still sample from (within max_steps_off_policy), any whose
        evaluation is scheduled but not finished."""
        assert self.retention is not None
        path = getattr(self.backend, "path", None)
        delete = getattr(self.backend, "_delete_checkpoint_files", None)
        if not isinstance(path, str) or delete is None:
            raise ConfigError(
                "checkpoint_retention_strategy",
                f"needs a backend that stores checkpoints on this machine; {type(self.backend).__name__} does not",
                "Leave it None and call model.delete_checkpoints()",
            )
        store = ModelStore(path, self.model.project, self.model.storage_name)
        lag = _freshness_window(self.max_steps_off_policy, self.limit_mean_steps_off_policy)
        if self.max_steps_off_policy is None and self.limit_mean_steps_off_policy is None:
            lag = step  # rollouts may sample from any step
        oldest = max(step - lag, 0)
        if self.train_config.kl_penalty_coef:  # the KL references still to come
            oldest = min(oldest, self.kl_reference_step(step))
        protected = set(range(oldest, step + 1)) | self._pending_eval_steps()
        eligible = await asyncio.to_thread(eligible_checkpoints, store, protected)
        context = CheckpointRetentionContext(current_step=step, checkpoints=eligible)
        keep = {int(s) for s in self.retention(context)} & {c.step for c in eligible}
        steps = sorted(keep | protected)
        deleted = await delete(self.model, steps)
        if deleted:
            logger.info("checkpoint retention at step %d deleted steps %s", step, deleted)

    def _pending_eval_steps(self) -> set[int]:
        done = set(self._state.completed_eval_steps)
        return {step for step in self._eval_steps if step not in done}

    async def _collect_batch(self) -> tuple[list[TrajectoryGroup], int, int, bool]:
        """Fresh groups with reward variance: wait for `min_batch_size`, take up to max.

        Returns the batch, the stale and no-variance groups dropped meanwhile, and whether
        the queue ended (scenarios exhausted, a stop, or too many no-variance groups).
        """
        assert self._queue is not None
        batch: list[TrajectoryGroup] = []
        stale = no_variance = 0
        while len(batch) < self.max_batch_size:
            if len(batch) < self.min_batch_size:
                item = await self._get_or_stop()
            elif self._queue.empty():
                break
            else:
                item = self._queue.get_nowait()
            await self._notify_policy()  # room for a new rollout, perhaps
            if item is _STOPPED:  # a partial batch is not trained after a stop
                return [], stale, no_variance, True
            if item is _END:  # the scenarios ran out: what is left still trains
                return batch, stale, no_variance, True
            group = cast(TrajectoryGroup, item)
            self._status.note_group_dequeued(group)
            if not group.trajectories and group.exceptions:
                first = group.exceptions[0]
                raise RolloutError(
                    f"all {len(group.exceptions)} rollouts of a group failed; the first "
                    f"raised {first.type}: {first.message}"
                )
            if is_stale(
                group,
                self._policy_step,
                self.max_steps_off_policy,
                self.limit_mean_steps_off_policy,
            ):
                stale += 1
                self._state.groups_dropped_stale += 1
                self._status.note_stale(1)
            elif has_no_variance(group):
                no_variance += 1
                self._state.groups_dropped_no_variance += 1
                self._status.note_zero_variance_discarded(1)
                if no_variance >= self.discard_limit:
                    self._collapse(no_variance)
                    return [], stale, no_variance, True
            else:
                batch.append(group)
        return batch, stale, no_variance, False

    def _collapse(self, count: int) -> None:
        self.collapsed = True
        message = (
            f"{count} groups in a row had rewards all equal (discard_queue_multiplier x "
            f"min_batch_size = {self.discard_limit}): the policy may have collapsed, or the "
            "reward cannot tell rollouts apart. Training stopped. Lower the learning rate, "
            "make the reward finer, or raise discard_queue_multiplier"
        )
        logger.warning(message)
        print(f"[pipeline] {message}")

    async def _get_or_stop(self) -> object:
        assert self._queue is not None
        getter = asyncio.ensure_future(self._queue.get())
        stopper = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not getter.done():
                getter.cancel()
        return getter.result() if getter.done() and not getter.cancelled() else _STOPPED

    # --- rollouts ---------------------------------------------------------------------

    def apply_pipeline_settings(self, settings: PipelineTuneSettings) -> None:
        """Set the tuner's settings; the worker count changes at once, the queue's size
        only before the run starts (the tuner here never moves it later)."""
        if self._queue is not None and settings.queue_maxsize != self._queue.maxsize:
            raise ConfigError(
                "queue_maxsize", "cannot change while the pipeline runs", "Keep it fixed"
            )
        capacity = self.rollout_worker_capacity
        if capacity is not None and settings.num_rollout_workers > capacity:
            raise ConfigError(
                "num_rollout_workers",
                f"is {settings.num_rollout_workers}, above the rollout executor's capacity "
                f"{capacity}",
                "Keep it within rollout_executor.max_workers",
            )
        self.rollout_executor.set_target(settings.num_rollout_workers)
        self.num_rollout_workers = settings.num_rollout_workers
        self.min_batch_size = settings.min_batch_size
        self.max_batch_size = settings.max_batch_size
        self.queue_maxsize = settings.queue_maxsize
        self._workers.set_target(settings.num_rollout_workers)
        self._status.num_workers = settings.num_rollout_workers

    async def run_rollout_worker(self, worker_id: int = 0) -> None:
        """One rollout worker (`RolloutWorkerController` runs them): rolls out scenarios
        until they run out, the run stops, or the controller retires it."""
        assert self._queue is not None
        while not self._stop.is_set() and self._workers.worker_allowed(worker_id):
            scenario = await self._next_scenario()
            if scenario is _END:
                return
            await self._wait_for_policy()
            if self._stop.is_set():
                return
            started = self._policy_step
            self._status.note_rollout_started()
            errored = False
            # As ART's: costs the rollout records (`track_api_cost`, RULER) count as `train`.
            costs = self.model.activate_metrics_context("train")
            rollout_started = time.monotonic()
            try:
                group = await self.rollout_executor.run(
                    worker_id, self.rollout_fn, self.model, scenario, self.config
                )
            except Exception as error:  # a bad rollout is data, not the end of the run
                errored = True
                logger.warning("rollout failed: %s: %s", type(error).__name__, error)
                print(f"[pipeline] rollout failed ({type(error).__name__}): {error}")
                continue
            finally:
                costs.var.reset(costs)
                self._status.note_rollout_finished(errored=errored)
                self._meter.rollout_s += time.monotonic() - rollout_started
            if not isinstance(group, TrajectoryGroup):
                raise ConfigError(
                    "rollout_fn",
                    f"returned {type(group).__name__} (through the rollout executor), not an "
                    "art.TrajectoryGroup",
                    "Return art.TrajectoryGroup([...]) of finished trajectories, or build "
                    "rollout_fn with art.pipeline_trainer.make_group_rollout_fn; a rollout "
                    "executor returns the group itself (ART's distributed group references "
                    "are not built here)",
                )
            group.metadata.update(_scenario_metadata(scenario))
            stamp_versions(group, started_at=started, finished_at=self._policy_step)
            self._unqueued += 1  # still counted by the gate while put waits for room
            put_started = time.monotonic()
            try:
                await self._queue.put(group)
            finally:
                self._unqueued -= 1
                self._meter.put_wait_s += time.monotonic() - put_started
            self._status.note_group_enqueued(group)

    async def _wait_for_policy(self) -> None:
        """Hold a new rollout while it could not be trained within the staleness bound.

        ART's gate: the policy may be at most k steps behind the step being trained. And
        ours: no new rollout while the queue already holds the groups of every step the
        bound still allows (k more while a step trains, k + 1 otherwise, `max_batch_size`
        groups each): a group started then would be dropped as stale, and on a small
        machine sampling it takes CPU from training. Rollouts in flight are not counted,
        so one that waits on the training itself cannot hold the others back.
        """
        limit = self.max_steps_off_policy
        if limit is None:
            return

        def ready() -> bool:
            if self._stop.is_set():
                return True
            training_step = self._policy_step + (1 if self._training else 0)
            if training_step - self._policy_step > limit:
                return False
            steps_left = limit if self._training else limit + 1
            queued = (self._queue.qsize() if self._queue else 0) + self._unqueued
            return queued < steps_left * self.max_batch_size

        async with self._policy_changed:
            await self._policy_changed.wait_for(ready)

    async def _notify_policy(self) -> None:
        async with self._policy_changed:
            self._policy_changed.notify_all()

    async def _next_scenario(self) -> object:
        async with self._scenario_lock:
            try:
                scenario = await anext(self._scenarios)
            except StopAsyncIteration:
                return _END
            self._state.scenario_offset += 1
            return scenario

    async def _skip_scenarios(self, count: int) -> None:
        for skipped in range(count):
            try:
                await anext(self._scenarios)
            except StopAsyncIteration:
                logger.warning("the scenarios ended after %d of the %d to skip", skipped, count)
                return

    async def _end_queue_after(self, workers: RolloutWorkerController) -> None:
        """Once every worker is done (scenarios exhausted), tell the trainer."""
        assert self._queue is not None
        await workers.run()  # failures: _worker_done
        await self._queue.put(_END)

    # --- evaluation, state, signals ---------------------------------------------------

    def _schedule_eval(self, step: int) -> None:
        if self.eval_fn is None:
            return
        previous = self._evals[-1] if self._evals else None
        self._eval_steps.append(step)
        self._evals.append(asyncio.create_task(self._run_eval(step, previous)))

    async def _run_eval(self, step: int, previous: asyncio.Task[None] | None) -> None:
        assert self.eval_fn is not None
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)  # one eval at a time
        self._status.note_val_started(step)
        reward: float | None = None  # the mean `val` reward, for the status line
        try:
            costs = self.model.activate_metrics_context("eval")  # ART's context for evals
            try:
                result = await self.eval_fn(self.model, step, self.config)
            except Exception as error:  # training goes on; the failure is shown, as in ART
                logger.warning("eval at step %d failed: %s: %s", step, type(error).__name__, error)
                print(f"[pipeline] eval at step {step} failed ({type(error).__name__}): {error}")
                return
            finally:
                costs.var.reset(costs)
            splits = result if isinstance(result, Mapping) else {"val": result}
            for split, items in splits.items():
                groups = _as_groups(items)
                if split == "val":
                    rewards = [t.reward for group in groups for t in group.trajectories]
                    reward = sum(rewards) / len(rewards) if rewards else None
                if groups:
                    await self.model.log(groups, split=split, step=step)
            self._state.completed_eval_steps.append(step)
            self._save_state()
        finally:
            self._status.note_val_finished(step, reward)

    def _state_path(self) -> Path | None:
        path = getattr(self.backend, "path", None)  # a backend that stores on this machine
        if not isinstance(path, str):
            return None
        return ModelStore(path, self.model.project, self.model.storage_name).dir / STATE_FILE

    def _save_state(self) -> None:
        path = self._state_path()
        if path is not None:
            self._state.write(path)

    async def _tick(self) -> None:
        """Print the status line every `log_interval_seconds`."""
        while True:
            self._status.log_if_due()
            await asyncio.sleep(min(1.0, self._status.log_interval_seconds))

    def _install_signal_handlers(self) -> list[Any]:
        loop = asyncio.get_running_loop()
        removers = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError, ValueError):
                continue  # not the main thread, or not a Unix loop
            removers.append(lambda sig=sig: loop.remove_signal_handler(sig))
        return removers


def _fit_capacity(
    runtime: PipelineRuntimeConfig,
    capacity: int | None,
    num_rollout_workers: int | None,
    pipeline: PipelineRuntimeConfig | None,
) -> PipelineRuntimeConfig:
    """ART's rule for an executor's capacity: more workers than it holds is refused where
    the count was asked for (by hand), else the count is lowered to the capacity."""
    if capacity is None or runtime.num_rollout_workers <= capacity:
        return runtime
    asked = num_rollout_workers is not None or (
        pipeline is not None and "num_rollout_workers" in pipeline.model_fields_set
    )
    if asked:
        raise ConfigError(
            "num_rollout_workers",
            f"is {runtime.num_rollout_workers}, above the rollout executor's capacity {capacity}",
            f"Use at most {capacity}, or leave it unset to run {capacity}",
        )
    return runtime.model_copy(update={"num_rollout_workers": capacity})


def _freshness_window(max_steps_off_policy: int | None, limit_mean: float | None) -> int:
    """Steps of groups worth queueing (and of checkpoints rollouts may still use): ART's."""
    if max_steps_off_policy is not None:
        return max_steps_off_policy
    if limit_mean is not None:
        return math.ceil(limit_mean)
    return 1


def _given_or(value: float | None, default: float | None) -> float | None:
    return value if value is not None else default


def make_group_rollout_fn(
    single_rollout_fn: SingleRolloutFn[ScenarioT, ConfigT], n: int = 4
) -> RolloutFn[ScenarioT, ConfigT]:
    """A `RolloutFn` that runs `single_rollout_fn` `n` times at once as one group.

    A rollout that raises is kept in the group's `exceptions`, as `gather` does.
    """
    if n < 1:
        raise ConfigError("n", f"is {n}; a group needs at least one rollout", "Use n >= 1")

    async def group_rollout(
        model: TrainableModel, scenario: ScenarioT, config: ConfigT
    ) -> TrajectoryGroup:
        results = await asyncio.gather(
            *(single_rollout_fn(model, scenario, config) for _ in range(n)),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancellation, KeyboardInterrupt: not a rollout's failure
        return TrajectoryGroup(results)

    return group_rollout


def _async_iterator(
    scenarios: AsyncIterator[Any] | AsyncIterable[Any] | Iterable[Any],
) -> AsyncIterator[Any]:
    if isinstance(scenarios, AsyncIterator):
        return scenarios
    if isinstance(scenarios, AsyncIterable):
        return aiter(scenarios)

    async def iterate() -> AsyncIterator[Any]:
        for scenario in scenarios:
            yield scenario

    return iterate()


def _scenario_metadata(scenario: object) -> dict[str, float | int | str | bool | None]:
    """ART's rule: a dict scenario's scalar `metadata` is copied onto its group."""
    metadata = scenario.get("metadata") if isinstance(scenario, dict) else None
    if not isinstance(metadata, dict):
        return {}
    copied: dict[str, float | int | str | bool | None] = {}
    for key, value in metadata.items():
        if isinstance(key, str) and (value is None or isinstance(value, float | int | str | bool)):
            copied[key if key == "scenario_id" else f"scenario_{key}"] = value
    return copied


def _as_groups(items: Sequence[Trajectory | TrajectoryGroup]) -> list[TrajectoryGroup]:
    groups = [item for item in items if isinstance(item, TrajectoryGroup)]
    loose = [item for item in items if isinstance(item, Trajectory)]
    return [*groups, TrajectoryGroup(loose)] if loose else groups


__all__ = ["PipelineTrainer", "make_group_rollout_fn"]
