"""`art serve`: the model service behind HTTP, for many clients and models.

The training API is the W&B Training API as ART's published client speaks it, so
`ServerlessBackend` (ours or ART's) is the client of both this server and the managed
service. Every route but `GET /health` needs `Authorization: Bearer <key>` (see
`access` for admin and scoped keys).

    POST   /v1/preview/models                          create (or with return_existing, return) a model
    DELETE /v1/preview/models/{id}                     unload a model and delete its files
    POST   /v1/preview/models/{id}/log                 store trajectory groups and/or metrics
    GET    /v1/preview/models/{id}/checkpoints         a cursor page of checkpoints and their metrics
    DELETE /v1/preview/models/{id}/checkpoints         delete the given steps (never the latest)
    POST   /v1/preview/training-jobs                   start one training step (worker thread)
    GET    /v1/preview/training-jobs/{id}              a job's status
    GET    /v1/preview/training-jobs/{id}/events       its events `after` a cursor, waiting `wait` s
    POST   /v1/preview/sft-training-jobs               managed-only: refused with a clear error
    GET    /v1/preview/models/{id}, /v1/preview/training-jobs?model_id=   (extensions)
    POST   /v1/keys, GET /v1/keys, DELETE /v1/keys/{id}  scoped keys (admin key only)
    POST   /v1/chat/completions, GET /v1/models        the OpenAI-compatible endpoint
    GET    /openapi.json, /docs                        this API's schema

A model's id is `project~name`. Errors are `{"error": {"message", "type", "param",
"code"}}` with `param` the JSON path of the offending field; an `art` input error adds
its `problem` and `fix`, so the client raises it again as itself. Each rejected request
is one warning line in the server's log.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ...core.errors import ArtValueError, ConfigError
from ...core.storage import ModelStore, check_split
from ...core.trajectories import TrajectoryGroup
from ...core.validation import coerce_groups
from ..local.openai_server import ApiError, build_app
from ..local.service import ModelService
from .access import KeyStore, RequireKey, current, log_rejected
from .jobs import TrainingJob
from .limits import BodyLimit
from .routing import LoadedModels, ScopedRouter
from .schemas import (
    NAME_PATTERN,
    DeleteCheckpoints,
    ExperimentalTrainingConfig,
    KeyCreate,
    LogRequest,
    ModelCreate,
    TrainingJobCreate,
)

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
DEFAULT_ENTITY = "local"  # W&B names an owner; a self-hosted server has one
_MAX_POLL_SECONDS = 30.0


class ArtServer:
    """What one `art serve` process holds: the model service, its files and its jobs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.service = ModelService(path)
        self.loaded = LoadedModels()
        self.journal_dir = Path(path) / ".art-serve" / "jobs"
        journals = sorted(self.journal_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
        self.jobs: dict[str, TrainingJob] = {}
        for journal in journals:
            job = TrainingJob.restore(journal)
            self.jobs[job.id] = job
        self._running: dict[str, TrainingJob] = {}  # model id -> its unfinished job
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def store(self, model_id: str, param: str = "model_id") -> ModelStore:
        """The model's files, if the key may use it; 404 for an id that names no model."""
        project, _, name = model_id.partition("~")
        if not _valid(project, name):
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
        if existing is not None and existing.get("base_model") != record.get("base_model"):
            raise ConfigError(
                "base_model",
                f"model {body.name!r} on this server was trained from "
                f"{existing.get('base_model')!r}, not {record.get('base_model')!r}",
                "Give the new run its own name, or keep the original base_model",
            )
        if body.trainable:
            # Loaded before model.json is written, as LocalBackend does.
            _load(self.service, record)
            self.loaded.add(record)
        with self.lock(model_id(body.project, body.name)):
            store.write_model(record)
        return describe(store, record)

    def refuse_stored_base(self, base_model: str) -> None:
        """A scoped key may not start from a checkpoint stored here: it may be another's."""
        if current().admin:
            return
        root = Path(self.path).resolve()
        candidate = Path(base_model).expanduser().resolve()
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

    def start_job(self, body: TrainingJobCreate) -> TrainingJob:
        store = self.store(body.model_id)
        config, dev_config = (body.experimental_config or ExperimentalTrainingConfig()).to_configs()
        groups = coerce_groups(_groups(body.trajectory_groups), "trajectory_groups")
        with self._guard:
            self.refuse_if_training(body.model_id)
            sequences = sum(len(group.trajectories) for group in groups)
            job = TrainingJob(body.model_id, sequences, self.journal_dir)
            self._running[body.model_id] = self.jobs[job.id] = job
        record = store.read_model() or {}
        groups_json = [group.model_dump_json() for group in groups]
        config_json, dev_json = config.model_dump(mode="json"), dev_config.model_dump(mode="json")

        def step() -> tuple[int, dict[str, float]]:
            self.ensure_loaded(store)
            with self.lock(body.model_id):
                metrics = self.service.train(
                    record["project"], record["name"], groups_json, config_json, dev_json
                )
            return store.step(), metrics

        job.start(step)
        return job

    def delete(self, model_id: str) -> dict[str, Any]:
        store = self.store(model_id)
        with self._guard:
            self.refuse_if_training(model_id)  # at once, not after waiting for the job's lock
        with self.lock(model_id), self._guard:
            self.refuse_if_training(model_id)
            record = store.read_model() or {}
            checkpoints = len(store.checkpoint_steps())
            self.loaded.remove(record["project"], record["name"])
            self.service.unload(record["project"], record["name"])
            for job in [job for job in self.jobs.values() if job.model_id == model_id]:
                del self.jobs[job.id]
                job.forget()
            doomed = store.dir.with_name(f".{store.dir.name}.deleting")
            store.dir.rename(doomed)  # gone from view at once, even if rmtree is cut off
            shutil.rmtree(doomed)
        return {"model_id": model_id, "deleted_checkpoints": checkpoints, "deleted_run": False}

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


def build_server_app(
    path: str,
    api_key: str | None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The `art serve` app: the OpenAI endpoint of `build_app` plus the training API.

    `api_key` is the admin key; None serves without one (the CLI allows that on
    loopback only).
    """
    server = ArtServer(path)
    keys = KeyStore(path, api_key)
    app = build_app(ScopedRouter(server.service, server.loaded, path), None)
    app.state.art_server = server
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(RequireKey, keys=keys)  # outermost: no body is read without a key
    _add_error_handlers(app)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="art serve")

    @app.post("/v1/preview/models")
    async def create_model(body: ModelCreate) -> dict[str, Any]:
        return await asyncio.to_thread(server.register, body)

    @app.get("/v1/preview/models/{model_id}")
    async def get_model(model_id: str) -> dict[str, Any]:
        store = server.store(model_id)
        return describe(store, store.read_model() or {})

    @app.delete("/v1/preview/models/{model_id}")
    async def delete_model(model_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(server.delete, model_id)

    @app.post("/v1/preview/models/{model_id}/log")
    async def log(model_id: str, body: LogRequest) -> dict[str, Any]:
        store = server.store(model_id)
        if body.model_id not in (None, model_id):
            raise ApiError(
                400,
                f"model_id: {body.model_id!r} differs from the path's {model_id!r}",
                param="model_id",
            )
        split = check_split(body.split)
        groups = _groups(body.trajectory_groups)
        if groups:
            groups = coerce_groups(groups, "trajectory_groups")
        if not groups and not body.metrics:
            raise ConfigError(
                "trajectory_groups", "nothing to log", "Send trajectory groups, metrics, or both"
            )

        def write() -> int:
            with server.lock(model_id):
                step = store.step() if body.step is None else body.step
                if groups:
                    store.write_trajectories(split, step, groups)
                if body.metrics:
                    store.append_history(step, body.metrics)
                return step

        return {"step": await asyncio.to_thread(write)}

    @app.get("/v1/preview/models/{model_id}/checkpoints")
    async def list_checkpoints(
        model_id: str,
        after: str | None = None,
        limit: int = Query(default=20, ge=1, le=100),
        order: Literal["asc", "desc"] = "asc",
    ) -> dict[str, Any]:
        store = server.store(model_id)
        steps = store.checkpoint_steps()
        if order == "desc":
            steps.reverse()
        if after is not None:
            prefix, _, step_text = after.rpartition("@")
            if prefix != model_id or not step_text.isdigit() or int(step_text) not in steps:
                raise ApiError(
                    400, f"after: {after!r} is not a checkpoint id of this model", param="after"
                )
            steps = steps[steps.index(int(step_text)) + 1 :]
        page = steps[:limit]
        metrics = await asyncio.to_thread(_metrics_by_step, store)
        data = [
            {"id": f"{model_id}@{step}", "step": step, "metrics": metrics.get(step, {})}
            for step in page
        ]
        return _page(data, has_more=len(steps) > limit)

    @app.delete("/v1/preview/models/{model_id}/checkpoints")
    async def delete_checkpoints(model_id: str, body: DeleteCheckpoints) -> dict[str, Any]:
        store = server.store(model_id)

        def delete() -> tuple[list[int], list[int]]:
            with server.lock(model_id):
                existing = set(store.checkpoint_steps())
                wanted = set(body.steps)
                latest = store.step()
                if latest in wanted:
                    raise ConfigError(
                        "steps", f"step {latest} is the latest checkpoint", "Keep the latest step"
                    )
                deleted = store.delete_checkpoints(keep=existing - wanted)
                return deleted, sorted(wanted - existing)

        deleted, missing = await asyncio.to_thread(delete)
        return {"deleted_count": len(deleted), "not_found_steps": missing, "deleted_steps": deleted}

    @app.post("/v1/preview/training-jobs")
    async def create_training_job(body: TrainingJobCreate) -> dict[str, Any]:
        job = await asyncio.to_thread(server.start_job, body)
        return _describe_job(job)

    @app.get("/v1/preview/training-jobs")
    async def list_training_jobs(model_id: str | None = None) -> dict[str, Any]:
        principal = current()
        jobs = [
            job
            for job in server.jobs.values()
            if model_id in (None, job.model_id)
            and principal.allows(*job.model_id.partition("~")[::2])
        ]
        return _page([_describe_job(job) for job in jobs], has_more=False)

    @app.get("/v1/preview/training-jobs/{training_job_id}")
    async def get_training_job(training_job_id: str) -> dict[str, Any]:
        return _describe_job(server.job(training_job_id))

    @app.get("/v1/preview/training-jobs/{training_job_id}/events")
    async def training_job_events(
        training_job_id: str,
        after: str | None = None,
        limit: int = Query(default=20, ge=1, le=100),
        wait: float = Query(default=0.0, ge=0, le=_MAX_POLL_SECONDS),
    ) -> dict[str, Any]:
        job = server.job(training_job_id)
        if after is not None and not after.isdigit():
            raise ApiError(400, f"after: {after!r} is not an event id of this job", param="after")
        start = 0 if after is None else int(after)
        events, more = await asyncio.to_thread(job.events_after, start, limit, wait)
        return {**_page(events, has_more=more), "status": job.status}

    @app.post("/v1/preview/sft-training-jobs")
    async def create_sft_training_job() -> dict[str, Any]:
        raise ApiError(
            400,
            "training_data_url: SFT jobs read their data from W&B artifacts, a feature of "
            "the managed W&B Training service only; art serve trains with RL "
            "(POST /v1/preview/training-jobs)",
            param="training_data_url",
            code="managed_only",
        )

    @app.post("/v1/keys")
    async def create_key(body: KeyCreate) -> dict[str, Any]:
        current().check_admin()
        _check_scope(body)
        return await asyncio.to_thread(keys.create, body.name, body.projects, body.models)

    @app.get("/v1/keys")
    async def list_keys() -> dict[str, Any]:
        current().check_admin()
        return _page(keys.list(), has_more=False)

    @app.delete("/v1/keys/{key_id}")
    async def delete_key(key_id: str) -> dict[str, Any]:
        current().check_admin()
        await asyncio.to_thread(keys.delete, key_id)
        return {"id": key_id, "deleted": True}

    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every refusal: a 4xx naming the field by JSON path, and one warning line."""

    async def api_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ApiError)
        log_rejected(request.method, request.url.path, error)
        return error.response()

    async def art_value_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, ArtValueError)
        log_rejected(request.method, request.url.path, ApiError(400, str(error)))
        body = {
            "message": str(error),
            "type": "invalid_request_error",
            "param": error.field,
            "code": type(error).__name__,
            "problem": error.problem,
            "fix": error.fix,
        }
        return JSONResponse({"error": body}, status_code=400)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        return await api_error(request, validation_error(error.errors()))

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        param = {404: "path", 405: "method"}.get(error.status_code, "body")
        message = f"{param}: {request.method} {request.url.path}: {error.detail}"
        return await api_error(request, ApiError(error.status_code, message, param=param))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(ArtValueError, art_value_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StarletteHTTPException, http_error)


