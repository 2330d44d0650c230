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
    POST   /v1/preview/models/{id}/sft-data[/{upload}] upload SFT chat JSONL, in parts (extension)
    POST   /v1/preview/sft-training-jobs               SFT on an upload (art-serve:///sft-data/...);
                                                       W&B artifact URLs are managed-only (400)
    GET    /v1/preview/models/{id}, /v1/preview/training-jobs?model_id=   (extensions)
    POST   /v1/keys, GET /v1/keys, DELETE /v1/keys/{id}  scoped keys (admin key only)
    POST   /v1/chat/completions, GET /v1/models        the OpenAI-compatible endpoint
    GET    /openapi.json, /docs                        this API's schema

A model's id is `project~name`. Errors are `{"error": {"message", "type", "param",
"code"}}` with `param` the JSON path of the offending field; an `art` input error adds
its `problem` and `fix`, so the client raises it again as itself. Each rejected request
is one warning line in the server's log (logger `art.serve`); each model registered or
deleted, and each training job's start and end (`jobs`), one info line naming it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from ..core.data.arguments import parse_step
from ..core.data.errors import ConfigError
from ..core.data.log_checks import check_split
from ..core.data.validation import coerce_groups
from ..core.store.model_store import ModelStore
from ..runtime.endpoint.server import ApiError, build_app
from ..runtime.service.placement import Placement
from .access import KeyStore, RequireKey, current
from .errors import add_error_handlers
from .jobs import TrainingJob
from .limits import BodyLimit
from .routing import ScopedRouter
from .schemas import (
    NAME_PATTERN,
    DeleteCheckpoints,
    ForkCheckpoint,
    KeyCreate,
    LogRequest,
    ModelCreate,
    SFTTrainingJobCreate,
    TrainingJobCreate,
)
from .sft_uploads import DEFAULT_QUOTA_BYTES
from .state import ArtServer, describe, parse_groups, valid_names
from .tinker.routes import add_tinker_routes

logger = logging.getLogger("art.serve")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_MAX_POLL_SECONDS = 30.0


def build_server_app(
    path: str,
    api_key: str | None,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    upload_quota_bytes: int | None = DEFAULT_QUOTA_BYTES,
    placement: Placement | None = None,
) -> FastAPI:
    """The `art serve` app: the OpenAI endpoint of `build_app` plus the training API.

    `api_key` is the admin key; None serves without one (the CLI allows that on
    loopback only). `upload_quota_bytes`: the SFT upload bytes not yet trained a scoped key
    may hold (None: no limit). `placement` runs the engines and trainers elsewhere (`art
    serve --ray`).
    """
    server = ArtServer(path, placement, upload_quota_bytes=upload_quota_bytes)
    keys = KeyStore(path, api_key)
    app = build_app(ScopedRouter(server.service, server.loaded, path), None)
    app.state.art_server = server
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(RequireKey, keys=keys)  # outermost: no body is read without a key
    add_error_handlers(app)
    add_tinker_routes(app, server)

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="art serve")

    @app.post("/v1/preview/models")
    async def create_model(body: ModelCreate) -> dict[str, Any]:
        model = await asyncio.to_thread(server.register, body)
        if model["trainable"]:
            logger.info(
                "model %s registered (base model %s, step %d)",
                model["id"],
                model["base_model"],
                model["step"],
            )
        else:
            logger.info("model %s registered (not trainable)", model["id"])
        return model

    @app.get("/v1/preview/models/{model_id}")
    async def get_model(model_id: str) -> dict[str, Any]:
        store = server.store(model_id)
        return describe(store, store.read_model() or {})

    @app.delete("/v1/preview/models/{model_id}")
    async def delete_model(model_id: str) -> dict[str, Any]:
        deleted = await asyncio.to_thread(server.delete, model_id)
        logger.info("model %s deleted (%d checkpoints)", model_id, deleted["deleted_checkpoints"])
        return deleted

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

        def write() -> int:  # in a worker thread: checking many groups takes a while
            groups = parse_groups(body.trajectory_groups)
            if groups:
                groups = coerce_groups(groups, "trajectory_groups")
            if not groups and not body.metrics:
                raise ConfigError(
                    "trajectory_groups",
                    "nothing to log",
                    "Send trajectory groups, metrics, or both",
                )
            with server.writing(model_id, store):
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
            step = parse_step(step_text)
            if prefix != model_id or step is None or step not in steps:
                raise ApiError(
                    400, f"after: {after!r} is not a checkpoint id of this model", param="after"
                )
            steps = steps[steps.index(step) + 1 :]
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

        server.refuse_if_training(model_id)  # its step holds the model until it ends

        def delete() -> tuple[list[int], list[int]]:
            with server.writing(model_id, store):
                existing = set(store.checkpoint_steps())
                wanted = set(body.steps)
                latest = store.step()
                if latest in wanted:
                    raise ConfigError(
                        "steps", f"step {latest} is the latest checkpoint", "Keep the latest step"
                    )
                deleted = store.delete_checkpoints(keep=existing - wanted)
                if deleted:  # an engine may still hold them
                    project, _, name = model_id.partition("~")
                    server.service.forget_deleted_checkpoints(project, name)
                return deleted, sorted(wanted - existing)

        deleted, missing = await asyncio.to_thread(delete)
        return {"deleted_count": len(deleted), "not_found_steps": missing, "deleted_steps": deleted}

    @app.post("/v1/preview/models/{model_id}/fork")
    async def fork(model_id: str, body: ForkCheckpoint) -> dict[str, Any]:
        """ART's `_experimental_fork_checkpoint` (our extension of the API): the model
        starts from another model's checkpoint, which it serves and trains on from."""
        try:
            step = await asyncio.to_thread(server.fork, model_id, body)
        except FileNotFoundError as error:  # its message names the server's path: not sent
            source = f"{body.from_project or model_id.partition('~')[0]}/{body.from_model}"
            raise ApiError(
                404,
                f"from_model: model {source} has no checkpoints to fork from",
                param="from_model",
            ) from error
        logger.info("model %s forked from %s at step %d", model_id, body.from_model, step)
        return {"model_id": model_id, "step": step}

    @app.put("/v1/preview/models/{model_id}/checkpoints/{step}")
    async def upload_checkpoint(model_id: str, step: int, request: Request) -> dict[str, Any]:
        """A checkpoint the client holds (zipped adapter files) becomes the model's
        checkpoint `step` (our extension: a fork from S3, pulled by the client)."""
        archive = await request.body()
        served = await asyncio.to_thread(server.upload_checkpoint, model_id, step, archive)
        logger.info("model %s took an uploaded checkpoint at step %d", model_id, step)
        return {"model_id": model_id, "step": served}

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
        start = 0 if after is None else parse_step(after)
        if start is None:
            raise ApiError(400, f"after: {after!r} is not an event id of this job", param="after")
        events, more = await asyncio.to_thread(job.events_after, start, limit, wait)
        return {**_page(events, has_more=more), "status": job.status}

    @app.post("/v1/preview/models/{model_id}/sft-data")
    async def create_sft_data(model_id: str, request: Request) -> dict[str, Any]:
        store = server.store(model_id)
        part = await request.body()

        def create() -> dict[str, object]:
            with server.writing(model_id, store, uploads=True):
                return server.uploads.create(model_id, part, current())

        return await asyncio.to_thread(create)

    @app.post("/v1/preview/models/{model_id}/sft-data/{upload_id}")
    async def append_sft_data(model_id: str, upload_id: str, request: Request) -> dict[str, Any]:
        store = server.store(model_id)
        part = await request.body()

        def append() -> dict[str, object]:
            with server.writing(model_id, store, uploads=True):
                return server.uploads.append(model_id, upload_id, part, current())

        return await asyncio.to_thread(append)

    @app.post("/v1/preview/sft-training-jobs")
    async def create_sft_training_job(body: SFTTrainingJobCreate) -> dict[str, Any]:
        job = await asyncio.to_thread(server.start_sft_job, body)
        return _describe_job(job)

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
            if k not in ("step", "recorded_at", "training_step") and _is_float(v)
        }
        metrics.setdefault(row["step"], {}).update(values)
    return metrics


def _is_float(value: object) -> bool:
    """A number a float holds: a history written before its metrics were checked may have
    an integer beyond a float's range, which is left out rather than failing the page."""
    return isinstance(value, int | float) and abs(value) <= sys.float_info.max


def _check_scope(body: KeyCreate) -> None:
    if not body.projects and not body.models:
        raise ApiError(400, "projects: name at least one project or model", param="projects")
    for index, project in enumerate(body.projects):
        if not re.fullmatch(NAME_PATTERN, project):
            raise ApiError(
                400,
                f"projects[{index}]: {project!r} is not a project name",
                param=f"projects[{index}]",
            )
    for index, model in enumerate(body.models):
        project, _, name = model.partition("/")
        if not valid_names(project, name):
            raise ApiError(
                400, f"models[{index}]: {model!r} is not 'project/name'", param=f"models[{index}]"
            )


__all__ = ["build_server_app"]
