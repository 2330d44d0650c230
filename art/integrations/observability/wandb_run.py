"""Every history row of a model, in that model's W&B run.

One run per model: project `model.project`, name and id `model.storage_name` (a trainable
model's `run_name`: ART's choice, so a run ART started is continued), entity `model.entity` (or W&B's default). `resume="allow"`
makes a second process on the same model continue the same run instead of starting one
per process. Each row is logged under its `history.jsonl` names (ART 0.5.23's), only the
keys ART sends (`history_keys.wandb_metrics`, chosen by the caller), with its
step as `training_step`, which every metric is plotted against (`define_metric`, as ART
defines it), so a row logged late (a validation of an earlier step) still lands at its own
step; an SFT batch's `sft/...` metrics are plotted against `sft/gradient_step`.

W&B is driven from one worker thread per model: `wandb.init` can take seconds (or, for
an unreachable server, until its timeout), and a training step never waits for it. A
run that cannot start (no key, no server, no wandb) logs one warning and drops its rows,
which stay in `history.jsonl`. `WANDB_MODE=offline` keeps the run on disk (under
`WANDB_DIR`, default `./wandb`) for a later `wandb sync`.
"""

from __future__ import annotations

import atexit
import math
import os
import queue
import threading
from typing import TYPE_CHECKING, Any

from ...core.metrics.history_keys import METRIC_SECTIONS, METRIC_SPLITS, TRAINING_STEP_KEY
from ...core.metrics.metrics_taxonomy import SFT_METRIC_PREFIX, SFT_WANDB_GRADIENT_STEP_KEY
from ._warn import logger, warn_once

if TYPE_CHECKING:
    from ...core.model import Model

_OFFLINE_MODES = ("offline", "dryrun", "disabled")
# How long the end of the process waits for a run to take its last rows and close, and
# how long wandb.init may wait for the server (unless WANDB_INIT_TIMEOUT says): W&B's own
# default, 90 s, would outlast the wait at exit and end the run without a word.
_EXIT_WAIT_SECONDS = 60.0
_INIT_TIMEOUT_SECONDS = 30.0

_Row = tuple[int, dict[str, float]]
# The first parts whose metrics ART plots against `training_step` by one glob each.
_STEPPED_HEADS = METRIC_SPLITS | METRIC_SECTIONS
_Config = dict[str, Any]  # Model.update_wandb_config's, merged into the run's config


class ModelRun:
    """The W&B run of one model, fed through a queue by its own worker thread."""

    def __init__(self, entity: str | None, project: str, name: str) -> None:
        self.entity, self.project, self.name = entity, project, name
        self.run_id = name
        self.label = f"{project}/{name}"
        self._rows: queue.SimpleQueue[_Row | _Config | None] = queue.SimpleQueue()
        self._dead = threading.Event()  # the run could not start or broke: rows are dropped
        self._thread = threading.Thread(target=self._work, name=f"art-wandb-{name}", daemon=True)
        self._thread.start()
        # The process waits at exit for the rows it queued, even those queued while
        # wandb.init was still running.
        atexit.register(self.finish, _EXIT_WAIT_SECONDS)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self._dead.is_set():
            self._rows.put((step, metrics))

    def update_config(self, config: _Config) -> None:
        """Merge `config` into the run's config, in order with the rows queued before it."""
        if not self._dead.is_set():
            self._rows.put(dict(config))

    def finish(self, timeout: float | None = None) -> None:
        """Log the rows queued so far, close the run, and wait up to `timeout` for that."""
        self._rows.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            warn_once(
                f"wandb-slow:{self.label}",
                f"W&B run {self.label} did not take its metrics within {timeout:g} s (is the "
                "W&B server reachable?); they are in history.jsonl",
            )

    # --- the worker thread -------------------------------------------------------------

    def _work(self) -> None:
        run = self._start()
        if run is None:
            self._dead.set()
            return
        # Registered again after wandb.init, so it also runs before W&B's own exit hook
        # (last in, first out) and the rows still queued reach the run before it closes.
        atexit.register(self.finish, _EXIT_WAIT_SECONDS)
        defined: set[str] = set()
        while (item := self._rows.get()) is not None:
            try:
                if isinstance(item, dict):
                    # A nested dict grows as keys are added to it (the model refuses a
                    # changed value), which W&B counts as a change.
                    run.config.update(item, allow_val_change=True)
                    continue
                step, metrics = item
                _define_other_keys(run, metrics, defined)
                run.log({**metrics, TRAINING_STEP_KEY: step})
            except Exception as error:  # W&B broke mid-run: say so, keep training
                warn_once(
                    f"wandb-log:{self.label}",
                    f"W&B stopped taking metrics of {self.label} ({error}); they stay in "
                    "its history.jsonl",
                )
                self._dead.set()
                break
        try:
            run.finish()
        except Exception as error:
            logger.warning("W&B run %s did not close cleanly: %s", self.label, error)

    def _start(self) -> Any:
        try:
            import wandb
        except ImportError:
            warn_once(
                "wandb-missing",
                "W&B reporting is on (report_metrics=['wandb'] or WANDB_API_KEY) but wandb "
                "is not installed: pip install 'art-grpo[wandb]'. Metrics stay in history.jsonl",
            )
            return None
        online = os.environ.get("WANDB_MODE", "").strip().lower() not in _OFFLINE_MODES
        # wandb.login(prompt=False) finds a key without ever asking for one; once a run
        # is open in this process the key is known (and login() would only complain).
        if online and wandb.run is None and not wandb.login(prompt=False, verify=False):
            warn_once(
                "wandb-key",
                f"W&B: no API key (set WANDB_API_KEY or run `wandb login`), so {self.label} "
                "is not reported; its metrics stay in history.jsonl. WANDB_MODE=offline "
                "keeps a local run to `wandb sync` later",
            )
            return None
        settings = wandb.Settings()
        if not os.environ.get("WANDB_INIT_TIMEOUT"):
            settings.init_timeout = _INIT_TIMEOUT_SECONDS
        try:
            run = wandb.init(
                settings=settings,
                project=self.project,
                entity=self.entity,
                name=self.name,
                id=self.run_id,
                resume="allow",
                reinit="create_new",  # one run per model, several models per process
            )
            _define_step_metrics(run)
        except Exception as error:
            warn_once(
                f"wandb-init:{self.label}",
                f"W&B run {self.label} could not start ({error}); its metrics stay in "
                "history.jsonl and training goes on",
            )
            return None
        if online:  # ART starts Weave with its W&B run; Weave has no offline mode
            from .weave_trace import init_weave

            init_weave(self.project if self.entity is None else f"{self.entity}/{self.project}")
        return run