def validation_error(errors: Any) -> ApiError:
    """pydantic's first error as a 400 whose `param` is the JSON path (`a.b[0].c`)."""
    first = errors[0]
    location = list(first.get("loc", ()))
    where = location.pop(0) if location and location[0] in ("body", "query", "path") else ""
    if first.get("type") == "json_invalid":
        position = first.get("ctx", {}).get("error", "")
        return ApiError(400, f"body: not valid JSON ({position})", param="body")
    param = json_path(location) or where or "body"
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        message = "unknown field; remove it (see /docs for the fields this route takes)"
    return ApiError(400, f"{param}: {message}", param=param)


def json_path(location: list[Any]) -> str:
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not str(part).startswith("function-") and "[" not in str(part):
            path += f".{part}" if path else str(part)
    return path


def _page(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """A cursor page as the W&B Training API answers one."""
    return {
        "object": "list",
        "data": data,
        "first_id": str(data[0]["id"]) if data else "",
        "last_id": str(data[-1]["id"]) if data else "",
        "has_more": has_more,
    }


def _describe_job(job: TrainingJob) -> dict[str, Any]:
    return {"id": job.id, "model_id": job.model_id, "status": job.status}


def _metrics_by_step(store: ModelStore) -> dict[int, dict[str, float]]:
    metrics: dict[int, dict[str, float]] = {}
    for row in store.read_history():
        values = {
            k: float(v)
            for k, v in row.items()
            if k not in ("step", "recorded_at") and isinstance(v, int | float)
        }
        metrics.setdefault(row["step"], {}).update(values)
    return metrics


def _check_scope(body: KeyCreate) -> None:
    if not body.projects and not body.models:
        raise ApiError(400, "projects: name at least one project or model", param="projects")
    for index, project in enumerate(body.projects):
        if not re.match(NAME_PATTERN, project):
            raise ApiError(
                400,
                f"projects[{index}]: {project!r} is not a project name",
                param=f"projects[{index}]",
            )
    for index, model in enumerate(body.models):
        project, _, name = model.partition("/")
        if not _valid(project, name):
            raise ApiError(
                400, f"models[{index}]: {model!r} is not 'project/name'", param=f"models[{index}]"
            )


def _valid(project: str, name: str) -> bool:
    return all(re.match(NAME_PATTERN, part) for part in (project, name))


def _groups(raw: list[dict[str, Any]]) -> list[TrajectoryGroup]:
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


__all__ = ["ArtServer", "build_server_app"]
