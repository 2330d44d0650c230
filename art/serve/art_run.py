"""`art run`: ART 0.5.x's remote backend protocol over HTTP, on our model service.

Read from ART 0.5.17's wheel (`art/cli.py`, `art/backend.py`, `art/model.py`): a client's
own `Backend` class posts the model's JSON (`model.model_dump()`) and the arguments of
each private backend method, and gets its return value back as JSON.

    GET  /healthcheck                    {"status": "ok"}
    POST /register                       the model's JSON                         -> null
    POST /_get_step                      the model's JSON                         -> int
    POST /_prepare_backend_for_training  {model, config}       -> [base_url, api_key]
    POST /_train_model                   {model, trajectory_groups, config, dev_config,
                                          verbose}            -> NDJSON metric dicts
    POST /_delete_checkpoint_files       {model, steps_to_keep}                   -> null
    POST /_experimental_push_to_s3       {model, s3_bucket, prefix, verbose, delete} -> null
    POST /_experimental_pull_from_s3     {model, s3_bucket, prefix, verbose, delete} -> null
    POST /close                          unload every model (files stay)          -> null
    POST /v1/chat/completions, GET /v1/models   the OpenAI endpoint (`base_url`)

It is a `LocalBackend` (in this process) behind HTTP, as ART's `art run` is: models are
stored under `path`, served by the same model service and trained by the same step as
`art serve` and `LocalBackend`. Logprob tokens are written `token_id:N`, as ART's vLLM
server writes them, so the sampled ids survive a client that rebuilds each Choice. With
`api_key`, every route but `/healthcheck` needs `Authorization: Bearer <key>`; ART's has
no key, so without one it belongs on 127.0.0.1 or a private network.

The S3 routes (ART's `art run` has them since 0.5.x) push the server's copy of a model to
S3, or pull one into the server's path, with the server's AWS settings (`AWS_*`,
`AWS_ENDPOINT_URL`, `BACKUP_BUCKET` for `s3_bucket: null`) and `art.utils.s3`'s rules: a
push publishes each checkpoint only when complete, a pull takes only published ones. A
bucket or key that is not there answers 404 (`param` "s3_bucket"); any other S3 failure
502, with the server's message naming bucket and key.

Errors are `{"error": {"message", "type", "param", ...}}` with a 4xx status, `param` the
offending field's JSON path, as `art serve` writes them (ART's server answers `{"detail":
...}`; its clients read the status).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from ..backends.local import LocalBackend
from ..core.data import dev
from ..core.data.errors import ArtValueError, TrainingError
from ..core.data.types import TrainConfig
from ..core.model import Model, TrainableModel
from ..core.training import run_step
from ..runtime.endpoint.server import ApiError, Route, build_app
from ..runtime.service.model_service import ModelService
from .errors import add_error_handlers, json_path
from .limits import BodyLimit

# Fields of ART's model JSON that describe the client's side: where it logs (`base_path`,
# `report_metrics`, `run_id`) and the endpoint it was given. ART's server takes no notice
# of them (its LocalBackend sets `base_path` to its own path); neither does this one.
CLIENT_SIDE_FIELDS = (
    "base_path",
    "run_id",
    "report_metrics",
    "inference_api_key",
    "inference_base_url",
    "inference_model_name",
)
# `art.dev.ServerArgs` keys honoured: where the endpoint listens, and its key.
SERVER_ARGS = ("host", "port", "api_key")
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class _CurrentService:
    """The endpoint's router: the backend's model service of the moment (`/close` ends
    one; the next registration starts another)."""

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    def _service(self) -> ModelService | None:
        service = self.backend.service
        assert service is None or isinstance(service, ModelService)  # in_process=True
        return service

    def route(self, model: str) -> Route:
        if (service := self._service()) is None:
            raise KeyError(f"unknown model {model!r}; no model is registered yet")
        return service.route(model)

    def model_names(self) -> list[str]:
        return service.model_names() if (service := self._service()) is not None else []

    def longest_context(self) -> int:
        return service.longest_context() if (service := self._service()) is not None else 0


class _RequireKey:
    """ASGI middleware: the ART routes answer 401 without `Authorization: Bearer KEY`;
    the health checks are open and the OpenAI routes (/v1) check the key themselves
    (`build_app`). Plain ASGI, not `@app.middleware("http")`, whose task group per
    request and per `receive` every /v1 request would pay (see `RequireApiKey`)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in ("/healthcheck", "/health") or path.startswith("/v1"):
            await self.app(scope, receive, send)
            return
        header = Request(scope).headers.get("authorization", "")
        if not hmac.compare_digest(header.removeprefix("Bearer ").strip().encode(), self.api_key):
            error = ApiError(401, "missing or wrong API key", param="Authorization")
            await error.response()(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_run_app(
    path: str,
    api_key: str | None,
    *,
    host: str = "127.0.0.1",
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The `art run` app over a `LocalBackend` storing models under `path`.

    `host` is where extra endpoint listeners bind (a client's `server_args.port`) when
    the client's `server_args` name no host.
    """
    backend = LocalBackend(path=path, in_process=True)
    router = _CurrentService(backend)
    app = build_app(router, api_key, tokens_as_ids=True)
    app.state.backend = backend
    listeners = _Listeners(router, api_key)
    app.state.listeners = listeners
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    add_error_handlers(app)

    if api_key is not None:
        app.add_middleware(_RequireKey, api_key=api_key)

    @app.get("/healthcheck")
    async def healthcheck() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/register")
    async def register(request: Request) -> None:
        model = parse_model(await _json(request), "body")
        await backend.register(model)
        return None

    @app.post("/_get_step")
    async def get_step(request: Request) -> int:
        model = parse_model(await _json(request), "body")
        return await backend.get_step(model)

    @app.post("/_prepare_backend_for_training")
    async def prepare(request: Request) -> list[str]:
        body = _object(await _json(request), "body", ("model", "config"))
        model = _trainable(parse_model(body.get("model"), "model"), "model")
        server_args = _server_args(body.get("config"), api_key)
        await backend.register(model)
        base = str(request.base_url).rstrip("/")
        if "port" in server_args:
            base = await asyncio.to_thread(
                listeners.start,
                server_args.get("host") or host,
                int(server_args["port"]),
                request.url.hostname or "127.0.0.1",
            )
        return [f"{base}/v1", api_key or "default"]

    @app.post("/_train_model")
    async def train_model(request: Request) -> Response:
        fields = ("model", "trajectory_groups", "config", "dev_config", "verbose")
        body = _object(await _json(request), "body", fields)
        model = _trainable(parse_model(body.get("model"), "model"), "model")
        groups = _groups(body.get("trajectory_groups"))
        config = _config(TrainConfig, body.get("config"), "config")
        dev_config = _config(dev.TrainConfig, body.get("dev_config"), "dev_config")
        verbose = body.get("verbose", False)
        if not isinstance(verbose, bool):
            raise ApiError(400, "verbose: must be true or false", param="verbose")
        # Loaded if this process has not yet (a client that registered before a restart),
        # as ART's server starts a model's service on its first call.
        await backend.register(model)
        try:
            result = await run_step(
                model,
                groups,
                config=config,
                dev_config=dev_config,
                verbose=verbose,
                log=False,  # ART 0.5.17's client logs the step, not its server
                backend=backend,
            )
        except TrainingError as error:  # the server's failure, not the input's
            return ApiError(500, f"training failed: {error}", code="training_failed").response()
        return Response(json.dumps(result.metrics) + "\n", media_type="application/x-ndjson")

    @app.post("/_delete_checkpoint_files")
    async def delete_checkpoint_files(request: Request) -> None:
        body = _object(await _json(request), "body", ("model", "steps_to_keep"))
        model = parse_model(body.get("model"), "model")
        steps = body.get("steps_to_keep")
        if not (isinstance(steps, list) and all(_is_int(step) for step in steps)):
            raise ApiError(400, "steps_to_keep: must be a list of steps", param="steps_to_keep")
        await backend._delete_checkpoint_files(model, steps)
        return None

    @app.post("/_experimental_push_to_s3")
    async def push_to_s3(request: Request) -> None:
        model, options = _s3_options(await _json(request))
        with _s3_errors():
            await backend._experimental_push_to_s3(model, **options)
        return None

    @app.post("/_experimental_pull_from_s3")
    async def pull_from_s3(request: Request) -> None:
        model, options = _s3_options(await _json(request))
        with _s3_errors(), warnings.catch_warnings():
            # The deprecation is for the client's method, not for this route.
            warnings.simplefilter("ignore", DeprecationWarning)
            await backend._experimental_pull_from_s3(model, **options)
        return None

    @app.post("/close")
    async def close() -> None:
        await backend.close()
        return None

    return app


def parse_model(data: Any, where: str) -> Model:
    """ART's model JSON as our `Model` or `TrainableModel`; a bad field is a 400 naming it."""
    if not isinstance(data, dict):
        raise ApiError(400, f"{where}: must be the model's JSON object", param=where)
    prefix = "" if where == "body" else f"{where}."
    fields = {key: value for key, value in data.items() if key not in CLIENT_SIDE_FIELDS}
    trainable = fields.get("trainable", False)
    kind: type[Model] = TrainableModel if trainable is True else Model
    if kind is Model:
        fields.pop("_internal_config", None)  # ART dumps it for trainable models only
        if fields.get("trainable") is not None and trainable is not False:
            raise ApiError(
                400, f"{prefix}trainable: must be true or false", param=f"{prefix}trainable"
            )
    try:
        return kind.model_validate(fields)
    except ValidationError as error:
        first = error.errors()[0]
        inner = (first.get("ctx") or {}).get("error")
        if isinstance(inner, ArtValueError):  # a nested config named its own field
            param = prefix + inner.field
            raise ApiError(400, f"{param}: {inner.problem}. {inner.fix}", param=param) from None
        param = prefix + json_path(list(first.get("loc", ()))) if first.get("loc") else where
        raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
    except ArtValueError as error:
        param = prefix + error.field
        raise ApiError(400, f"{param}: {error.problem}. {error.fix}", param=param) from None


_S3_FIELDS = ("model", "s3_bucket", "prefix", "verbose", "delete")


def _s3_options(data: Any) -> tuple[Model, dict[str, Any]]:
    """The model and keyword arguments of an S3 route's body (ART's fields, each checked)."""
    body = _object(data, "body", _S3_FIELDS)
    model = parse_model(body.get("model"), "model")
    options: dict[str, Any] = {}
    for field in ("s3_bucket", "prefix"):
        value = body.get(field)
        if value is not None and not (isinstance(value, str) and value):
            raise ApiError(400, f"{field}: must be a non-empty string or null", param=field)
        options[field] = value
    for field in ("verbose", "delete"):
        value = body.get(field, False)
        if not isinstance(value, bool):
            raise ApiError(400, f"{field}: must be true or false", param=field)
        options[field] = value
    return model, options


@contextlib.contextmanager
def _s3_errors() -> Iterator[None]:
    """The S3 calls' failures as answers: what is missing 404, the rest 502."""
    from ..core.store.s3_client import S3Error

    try:
        yield
    except S3Error as error:
        missing = error.code in ("NoSuchBucket", "NoSuchKey")
        status, code = (404, "s3_not_found") if missing else (502, "s3_error")
        param = "s3_bucket" if error.key is None or missing else None
        raise ApiError(status, str(error), param=param, code=code) from None
    except FileNotFoundError as error:  # nothing of the model on this server to push
        raise ApiError(404, f"model: {error}", param="model") from None


def _trainable(model: Model, where: str) -> TrainableModel:
    if not isinstance(model, TrainableModel):
        raise ApiError(
            400, f"{where}.trainable: this route needs a TrainableModel", param=f"{where}.trainable"
        )
    return model


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        raise ApiError(400, "body: not valid JSON", param="body") from None


def _object(data: Any, where: str, fields: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ApiError(400, f"{where}: must be a JSON object with {', '.join(fields)}", param=where)
    for key in data:
        if key not in fields:
            raise ApiError(
                400, f"{key}: unknown field; this route takes {', '.join(fields)}", param=str(key)
            )
    if "model" in fields and "model" not in data:
        raise ApiError(400, "model: missing", param="model")
    return data


def _groups(data: Any) -> list[Any]:
    from ..core.data.trajectories import TrajectoryGroup

    if not isinstance(data, list):
        raise ApiError(400, "trajectory_groups: must be a list", param="trajectory_groups")
    groups = []
    for index, item in enumerate(data):
        try:
            groups.append(TrajectoryGroup.model_validate(item))
        except ValidationError as error:
            first = error.errors()[0]
            param = json_path(["trajectory_groups", index, *first.get("loc", ())])
            raise ApiError(400, f"{param}: {first['msg']}", param=param) from None
    return groups


def _config(kind: Any, data: Any, where: str) -> Any:
    if data is None:
        return kind()
    if not isinstance(data, dict):
        raise ApiError(400, f"{where}: must be a JSON object", param=where)
    try:
        return kind(**{key: value for key, value in data.items() if value is not None})
    except ArtValueError as error:
        param = f"{where}.{error.field}"
        raise ApiError(400, f"{param}: {error.problem}. {error.fix}", param=param) from None
    except (ValidationError, TypeError) as error:
        raise ApiError(400, f"{where}: {error}", param=where) from None


def _server_args(config: Any, api_key: str | None) -> dict[str, Any]:
    """`config` (ART's `OpenAIServerConfig`): `server_args` host, port and api_key are
    honoured; any other key is refused by name, never dropped."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ApiError(
            400, "config: must be an object (art.dev.OpenAIServerConfig)", param="config"
        )
    for key, value in config.items():
        if key != "server_args" and value not in (None, {}):
            raise ApiError(
                400,
                f"config.{key}: ART's vLLM server setting, which art run does not run; "
                "remove it (the engine is set by the model's _internal_config)",
                param=f"config.{key}",
            )
    args = config.get("server_args") or {}
    if not isinstance(args, dict):
        raise ApiError(400, "config.server_args: must be an object", param="config.server_args")
    for key, value in args.items():
        param = f"config.server_args.{key}"
        if key not in SERVER_ARGS and value is not None:
            raise ApiError(
                400,
                f"{param}: a vLLM server argument art run has no counterpart for; remove it "
                f"(it honours {', '.join(SERVER_ARGS)})",
                param=param,
            )
    if args.get("api_key") not in (None, api_key):
        param = "config.server_args.api_key"
        raise ApiError(
            400, f"{param}: the endpoint's key is art run's --api-key; leave it out", param=param
        )
    port = args.get("port")
    if port is not None and not (_is_int(port) and 0 < port < 65536):
        param = "config.server_args.port"
        raise ApiError(400, f"{param}: must be a port number (1-65535)", param=param)
    if args.get("host") is not None and not isinstance(args["host"], str):
        raise ApiError(
            400, "config.server_args.host: must be a string", param="config.server_args.host"
        )
    return {key: value for key, value in args.items() if value is not None}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Listeners:
    """Extra listeners of the OpenAI endpoint, on the ports clients ask for
    (`server_args.port`, as ART's server starts vLLM's there)."""

    def __init__(self, router: _CurrentService, api_key: str | None) -> None:
        self._router = router
        self._api_key = api_key
        self._lock = threading.Lock()
        self._servers: dict[tuple[str, int], Any] = {}

    def start(self, bind: str, port: int, reached_as: str) -> str:
        """Serve the endpoint on `bind:port` (once); return its root URL for the client."""
        import uvicorn

        with self._lock:
            if (bind, port) not in self._servers:
                app = build_app(self._router, self._api_key, tokens_as_ids=True)
                config = uvicorn.Config(
                    app, host=bind, port=port, log_level="warning", lifespan="off"
                )
                server = uvicorn.Server(config)
                thread = threading.Thread(target=server.run, name=f"art-run-{port}", daemon=True)
                thread.start()
                deadline = time.monotonic() + 30
                while not server.started:
                    if not thread.is_alive() or time.monotonic() > deadline:
                        param = "config.server_args.port"
                        raise ApiError(
                            409, f"{param}: cannot listen on {bind}:{port} (in use?)", param=param
                        )
                    time.sleep(0.02)
                self._servers[(bind, port)] = server
        shown = reached_as if bind in ("0.0.0.0", "::", "") else bind
        return f"http://{shown}:{port}"

    def close(self) -> None:
        with self._lock:
            for server in self._servers.values():
                server.should_exit = True
            self._servers.clear()


__all__ = ["build_run_app", "parse_model"]
