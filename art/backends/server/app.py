"""`art serve`: the model service behind HTTP, for many clients and models.

The REST API follows the managed ART training service, so `ServerlessBackend` is the
client of both. Everything lives under `/v1` and needs `Authorization: Bearer <key>`;
only `GET /health` does not.

    POST   /v1/preview/models                          create (or return) a model
    GET    /v1/preview/models/{id}                     a model and its current step
    DELETE /v1/preview/models/{id}                     delete a model and its files
    POST   /v1/preview/models/{id}/log                 store trajectory groups and/or metrics
    GET    /v1/preview/models/{id}/checkpoints         checkpoints with their metrics
    DELETE /v1/preview/models/{id}/checkpoints         delete steps, or all but latest and best
    POST   /v1/preview/training-jobs                   start one training step (worker thread)
    GET    /v1/preview/training-jobs?model_id=         jobs since the server started
    GET    /v1/preview/training-jobs/{id}              a job's status
    GET    /v1/preview/training-jobs/{id}/events       its events after `after`, waiting `wait` s
    POST   /v1/chat/completions, GET /v1/models        the OpenAI-compatible endpoint

A model's id is `project~name`. Errors are `{"error": {"message", "type", "param",
"code"}}`; an `art` input error adds its `problem` and `fix`, so the client raises it
again as itself.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...core.errors import ArtValueError, ConfigError
from ...core.storage import ModelStore, check_split
from ...core.trajectories import TrajectoryGroup
from ...core.validation import coerce_groups
from ..local.openai_server import ApiError, build_app
from ..local.service import ModelService
from .jobs import TrainingJob

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # as art.Model names: safe as directories
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_MAX_POLL_SECONDS = 30.0

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ModelCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(pattern=NAME_PATTERN)
    name: str = Field(pattern=NAME_PATTERN)
    entity: str | None = None
    trainable: bool = False
    base_model: str | None = Field(default=None, min_length=1)
    config: Any = None
    internal_config: dict[str, Any] | None = None


class LogRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trajectory_groups: list[dict[str, Any]] = Field(default_factory=list)
    split: str = "train"
    step: int | None = Field(default=None, ge=0)
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)


class DeleteCheckpoints(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[int] | None = None
    best_checkpoint_metric: str | None = None


class TrainingJobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_id: str
    trajectory_groups: list[dict[str, Any]] = Field(min_length=1)
    config: dict[str, Any] = Field(default_factory=dict)
    dev_config: dict[str, Any] = Field(default_factory=dict)


class ArtServer:
    """What one `art serve` process holds: the model service, its files and its jobs."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.service = ModelService(path)
        self.jobs: dict[str, TrainingJob] = {}
        self._running: dict[str, TrainingJob] = {}  # model id -> its unfinished job
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def store(self, model_id: str) -> ModelStore:
        """The model's files; 404 for an id that names no registered model."""
        project, _, name = model_id.partition("~")
        store = ModelStore(self.path, project, name) if _valid(project, name) else None
        if store is None or store.read_model() is None:
            raise ApiError(
                404,
                f"unknown model {model_id!r}; register it first (POST /v1/preview/models)",
                param="model_id",
                code="model_not_found",
            )
        return store

    def lock(self, model_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(model_id, threading.Lock())

    def register(self, body: ModelCreate) -> dict[str, Any]:
        store = ModelStore(self.path, body.project, body.name)
        record: dict[str, Any] = {
            "name": body.name,
            "project": body.project,
            "trainable": body.trainable,
            "config": body.config,
        }
        if body.entity is not None:
            record["entity"] = body.entity
        if body.trainable:
            if body.base_model is None:
                raise ConfigError(
                    "base_model", "a trainable model needs a base model", "Set base_model"
                )
            record["base_model"] = body.base_model
            record["internal_config"] = body.internal_config or {}
        existing = store.read_model()
        if existing is not None and existing.get("base_model") != record.get("base_model"):
            raise ConfigError(
                "base_model",
                f"model {body.name!r} on this server was trained from "
                f"{existing.get('base_model')!r}, not {record.get('base_model')!r}",
                "Give the new run its own name, or keep the original base_model",
            )
        if body.trainable:
            # Loaded before model.json is written, as LocalBackend does.
            self.service.load(record)
        with self.lock(model_id(body.project, body.name)):
            store.write_model(record)
        return describe(store, record)

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

    def start_job(self, body: TrainingJobCreate) -> TrainingJob:
        store = self.store(body.model_id)
        groups = coerce_groups(_groups(body.trajectory_groups), "trajectory_groups")
        job = TrainingJob(body.model_id)
        with self._guard:
            self.refuse_if_training(body.model_id)
            self._running[body.model_id] = self.jobs[job.id] = job
        record = store.read_model() or {}
        groups_json = [group.model_dump_json() for group in groups]

        def step() -> tuple[int, dict[str, float]]:
            self.ensure_loaded(store)
            with self.lock(body.model_id):
                metrics = self.service.train(
                    record["project"], record["name"], groups_json, body.config, body.dev_config
                )
            return store.step(), metrics

        job.start(step)
        return job

    def refuse_if_training(self, model_id: str) -> None:
        """One job per model at a time: 409 while one is unfinished."""
        running = self._running.get(model_id)
        if running is not None and not running.finished:
            raise ApiError(
                409,
                f"model {model_id!r} is training in job {running.id}; wait for it to end",
                code="job_running",
            )

    def close(self) -> None:
        self.service.close()


def model_id(project: str, name: str) -> str:
    return f"{project}~{name}"


def describe(store: ModelStore, record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": model_id(record["project"], record["name"]),
        "entity": record.get("entity"),
        "project": record["project"],
        "name": record["name"],
        "base_model": record.get("base_model"),
        "trainable": bool(record.get("trainable")),
        "run_id": None,
        "step": store.step(),
    }


def build_server_app(
    path: str,
    api_key: str | None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The `art serve` app: the OpenAI endpoint of `build_app` plus the training API."""
    server = ArtServer(path)
    app = build_app(server.service, api_key)
    app.state.art_server = server
    app.add_middleware(_BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(ArtValueError)
    async def _art_value_error(request: Request, error: ArtValueError) -> JSONResponse:
        body = {
            "message": str(error),
            "type": "invalid_request_error",
            "param": error.field,
            "code": type(error).__name__,
            "problem": error.problem,
            "fix": error.fix,
        }
        return JSONResponse({"error": body}, status_code=400)

    @app.post("/v1/preview/models")
    async def create_model(body: ModelCreate) -> dict[str, Any]:
        return await asyncio.to_thread(server.register, body)

    @app.get("/v1/preview/models/{model_id}")
    async def get_model(model_id: str) -> dict[str, Any]:
        store = server.store(model_id)
        return describe(store, store.read_model() or {})

    @app.delete("/v1/preview/models/{model_id}")
    async def delete_model(model_id: str) -> dict[str, Any]:
        store = server.store(model_id)
        server.refuse_if_training(model_id)
        with server.lock(model_id):
            await asyncio.to_thread(shutil.rmtree, store.dir)
        return {"id": model_id, "deleted": True}

    @app.post("/v1/preview/models/{model_id}/log")
    async def log(model_id: str, body: LogRequest) -> dict[str, Any]:
        store = server.store(model_id)
        split = check_split(body.split)
        groups = _groups(body.trajectory_groups)

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
    async def list_checkpoints(model_id: str) -> dict[str, Any]:
        store = server.store(model_id)
        rows = await asyncio.to_thread(store.read_history)
        metrics: dict[int, dict[str, Any]] = {}
        for row in rows:
            values = {k: v for k, v in row.items() if k not in ("step", "recorded_at")}
            metrics.setdefault(row["step"], {}).update(values)
        data = [
            {"id": f"{model_id}@{step}", "step": step, "metrics": metrics.get(step, {})}
            for step in store.checkpoint_steps()
        ]
        return {"object": "list", "data": data, "has_more": False}

    @app.delete("/v1/preview/models/{model_id}/checkpoints")
    async def delete_checkpoints(model_id: str, body: DeleteCheckpoints) -> dict[str, Any]:
        store = server.store(model_id)
        if (body.steps is None) == (body.best_checkpoint_metric is None):
            raise ConfigError(
                "steps", "give either steps or best_checkpoint_metric", "Send exactly one of them"
            )

        def delete() -> tuple[list[int], list[int]]:
            with server.lock(model_id):
                if body.best_checkpoint_metric is not None:
                    return store.delete_checkpoints_but_best(body.best_checkpoint_metric), []
                existing = set(store.checkpoint_steps())
                wanted = set(body.steps or [])
                latest = store.step()
                if latest in wanted:
                    raise ConfigError(
                        "steps", f"step {latest} is the latest checkpoint", "Keep the latest step"
                    )
                deleted = store.delete_checkpoints(keep=existing - wanted)
                return deleted, sorted(wanted - existing)

        deleted, missing = await asyncio.to_thread(delete)
        return {"deleted_steps": deleted, "deleted_count": len(deleted), "not_found_steps": missing}

    @app.post("/v1/preview/training-jobs", status_code=201)
    async def create_training_job(body: TrainingJobCreate) -> dict[str, Any]:
        job = await asyncio.to_thread(server.start_job, body)
        return {"id": job.id, "model_id": job.model_id, "status": job.status}

    @app.get("/v1/preview/training-jobs")
    async def list_training_jobs(model_id: str | None = None) -> dict[str, Any]:
        jobs = [job for job in server.jobs.values() if model_id in (None, job.model_id)]
        data = [{"id": job.id, "model_id": job.model_id, "status": job.status} for job in jobs]
        return {"object": "list", "data": data, "has_more": False}

    @app.get("/v1/preview/training-jobs/{job_id}")
    async def get_training_job(job_id: str) -> dict[str, Any]:
        job = _job(server, job_id)
        return {"id": job.id, "model_id": job.model_id, "status": job.status}

    @app.get("/v1/preview/training-jobs/{job_id}/events")
    async def training_job_events(
        job_id: str,
        after: int = Query(default=0, ge=0),
        limit: int = Query(default=100, ge=1, le=1000),
        wait: float = Query(default=0.0, ge=0, le=_MAX_POLL_SECONDS),
    ) -> dict[str, Any]:
        job = _job(server, job_id)
        events = await asyncio.to_thread(job.events_after, after, limit, wait)
        return {"object": "list", "data": events, "status": job.status}

    return app


def _job(server: ArtServer, job_id: str) -> TrainingJob:
    job = server.jobs.get(job_id)
    if job is None:
        raise ApiError(
            404,
            f"unknown training job {job_id!r} (jobs are forgotten when the server restarts; "
            "the model keeps its completed steps)",
            param="job_id",
            code="job_not_found",
        )
    return job


def _valid(project: str, name: str) -> bool:
    return all(re.match(NAME_PATTERN, part) for part in (project, name))


def _groups(raw: list[dict[str, Any]]) -> list[TrajectoryGroup]:
    groups = []
    for index, item in enumerate(raw):
        try:
            groups.append(TrajectoryGroup.model_validate(item))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ApiError(
                400,
                f"trajectory_groups.{index}.{where}: {first['msg']}",
                param=f"trajectory_groups.{index}.{where}",
            ) from error
    return groups


class _BodyLimit:
    """Refuses request bodies over `max_bytes` with 413, whether declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        text = f"request body is larger than this server's limit of {self.max_bytes} bytes"
        error = {"message": text, "type": "invalid_request_error", "param": None, "code": None}
        payload = json.dumps({"error": error}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class _TooLarge(Exception):
    pass


__all__ = ["ArtServer", "build_server_app"]