def _define_step_metrics(run: Any) -> None:
    """ART's x-axes: `training_step` for each split's and section's metrics,
    `sft/gradient_step` for an SFT batch's."""
    run.define_metric(TRAINING_STEP_KEY)
    run.define_metric(SFT_WANDB_GRADIENT_STEP_KEY)
    for head in sorted(_STEPPED_HEADS):
        run.define_metric(f"{head}/*", step_metric=TRAINING_STEP_KEY)
    run.define_metric(f"{SFT_METRIC_PREFIX}/*", step_metric=SFT_WANDB_GRADIENT_STEP_KEY)


def _define_other_keys(run: Any, metrics: dict[str, float], defined: set[str]) -> None:
    """A key under none of those first parts (a split of the user's own, `eval/...`) is
    plotted against `training_step` too, defined once, as ART defines its custom keys."""
    for key in metrics:
        head = key.split("/", 1)[0]
        if key in defined or head in _STEPPED_HEADS or head == SFT_METRIC_PREFIX:
            continue
        run.define_metric(key, step_metric=TRAINING_STEP_KEY)
        defined.add(key)


_runs: dict[tuple[str | None, str, str], ModelRun] = {}
_runs_lock = threading.Lock()


def report_history(model: Model, step: int, metrics: dict[str, float]) -> None:
    """Queue one history row for the model's run (started on the first row, with the
    model's `update_wandb_config` config)."""
    key = (model.entity, model.project, model.storage_name)
    with _runs_lock:
        run = _runs.get(key)
        if run is None:
            run = _runs[key] = ModelRun(*key)
            if config := model.wandb_config:
                run.update_config(config)
    # JSON has no NaN, so history.jsonl leaves an undefined metric out: so does W&B.
    run.log(step, {k: v for k, v in metrics.items() if not _undefined(v)})


def update_wandb_config(model: Model) -> None:
    """Send the model's config to its run if one is open (else its first row does)."""
    key = (model.entity, model.project, model.storage_name)
    with _runs_lock:
        run = _runs.get(key)
    if run is not None:
        run.update_config(model.wandb_config)


def finish_wandb_runs(timeout: float | None = None) -> None:
    """Close every model's W&B run, after it has taken the rows queued so far.

    Runs close by themselves when the process ends; call this to close them sooner (a
    notebook, a test). A model that logs again afterwards resumes its run.
    """
    with _runs_lock:
        runs = list(_runs.values())
        _runs.clear()
    for run in runs:
        run.finish(timeout)


def _undefined(value: float) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


__all__ = ["ModelRun", "finish_wandb_runs", "report_history", "update_wandb_config"]
