"""What one `art serve` process holds: the model service, the models' files, the jobs.

The routes in `app` call these methods (in worker threads: loading and training block);
each checks the request's key against the model it touches.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..core.data import dev
from ..core.data.errors import ArtValueError, ConfigError
from ..core.data.registration import refuse_changed_registration
from ..core.data.sft_data import check_file, read_file, spool_examples
from ..core.data.trajectories import TrajectoryGroup
from ..core.data.types import TrainSFTConfig
from ..core.data.validation import check_trainable, coerce_groups
from ..core.store.model_store import ModelStore, fork_checkpoint
from ..runtime.endpoint.server import ApiError
from ..runtime.service.model_service import ModelService
from ..runtime.service.placement import Placement
from .access import current
from .errors import json_path
from .jobs import TrainingJob
from .routing import LoadedModels
from .schemas import (
    NAME_PATTERN,
    ExperimentalTrainingConfig,
    ForkCheckpoint,
    ModelCreate,
    SFTConfig,
    SFTTrainingJobCreate,
    TrainingJobCreate,
)
from .sft_uploads import DEFAULT_QUOTA_BYTES, SFTUploads

DEFAULT_ENTITY = "local"  # W&B names an owner; a self-hosted server has one


class ArtServer:
    """What one `art serve` process holds: the model service, its files and its jobs."""

    def __init__(
        self,
        path: str,
        placement: Placement | None = None,
        *,
        upload_quota_bytes: int | None = DEFAULT_QUOTA_BYTES,
    ) -> None:
        self.path = path
        self.service = ModelService(path, placement)  # placement: e.g. a Ray cluster
        self.loaded = LoadedModels()
        self.journal_dir = Path(path) / ".art-serve" / "jobs"
        self.uploads = SFTUploads(path, upload_quota_bytes)
        journals = sorted(self.journal_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        self.jobs: dict[str, TrainingJob] = {}
        for journal in journals:
            job = TrainingJob.restore(journal)
            self.jobs[job.id] = job
        self._running: dict[str, TrainingJob] = {}  # model id -> its unfinished job
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()  # the tables above; never held while waiting on a model
        self._deleting: set[str] = set()  # model ids whose DELETE is under way

    def store(self, model_id: str, param: str = "model_id") -> ModelStore:
        """The model's files, if the key may use it; 404 for an id that names no model."""
        project, _, name = model_id.partition("~")
        if not valid_names(project, name):
            raise ApiError(
                404, f"{param}: {model_id!r} is not a model id (project~name)", param=param
            )
        current().check(project, name, param)
        store = ModelStore(self.path, project, name)
        if store.read_model() is None:
            raise ApiError(
                404,
                f"{param}: unknown model {model_id!r}; register it first (POST /v1/preview/models)",
                param=param,
                code="model_not_found",
            )
        return store

    def lock(self, model_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(model_id, threading.Lock())

    @contextlib.contextmanager
    def writing(self, model_id: str, store: ModelStore, *, uploads: bool = False) -> Iterator[None]:
        """The model's lock, for a call that writes to its files (`uploads`: the lock of its
        SFT uploads, which a training step does not hold); a 404 where the model was deleted
        while the call waited for it, so a deleted model stays deleted."""
        with self.lock(f"{model_id}/uploads" if uploads else model_id):
            if store.read_model() is None:
                raise ApiError(
                    404,
                    f"model_id: model {model_id!r} was deleted",
                    param="model_id",
                    code="model_not_found",
                )
            yield

    def register(self, body: ModelCreate) -> dict[str, Any]:
        current().check(body.project, body.name, "name")
        store = ModelStore(self.path, body.project, body.name)
        existing = store.read_model()
        if existing is not None and not body.return_existing:
            raise ApiError(
                409,
                f"name: model {body.project}/{body.name} exists; send return_existing=true "
                "to use it, or pick another name",
                param="name",
                code="model_exists",
            )
        entity = body.entity or (existing or {}).get("entity") or DEFAULT_ENTITY
        if existing is not None and existing.get("entity", DEFAULT_ENTITY) != entity:
            raise ConfigError(
                "entity",
                f"model {body.name!r} on this server belongs to entity "
                f"{existing.get('entity', DEFAULT_ENTITY)!r}, not {entity!r}",
                "Leave entity unset, or give the new run its own name",
            )
        record: dict[str, Any] = {
            "name": body.name,
            "project": body.project,
            "entity": entity,
            "trainable": body.trainable,
            "config": body.config,
        }
        if body.trainable:
            if body.base_model is None:
                raise ConfigError(
                    "base_model", "a trainable model needs a base model", "Set base_model"
                )
            self.refuse_stored_base(body.base_model)
            record["base_model"] = body.base_model
            internal = body.internal_config
            record["internal_config"] = {} if internal is None else internal.model_dump(mode="json")
        refuse_changed_registration(existing, record, where="this server")
        if body.trainable:
            # Loaded before model.json is written, as LocalBackend does.
            _load(self.service, record)
            self.loaded.add(record)
        with self.lock(model_id(body.project, body.name)):
            store.write_model(record)
        return describe(store, record)

    def refuse_stored_base(self, base_model: str) -> None:
        """A scoped key names base models as the hub does: a path on this server (a stored
        checkpoint may be another tenant's) is refused, whether or not it exists, so the
        answer tells the key nothing of the server's files."""
        if current().admin:
            return
        if base_model.startswith(("/", "~", ".", "\\")) or ":" in base_model:
            raise ApiError(
                403,
                "base_model: a scoped key names a base model by its Hugging Face id "
                "('org/name'), not a path on the server; ask the admin to register one",
                param="base_model",
                code="forbidden",
            )
        root = Path(self.path).resolve()
        try:
            candidate = Path(base_model).expanduser().resolve()
        except (OSError, RuntimeError, ValueError):  # no path the OS can name: not a stored one
            return
        if candidate == root or root in candidate.parents:
            raise ApiError(
                403,
                "base_model: a scoped key may not start from files under this server's "
                "model store; ask the admin, or name a Hugging Face model",
                param="base_model",
                code="forbidden",
            )

    def ensure_loaded(self, store: ModelStore) -> None:
        """Load a model registered before this server (re)started."""
        record = store.read_model() or {}
        if not record.get("trainable"):
            raise ConfigError(
                "model_id",
                f"model {record.get('name')!r} is not trainable",
                "Register an art.TrainableModel to train it",
            )
        if not self.service.is_loaded(record["project"], record["name"]):
            self.service.load(record)
        self.loaded.add({"entity": DEFAULT_ENTITY, **record})

    def fork(self, model_id: str, body: ForkCheckpoint) -> int:
        """Copy another model's checkpoint in as this model's (both readable by the key);
        returns the model's step, which the engine serves from now."""
        store = self.store(model_id)
        project, _, name = model_id.partition("~")
        source = self.store(f"{body.from_project or project}~{body.from_model}", "from_model")
        with self._guard:
            self.refuse_if_training(model_id)
            self.refuse_if_deleting(model_id)
        self.ensure_loaded(store)  # refuses a model that is not trainable
        with self.lock(model_id):
            record = store.read_model() or {}
            fork_checkpoint(store, record["base_model"], source, body.not_after_step)
            return self.service.continue_from_latest(project, name)

    def upload_checkpoint(self, model_id: str, step: int, archive: bytes) -> int:
        """Install a zipped checkpoint as the model's checkpoint `step` (a fork whose
        source the client holds, as from S3); returns the step the engine serves now."""
        from .checkpoint_uploads import install, read_archive

        store = self.store(model_id)
        project, _, name = model_id.partition("~")
        with self._guard:
            self.refuse_if_training(model_id)
            self.refuse_if_deleting(model_id)
        record = store.read_model() or {}
        zipped = read_archive(archive, record.get("base_model", ""))
        self.ensure_loaded(store)  # refuses a model that is not trainable
        with self.lock(model_id):
            install(store, step, zipped)
            return self.service.continue_from_latest(project, name)

    def start_job(self, body: TrainingJobCreate) -> TrainingJob:
        store = self.store(body.model_id)
        config, dev_config = (body.experimental_config or ExperimentalTrainingConfig()).to_configs()
        groups = coerce_groups(parse_groups(body.trajectory_groups), "trajectory_groups")
        # Refused now, as a 400, rather than as a job that fails later.
        check_trainable(groups, allow_without_logprobs=dev_config.allow_training_without_logprobs)
        with self._guard:
            self.refuse_if_training(body.model_id)
            self.refuse_if_deleting(body.model_id)
            sequences = sum(len(group.trajectories) for group in groups)
            job = TrainingJob(body.model_id, sequences, self.journal_dir)
            self._running[body.model_id] = self.jobs[job.id] = job
        record = store.read_model() or {}

        def step() -> tuple[int, list[dict[str, float]]]:
            self.ensure_loaded(store)
            with self.lock(body.model_id):
                metrics = self.service.train(
                    record["project"], record["name"], groups, config, dev_config
                )
            return store.step(), [metrics]

        job.start(step)
        return job

    def start_sft_job(self, body: SFTTrainingJobCreate) -> TrainingJob:
        """An SFT job on uploaded chat JSONL: the data and config are checked now (a 400
        naming every bad line), then each batch is one optimizer step in a worker thread."""
        store = self.store(body.model_id)
        data = self.uploads.resolve(body.model_id, body.training_data_url)
        given = body.config or SFTConfig()
        config = TrainSFTConfig(
            learning_rate=5e-5 if given.learning_rate is None else given.learning_rate,
            batch_size=given.batch_size or "auto",
        )
        batch_size = config.resolved_batch_size()
        try:
            examples = check_file(data, label=body.training_data_url)
        except ArtValueError:
            data.unlink(missing_ok=True)  # it can never train: the client uploads a fixed file
            raise
        if examples == 0:
            data.unlink(missing_ok=True)
            raise ConfigError(
                "training_data_url",
                f"{body.training_data_url} holds no examples",
                "Upload chat JSONL with one example per line",
            )
        batches = math.ceil(examples / batch_size)
        if isinstance(config.learning_rate, list) and len(config.learning_rate) != batches:
            raise ConfigError(
                "config.learning_rate",
                f"{len(config.learning_rate)} rates for {batches} batches of {batch_size}",
                "Give one rate, or exactly one per batch",
            )
        with self._guard:
            self.refuse_if_training(body.model_id)
            self.refuse_if_deleting(body.model_id)
            job = TrainingJob(body.model_id, batches, self.journal_dir)
            self._running[body.model_id] = self.jobs[job.id] = job
        record = store.read_model() or {}

        def step() -> tuple[int, list[dict[str, float]]]:
            try:
                self.ensure_loaded(store)
                with self.lock(body.model_id):
                    examples = read_file(data, label=body.training_data_url)
                    spool, _ = spool_examples(examples, store.dir)
                    try:
                        rows = self.service.train_sft(
                            record["project"],
                            record["name"],
                            str(spool),
                            config.learning_rate,
                            batch_size,
                            dev.TrainSFTConfig(),
                        )
                    finally:
                        spool.unlink(missing_ok=True)
            finally:
                data.unlink(missing_ok=True)  # read by this job: the client uploads again to retry
            return store.step(), rows

        job.start(step)
        return job

    def delete(self, model_id: str) -> dict[str, Any]:
        """Unload the model and remove its files. Only this model waits meanwhile (its
        running requests finish first); the server-wide guard is held only to mark it."""
        store = self.store(model_id)
        with self._guard:
            self.refuse_if_training(model_id)
            self.refuse_if_deleting(model_id)
            self._deleting.add(model_id)
        try:
            with self.lock(model_id):
                record = store.read_model() or {}
                checkpoints = len(store.checkpoint_steps())
                self.loaded.remove(record["project"], record["name"])
                self.service.unload(record["project"], record["name"])
                with self._guard:
                    doomed_jobs = [job for job in self.jobs.values() if job.model_id == model_id]
                    for job in doomed_jobs:
                        del self.jobs[job.id]
                for job in doomed_jobs:
                    job.forget()
                store.delete()
            with self.lock(f"{model_id}/uploads"):
                self.uploads.delete_all(model_id)
        finally:
            with self._guard:
                self._deleting.discard(model_id)
        return {"model_id": model_id, "deleted_checkpoints": checkpoints, "deleted_run": False}

    def refuse_if_deleting(self, model_id: str) -> None:
        """409 while the model is being deleted: no job may start on it meanwhile."""
        if model_id in self._deleting:
            raise ApiError(
                409,
                f"model_id: model {model_id!r} is being deleted",
                param="model_id",
                code="model_deleting",
            )

    def refuse_if_training(self, model_id: str) -> None:
        """One job per model at a time: 409 while one is unfinished."""
        running = self._running.get(model_id)
        if running is not None and not running.finished:
            raise ApiError(
                409,
                f"model_id: model {model_id!r} is training in job {running.id}; wait for it to end",
                param="model_id",
                code="job_running",
            )

    def job(self, job_id: str) -> TrainingJob:
        job = self.jobs.get(job_id)
        if job is not None:
            project, _, name = job.model_id.partition("~")
            if current().allows(project, name):
                return job
        raise ApiError(
            404,
            f"training_job_id: unknown training job {job_id!r}",
            param="training_job_id",
            code="job_not_found",
        )

    def close(self) -> None:
        self.service.close()


def _load(service: ModelService, record: dict[str, Any]) -> None:
    """Load a model for serving; what the client got wrong is a `ConfigError` naming it."""
    try:
        service.load(record)
    except ArtValueError as error:
        field = error.field.replace("_internal_config", "internal_config", 1)
        raise type(error)(field, error.problem, error.fix) from error
    except (OSError, ValueError) as error:  # transformers: no such model, or not one it reads
        reason = f"{type(error).__name__}: {error}"[:300]
        raise ConfigError(
            "base_model",
            f"this server cannot load {record['base_model']!r} ({reason})",
            "Name a Hugging Face model the server can download, or a model directory on it",
        ) from error


def model_id(project: str, name: str) -> str:
    return f"{project}~{name}"


def describe(store: ModelStore, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": model_id(record["project"], record["name"]),
        "entity": record.get("entity", DEFAULT_ENTITY),
        "project": record["project"],
        "name": record["name"],
        "base_model": record.get("base_model"),
        "run_id": None,
        # Extensions: what the client checks was applied.
        "trainable": bool(record.get("trainable")),
        "internal_config": record.get("internal_config"),
        "step": store.step(),
    }


def valid_names(project: str, name: str) -> bool:
    return all(re.fullmatch(NAME_PATTERN, part) for part in (project, name))  # "x\n" too


def parse_groups(raw: list[dict[str, Any]]) -> list[TrajectoryGroup]:
    groups = []
    for index, item in enumerate(raw):
        if not isinstance(item.get("trajectories"), list):
            param = f"trajectory_groups[{index}].trajectories"
            raise ApiError(400, f"{param}: must be a list of trajectories", param=param)
        try:
            groups.append(TrajectoryGroup.model_validate(item))
        except ValidationError as error:
            first = error.errors()[0]
            param = json_path(["trajectory_groups", index, *first["loc"]])
            raise ApiError(400, f"{param}: {first['msg']}", param=param) from error
    return groups


__all__ = ["DEFAULT_ENTITY", "ArtServer", "describe", "model_id", "parse_groups", "valid_names"]
