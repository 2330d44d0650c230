"""Tinker's REST API on `art serve` (`/api/v1/...`), as the `tinker` SDK 0.38.0 speaks it.

Point `tinker.ServiceClient(base_url=<art serve's URL>)` at the server with
`TINKER_API_KEY=tml-<an art serve key>` (the SDK sends keys beginning `tml-` in
`X-API-Key`; `access.RequireKey` takes the rest as the key). Training and sampling calls
answer with a request id at once and run in the background; the SDK polls
`retrieve_future`, which waits up to `_POLL_SECONDS` before answering "try again".

Served: sessions and heartbeats; LoRA training clients (`create_model`, from a saved state
with `load_weights`); `forward`/`forward_backward` with the losses of
`runtime.trainer.token_losses` (so `forward_backward_custom` too, which the SDK runs as two
`cross_entropy` calls); `optim_step` (Adam); `save_weights`, `save_weights_for_sampler`,
`load_weights`; sampling clients on a saved checkpoint or on a loaded base model alone
(`base_model=`: a base loads with the first training client on it); `asample` with prompt logprobs
(`compute_logprobs`); the REST listing of runs, checkpoints and sessions. Everything else
is refused by name: a 400 on submit, or a failed future (`RequestFailedError`, category
"user"). Not served: JWT exchange, image and dmel chunks, sparse tensors, top-k logprobs,
prompt alternatives, server-side custom losses, the Dimuon optimizer, external weights,
publishing and TTLs, training the unembedding (`train_unembed`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ...core.data import dev
from ...core.data.errors import ArtError
from ...core.store.model_store import ModelStore
from ...runtime.endpoint.server import ApiError
from ...runtime.engines.base import SamplingParams
from ...runtime.trainer.token_losses import TokenDatum, check_datum, check_loss
from ..access import Principal, current
from ..schemas import NAME_PATTERN, ModelCreate
from ..state import ArtServer
from .runs import Pending, Run, Sampler, TinkerRuns, art_name, holds
from .wire import forward_backward_output, read_forward_backward, sample_response

logger = logging.getLogger("art.serve")

_POLL_SECONDS = 20.0  # the SDK's retrieve_future times out at 45 s
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_CHECKPOINT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
PROTOBUF = "application/x-protobuf"
# Each request's fields, as the `tinker` SDK 0.38.0 defines them (types/*_request.py);
# `type` is the SDK's tag of the request. Each is honoured or refused where it is read.
_FIELDS: dict[str, frozenset[str]] = {
    kind: frozenset(names.split()) | {"type"}
    for kind, names in {
        "create_session": "tags user_metadata sdk_version project_id display_name",
        "session_heartbeat": "session_id",
        "finish": "reason detail",
        "retrieve_future": "request_id allow_metadata_only",
        "create_model": "session_id model_seq_id base_model user_metadata lora_config "
        "optimizer_config",
        "get_info": "model_id",
        "optim_step": "adam_params optimizer_params optim_params model_id seq_id",
        "save_weights": "model_id path seq_id ttl_seconds overwrite user_metadata",
        "save_weights_for_sampler": "model_id path sampling_session_seq_id kind seq_id "
        "ttl_seconds user_metadata",
        "load_weights": "model_id seq_id session_id model_seq_id base_model user_metadata path "
        "optimizer optimizer_config weights_access_token",
        "create_sampling_session": "session_id sampling_session_seq_id base_model model_path",
        "sample": "num_samples prompt sampling_params base_model model_path "
        "sampling_session_id seq_id prompt_logprobs topk_prompt_logprobs "
        "topk_sample_logprobs target_prompt_logprobs prompt_alt_tokens_k "
        "prompt_logprobs_last_n record_stability_info",
        "weights_info": "tinker_path",
    }.items()
}


def add_tinker_routes(app: FastAPI, server: ArtServer) -> TinkerRuns:
    """Serve Tinker's API on `app` over `server`'s models; returns its state."""
    runs = TinkerRuns(server.path)
    service = server.service

    async def body(request: Request, kind: str) -> dict[str, Any]:
        """The JSON object of a `kind` request; a field it does not have is a 400."""
        try:
            parsed = await request.json()
        except ValueError as error:
            raise ApiError(400, "body: not JSON", param="body") from error
        if not isinstance(parsed, dict):
            raise ApiError(400, "body: not a JSON object", param="body")
        for name in parsed:
            if name not in _FIELDS[kind]:
                raise ApiError(400, f"{name}: not a field of a {kind} request", param=name)
        return parsed

    def field_of(
        data: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...
    ) -> Any:
        value = data.get(name, default)
        if value is ...:
            raise ApiError(400, f"{name}: required", param=name)
        if value is not default and (
            not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool)
        ):
            raise ApiError(400, f"{name}: {value!r} has the wrong type", param=name)
        return value

    def refuse_unless(condition: bool, name: str, why: str) -> None:
        if not condition:
            raise ApiError(400, f"{name}: {why} is not served by art serve", param=name)

    async def ready(run: Run, *, training: bool = False) -> Run:
        """`run`, its model loaded (a server restarted since the run was made loads it now);
        `training`: refused once the session that trains it was finished."""
        if training:
            runs.refuse_finished_run(run)
        if not service.is_loaded(run.project, run.name):
            store = ModelStore(server.path, run.project, run.name)
            await asyncio.to_thread(server.ensure_loaded, store)
        return run

    def submit(
        work: Callable[[], Awaitable[Any]],
        *,
        proto: bool = False,
        after: str | None = None,
        seq: tuple[str, Any] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Start `work` in the background; the SDK's future of it. `seq`: the client and
        its `seq_id` (None where the request has none), so a resubmitted call runs once."""
        key = None
        if seq is not None and seq[1] is not None:
            key = (seq[0], _whole(seq[1], "seq_id", minimum=0))
        request_id = runs.submit(current(), work, proto=proto, after=after, seq=key)
        return {"request_id": request_id, **extra}

    # --- client start, sessions ------------------------------------------------------------

    @app.post("/api/v1/client/config", include_in_schema=False)
    async def client_config() -> dict[str, Any]:
        # What this server does: no JWT exchange, plain HTTP, fwd/bwd chunks in order.
        return {
            "pjwt_auth_enabled": False,
            "use_pyqwest_transport": False,
            "parallel_fwdbwd_chunks": False,
            "proto_compress_fwdbwd": False,
        }

    @app.post("/api/v1/client/dynamic_config", include_in_schema=False)
    async def dynamic_config() -> dict[str, Any]:
        return {}

    @app.get("/api/v1/healthz", include_in_schema=False)
    async def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.post("/api/v1/telemetry", include_in_schema=False)
    async def telemetry() -> dict[str, Any]:
        return {"status": "accepted"}  # the SDK's usage events are not kept

    @app.post("/api/v1/create_session", include_in_schema=False)
    async def create_session(request: Request) -> dict[str, Any]:
        data = await body(request, "create_session")
        principal = current()
        project = field_of(data, "project_id", str, None) or _default_project(principal)
        if not re.fullmatch(NAME_PATTERN, project):
            raise ApiError(
                400, f"project_id: {project!r} is not a project name", param="project_id"
            )
        if not principal.admin and project not in principal.projects:
            raise ApiError(
                403,
                f"project_id: this API key may not use project {project!r}",
                param="project_id",
                code="forbidden",
            )
        tags = field_of(data, "tags", list, []) or []
        session = runs.new_session(
            principal,
            project,
            _metadata(data),
            field_of(data, "display_name", str, None),
        )
        logger.info(
            "tinker session %s started (project %s, SDK %s, tags %s)",
            session.id,
            project,
            field_of(data, "sdk_version", str, "unknown"),
            ", ".join(str(tag) for tag in tags) or "none",
        )
        return {"type": "create_session", "session_id": session.id}

    @app.post("/api/v1/session_heartbeat", include_in_schema=False)
    async def heartbeat(request: Request) -> dict[str, Any]:
        data = await body(request, "session_heartbeat")
        session = runs.session(field_of(data, "session_id", str), current())
        session.heartbeat = datetime.now(UTC).timestamp()
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish", include_in_schema=False)
    async def finish_session(session_id: str, request: Request) -> dict[str, Any]:
        session = runs.session(session_id, current())
        data = await body(request, "finish")
        reason = data.get("reason")
        kind = reason.get("type") if isinstance(reason, dict) else None
        if session.finished is None:  # the first reason stands, as the SDK documents
            session.finished = kind if isinstance(kind, str) else "finished"
            detail = field_of(data, "detail", str, None)
            logger.info(
                "tinker session %s finished: %s%s",
                session.id,
                session.finished,
                f" ({detail})" if detail else "",
            )
        return {}

    @app.get("/api/v1/sessions", include_in_schema=False)
    async def list_sessions(limit: int = 20, offset: int = 0) -> dict[str, Any]:
        principal = current()
        mine = [s.id for s in runs.sessions.values() if holds(s.key_id, principal)]
        return {"sessions": mine[offset : offset + limit]}

    @app.get("/api/v1/sessions/{session_id}", include_in_schema=False)
    async def get_session(session_id: str) -> dict[str, Any]:
        session = runs.session(session_id, current())
        return {
            "training_run_ids": session.runs,
            "sampler_ids": session.samplers,
            "user_metadata": session.user_metadata,
            "display_name": session.display_name,
        }

    # --- futures ---------------------------------------------------------------------------

    @app.post("/api/v1/retrieve_future", include_in_schema=False)
    async def retrieve_future(request: Request) -> Response:
        data = await body(request, "retrieve_future")
        request_id = field_of(data, "request_id", str)
        pending = runs.pending(request_id, current())
        done, _ = await asyncio.wait([pending.future], timeout=_POLL_SECONDS)
        if not done:
            return _json({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        return _result(pending, server.path)

    # --- training --------------------------------------------------------------------------

    @app.post("/api/v1/create_model", include_in_schema=False)
    async def create_model(request: Request) -> dict[str, Any]:
        data = await body(request, "create_model")
        principal = current()
        session = runs.open_session(field_of(data, "session_id", str), principal)
        seq = field_of(data, "model_seq_id", int)
        base_model = field_of(data, "base_model", str)
        lora = field_of(data, "lora_config", dict, {}) or {}
        optimizer = field_of(data, "optimizer_config", dict, {}) or {}
        refuse_unless(
            optimizer.get("type", "adamw") == "adamw",
            "optimizer_config.type",
            repr(optimizer.get("type")),
        )
        for key in lora:
            refuse_unless(
                key in ("rank", "seed", "train_mlp", "train_attn", "train_unembed"),
                f"lora_config.{key}",
                "this key",
            )
        targets = (
            (_ATTENTION if lora.get("train_attn", True) else ())
            + (_MLP if lora.get("train_mlp", True) else ())
            + (("lm_head",) if lora.get("train_unembed", True) else ())
        )
        refuse_unless(bool(targets), "lora_config", "an adapter on no layer")
        rank = _whole(lora.get("rank", 32), "lora_config.rank", minimum=1)
        seed = lora.get("seed")
        run_id = f"{session.id}:train:{seq}"
        run = Run(
            run_id, session.project, art_name(run_id), base_model, rank, targets, _metadata(data)
        )
        trainer_args = dev.TrainerArgs(
            **({} if seed is None else {"seed": _whole(seed, "lora_config.seed", minimum=0)})
        )
        config = dev.InternalModelConfig(
            peft_args=dev.PeftArgs(r=rank, target_modules=targets), trainer_args=trainer_args
        )
        session.model_seq = max(session.model_seq, seq + 1)

        async def create() -> dict[str, Any]:
            await asyncio.to_thread(_register, server, run, config)
            runs.add_run(run)
            session.runs.append(run_id)
            logger.info("tinker run %s created on %s (rank %d)", run_id, base_model, rank)
            return {"type": "create_model", "model_id": run_id}

        return submit(create, model_id=run_id)

    @app.post("/api/v1/get_info", include_in_schema=False)
    async def get_info(request: Request) -> dict[str, Any]:
        data = await body(request, "get_info")
        run = await ready(runs.run(field_of(data, "model_id", str), current()))
        tokenizer = await asyncio.to_thread(service.tokenizer_source, run.project, run.name)
        return {
            "type": "get_info",
            "model_id": run.id,
            "model_data": {"model_name": run.base_model, "tokenizer_id": tokenizer},
            "is_lora": True,
            "lora_rank": run.rank,
            "model_name": run.base_model,
        }

    @app.post("/api/v1/forward_backward", include_in_schema=False)
    async def forward_backward(request: Request) -> dict[str, Any]:
        parsed = read_forward_backward(await request.body())
        run = await ready(runs.run(parsed.model_id, current()), training=True)
        datums = []
        for index, item in enumerate(parsed.data):
            for key, tensor in item.inputs.items():
                if len(tensor.shape) != 1:
                    raise ApiError(
                        400,
                        f"forward_backward_input.data[{index}].loss_fn_inputs.{key}: shape "
                        f"{tensor.shape} is not one value per token",
                        param=f"forward_backward_input.data[{index}].loss_fn_inputs.{key}",
                    )
            datums.append(TokenDatum(item.tokens, {k: t.values for k, t in item.inputs.items()}))
        loss_fn = parsed.loss_fn
        config = parsed.loss_fn_config
        check_loss(loss_fn, config)  # a 400 now, rather than a failed future
        for index, datum in enumerate(datums):
            check_datum(datum, loss_fn, index)

        async def work() -> bytes:
            outputs, metrics = await asyncio.to_thread(
                service.forward_backward,
                run.project,
                run.name,
                datums,
                loss_fn,
                config,
                backward=not parsed.forward_only,
            )
            return forward_backward_output(outputs, metrics)

        return submit(
            work, proto=True, after=run.id, seq=(run.id, parsed.seq_id or None), model_id=run.id
        )

    @app.post("/api/v1/optim_step", include_in_schema=False)
    async def optim_step(request: Request) -> dict[str, Any]:
        data = await body(request, "optim_step")
        run = await ready(runs.run(field_of(data, "model_id", str), current()), training=True)
        refuse_unless(
            "optimizer_params" not in data, "optimizer_params", "an optimizer other than Adam"
        )
        given = data.get("adam_params", data.get("optim_params"))
        if not isinstance(given, dict):
            raise ApiError(400, "adam_params: required, an object", param="adam_params")
        adam = {
            "learning_rate": 1e-4,
            "beta1": 0.9,
            "beta2": 0.95,
            "eps": 1e-12,
            "weight_decay": 0.0,
            "grad_clip_norm": 0.0,
        }
        for key, value in given.items():
            if key not in adam:
                raise ApiError(
                    400, f"adam_params.{key}: not an Adam parameter", param=f"adam_params.{key}"
                )
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ApiError(
                    400,
                    f"adam_params.{key}: {value!r} is not a finite number >= 0",
                    param=f"adam_params.{key}",
                )
            adam[key] = float(value)

        async def work() -> dict[str, Any]:
            metrics = await asyncio.to_thread(service.optim_step, run.project, run.name, adam)
            return {"type": "optim_step", "metrics": metrics}

        return submit(work, after=run.id, seq=(run.id, data.get("seq_id")))

    def checkpoint_name(data: dict[str, Any]) -> str | None:
        name: str | None = field_of(data, "path", str, None)
        if name is not None and not re.fullmatch(_CHECKPOINT_NAME, name):
            raise ApiError(
                400,
                f"path: {name!r} is not a checkpoint name (letters, digits, '._-')",
                param="path",
            )
        return name

    def refuse_extras(data: dict[str, Any]) -> None:
        for key in ("ttl_seconds",):
            refuse_unless(data.get(key) is None, key, "a time to live")

    @app.post("/api/v1/save_weights", include_in_schema=False)
    async def save_weights(request: Request) -> dict[str, Any]:
        data = await body(request, "save_weights")
        run = await ready(runs.run(field_of(data, "model_id", str), current()), training=True)
        refuse_extras(data)
        name = checkpoint_name(data)
        if name is None:
            raise ApiError(400, "path: required", param="path")
        overwrite = field_of(data, "overwrite", bool, False)

        async def work() -> dict[str, Any]:
            if not overwrite and f"weights/{name}" in runs.checkpoint_names(run):
                raise ApiError(400, f"path: {name!r} exists; pass overwrite=True", param="path")
            step = await asyncio.to_thread(service.save_state, run.project, run.name)
            runs.name_checkpoint(run, "weights", name, step, _metadata(data))
            return {"type": "save_weights", "path": run.path("weights", name)}

        return submit(work, after=run.id, seq=(run.id, data.get("seq_id")))

    @app.post("/api/v1/save_weights_for_sampler", include_in_schema=False)
    async def save_weights_for_sampler(request: Request) -> dict[str, Any]:
        data = await body(request, "save_weights_for_sampler")
        principal = current()
        run = await ready(runs.run(field_of(data, "model_id", str), principal), training=True)
        refuse_extras(data)
        refuse_unless(
            field_of(data, "kind", str, "snapshot") == "snapshot", "kind", "'inflight' weights"
        )
        name = checkpoint_name(data)
        session = _session_of(runs, run, principal)

        async def work() -> dict[str, Any]:
            if name is not None and f"sampler_weights/{name}" in runs.checkpoint_names(run):
                raise ApiError(400, f"path: {name!r} exists; give another name", param="path")
            step = await asyncio.to_thread(service.save_state, run.project, run.name)
            if name is not None:
                runs.name_checkpoint(run, "sampler_weights", name, step, _metadata(data))
                return {
                    "type": "save_weights_for_sampler",
                    "path": run.path("sampler_weights", name),
                }
            sampler = _new_sampler(
                runs, session, run.base_model, run, step, None, data.get("sampling_session_seq_id")
            )
            return {
                "type": "save_weights_for_sampler",
                "path": None,
                "sampling_session_id": sampler.id,
            }

        return submit(work, after=run.id, seq=(run.id, data.get("seq_id")))

    @app.post("/api/v1/load_weights", include_in_schema=False)
    async def load_weights(request: Request) -> dict[str, Any]:
        data = await body(request, "load_weights")
        principal = current()
        refuse_unless(
            data.get("weights_access_token") is None,
            "weights_access_token",
            "loading another owner's weights",
        )
        source, step = runs.step_of(field_of(data, "path", str), principal)
        with_optimizer = field_of(data, "optimizer", bool, False)
        if "model_id" in data:  # load into an existing training client
            run = await ready(runs.run(field_of(data, "model_id", str), principal), training=True)

            async def load() -> dict[str, Any]:
                await asyncio.to_thread(_load_into, server, run, source, step, with_optimizer)
                return {"type": "load_weights", "path": data["path"], "model_id": run.id}

            return submit(load, after=run.id, seq=(run.id, data.get("seq_id")))
        # A new training client from the state (create_training_client_from_state).
        session = runs.open_session(field_of(data, "session_id", str), principal)
        seq = field_of(data, "model_seq_id", int)
        base_model = field_of(data, "base_model", str, None) or source.base_model
        if base_model != source.base_model:
            raise ApiError(
                400,
                f"base_model: the state was trained on {source.base_model!r}",
                param="base_model",
            )
        run_id = f"{session.id}:train:{seq}"
        run = Run(
            run_id,
            session.project,
            art_name(run_id),
            source.base_model,
            source.rank,
            source.targets,
            _metadata(data),
        )
        optimizer = field_of(data, "optimizer_config", dict, {}) or {}
        refuse_unless(
            optimizer.get("type", "adamw") == "adamw",
            "optimizer_config.type",
            repr(optimizer.get("type")),
        )
        session.model_seq = max(session.model_seq, seq + 1)
        config = dev.InternalModelConfig(
            peft_args=dev.PeftArgs(r=source.rank, target_modules=source.targets)
        )

        async def create() -> dict[str, Any]:
            await asyncio.to_thread(_register, server, run, config)
            runs.add_run(run)
            session.runs.append(run_id)
            await asyncio.to_thread(_load_into, server, run, source, step, with_optimizer)
            return {"type": "load_weights", "path": data["path"], "model_id": run_id}

        return submit(create, after=run_id, model_id=run_id)

    # --- sampling --------------------------------------------------------------------------

    @app.post("/api/v1/create_sampling_session", include_in_schema=False)
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        data = await body(request, "create_sampling_session")
        principal = current()
        session = runs.open_session(field_of(data, "session_id", str), principal)
        path = field_of(data, "model_path", str, None)
        base_model = field_of(data, "base_model", str, None)
        if path is None:
            if base_model is None:
                raise ApiError(400, "model_path: give it or a base_model", param="model_path")
            # A base's weights are no tenant's: any key samples a base that is loaded.
            await asyncio.to_thread(service.base_stop_token_ids, base_model)
            return {
                "type": "create_sampling_session",
                "sampling_session_id": _new_sampler(
                    runs, session, base_model, None, None, None, data.get("sampling_session_seq_id")
                ).id,
            }
        run, step = runs.step_of(path, principal, "model_path")
        if base_model not in (None, run.base_model):
            raise ApiError(
                400,
                f"base_model: {path} was trained on {run.base_model!r}, not {base_model!r}",
                param="base_model",
            )
        await ready(run)
        sampler = _new_sampler(
            runs, session, run.base_model, run, step, path, data.get("sampling_session_seq_id")
        )
        return {"type": "create_sampling_session", "sampling_session_id": sampler.id}

    @app.get("/api/v1/samplers/{sampler_id}", include_in_schema=False)
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        sampler = _sampler(runs, sampler_id, current())
        return {
            "sampler_id": sampler.id,
            "base_model": sampler.base_model,
            "model_path": sampler.model_path,
        }

    @app.post("/api/v1/asample", include_in_schema=False)
    async def asample(request: Request) -> dict[str, Any]:
        data = await body(request, "sample")
        sampler = _sampler(runs, field_of(data, "sampling_session_id", str), current())
        run = None if sampler.run is None else await ready(sampler.run)
        for key in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            refuse_unless(not data.get(key), key, "top-k logprobs and alternatives")
        for key in ("target_prompt_logprobs", "prompt_logprobs_last_n", "base_model", "model_path"):
            refuse_unless(data.get(key) is None, key, "this field")
        refuse_unless(
            not data.get("record_stability_info"), "record_stability_info", "stability records"
        )
        count = field_of(data, "num_samples", int, 1)
        if not 1 <= count <= 128:
            raise ApiError(400, f"num_samples: {count} is not within 1..128", param="num_samples")
        prompt = _prompt_tokens(field_of(data, "prompt", dict))
        want_prompt_logprobs = field_of(data, "prompt_logprobs", bool, False)
        sampling = field_of(data, "sampling_params", dict, {}) or {}
        if run is None:
            stops = await asyncio.to_thread(service.base_stop_token_ids, sampler.base_model)
            served = sampler.base_model
        else:
            stops = await asyncio.to_thread(service.stop_token_ids, run.project, run.name)
            served = f"{run.project}/{run.name}@{sampler.step}"
        params = _sampling_params(sampling, stops)

        def score(tokens: list[int]) -> list[float]:
            if run is None:
                return service.base_prompt_logprobs(sampler.base_model, tokens)
            return service.prompt_logprobs(run.project, run.name, sampler.step, tokens)

        async def work() -> bytes:
            route = await asyncio.to_thread(service.route, served)
            try:
                room = route.context_length - len(prompt)
                if room < 1:
                    raise ApiError(
                        400,
                        f"prompt: {len(prompt)} tokens fill the context ({route.context_length})",
                        param="prompt",
                    )
                max_tokens = min(params.max_tokens or room, room)
                chosen = SamplingParams(
                    max_tokens=max_tokens,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    stop=params.stop,
                    seed=params.seed,
                )
                samples = await route.engine.generate(
                    prompt, chosen, n=count, adapter=route.adapter
                )
            finally:
                route.release()
            scored = None
            if want_prompt_logprobs:
                values = await asyncio.to_thread(score, prompt)
                scored = [math.nan, *values]
            return sample_response(
                [(s.token_ids, s.logprobs, s.finish_reason == "stop") for s in samples], scored
            )

        ids = [f"{sampler.id}:{data.get('seq_id', 0)}:{index}" for index in range(count)]
        return submit(
            work, proto=True, seq=(sampler.id, data.get("seq_id")), sample_sequence_ids=ids
        )

    # --- REST: runs and checkpoints --------------------------------------------------------

    def describe_run(run: Run) -> dict[str, Any]:
        names = runs.checkpoint_names(run)
        checkpoints = [_checkpoint(run, cid, entry) for cid, entry in names.items()]
        latest = {c["checkpoint_type"]: c for c in sorted(checkpoints, key=lambda c: c["time"])}
        return {
            "training_run_id": run.id,
            "base_model": run.base_model,
            "model_owner": run.project,
            "is_lora": True,
            "lora_rank": run.rank,
            "last_request_time": max((c["time"] for c in checkpoints), default=_now()),
            "last_checkpoint": latest.get("training"),
            "last_sampler_checkpoint": latest.get("sampler"),
            "user_metadata": run.user_metadata or None,
        }

    @app.get("/api/v1/training_runs", include_in_schema=False)
    async def list_training_runs(limit: int = 20, offset: int = 0) -> dict[str, Any]:
        mine = runs.runs(current())
        page = [describe_run(run) for run in mine[offset : offset + limit]]
        return {
            "training_runs": page,
            "cursor": {"offset": offset, "limit": limit, "total_count": len(mine)},
        }

    @app.get("/api/v1/training_runs/{run_id}", include_in_schema=False)
    async def get_training_run(run_id: str) -> dict[str, Any]:
        return describe_run(runs.run(run_id, current(), "training_run_id"))

    @app.get("/api/v1/training_runs/{run_id}/checkpoints", include_in_schema=False)
    async def list_checkpoints(run_id: str) -> dict[str, Any]:
        run = runs.run(run_id, current(), "training_run_id")
        names = runs.checkpoint_names(run)
        return {
            "checkpoints": [_checkpoint(run, cid, e) for cid, e in names.items()],
            "cursor": None,
        }

    @app.get("/api/v1/checkpoints", include_in_schema=False)
    async def list_user_checkpoints(limit: int = 100, offset: int = 0) -> dict[str, Any]:
        every = [
            _checkpoint(run, cid, entry)
            for run in runs.runs(current())
            for cid, entry in runs.checkpoint_names(run).items()
        ]
        return {
            "checkpoints": every[offset : offset + limit],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(every)},
        }

    @app.delete(
        "/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id:path}", include_in_schema=False
    )
    async def delete_checkpoint(run_id: str, checkpoint_id: str) -> Response:
        run = runs.run(run_id, current(), "training_run_id")
        if checkpoint_id not in runs.checkpoint_names(run):
            raise ApiError(
                404, f"checkpoint_id: run {run_id} has no {checkpoint_id!r}", param="checkpoint_id"
            )
        runs.forget_checkpoint(run, checkpoint_id)  # the files stay: a step may hold several names
        return Response(status_code=204)

    @app.post("/api/v1/weights_info", include_in_schema=False)
    async def weights_info(request: Request) -> dict[str, Any]:
        data = await body(request, "weights_info")
        run, _ = runs.step_of(field_of(data, "tinker_path", str), current(), "tinker_path")
        return {
            "base_model": run.base_model,
            "is_lora": True,
            "lora_rank": run.rank,
            "train_unembed": False,
        }

    @app.get("/api/v1/get_server_capabilities", include_in_schema=False)
    async def capabilities() -> dict[str, Any]:
        names = service.base_names()
        return {
            "supported_models": [
                {"model_name": n, "trainable": True, "sampleable": True} for n in names
            ]
        }

    return runs


def _whole(value: Any, name: str, *, minimum: int) -> int:
    """`value` as an integer of at least `minimum`; a 400 naming `name` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ApiError(400, f"{name}: {value!r} is not an integer >= {minimum}", param=name)
    return value


def _metadata(data: dict[str, Any]) -> dict[str, str]:
    """The request's `user_metadata`: string keys and values, kept with what it made."""
    given = data.get("user_metadata") or {}
    if not isinstance(given, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in given.items()
    ):
        raise ApiError(400, "user_metadata: give an object of strings", param="user_metadata")
    return dict(given)


def _default_project(principal: Principal) -> str:
    if principal.admin:
        return "tinker"
    if len(principal.projects) == 1:
        return next(iter(principal.projects))
    raise ApiError(
        400,
        "project_id: this key is scoped to several projects or none; set TINKER_PROJECT_ID "
        "(or project_id=) to one of its projects",
        param="project_id",
    )


def _register(server: ArtServer, run: Run, config: dev.InternalModelConfig) -> None:
    server.register(
        ModelCreate(
            project=run.project,
            name=run.name,
            base_model=run.base_model,
            internal_config=config,
            config={"tinker_run_id": run.id},
        )
    )


def _load_into(server: ArtServer, run: Run, source: Run, step: int, with_optimizer: bool) -> None:
    """Set `run`'s adapter (and optimizer) to checkpoint `step` of `source` (itself or
    another run of the same base and rank)."""
    if source.base_model != run.base_model:
        raise ApiError(400, f"path: that state was trained on {source.base_model!r}", param="path")
    if (source.rank, source.targets) != (run.rank, run.targets):
        raise ApiError(
            400,
            f"path: that state's LoRA (rank {source.rank} on {', '.join(source.targets)}) is not this run's (rank {run.rank} on {', '.join(run.targets)})",
            param="path",
        )
    directory = ModelStore(server.path, source.project, source.name).checkpoint_dir(step)
    server.service.load_state(run.project, run.name, directory, with_optimizer=with_optimizer)


def _session_of(runs: TinkerRuns, run: Run, principal: Principal) -> Any:
    for session in runs.sessions.values():
        if run.id in session.runs:
            return session
    session_id = run.id.partition(":")[0]
    raise ApiError(
        404, f"model_id: the session {session_id} of run {run.id} has ended", param="model_id"
    )


def _new_sampler(
    runs: TinkerRuns,
    session: Any,
    base_model: str,
    run: Run | None,
    step: int | None,
    path: str | None,
    seq: Any,
) -> Sampler:
    """A sampler of `run`'s checkpoint `step` (of `base_model` alone where `run` is None),
    named by the client's `sampling_session_seq_id` (`seq`), or by the session's own count
    where it sent none."""
    number = (
        session.sampler_seq if seq is None else _whole(seq, "sampling_session_seq_id", minimum=0)
    )
    session.sampler_seq = max(session.sampler_seq, number) + 1
    sampler = Sampler(f"{session.id}:sample:{number}", session.project, base_model, run, step, path)
    runs.samplers[sampler.id] = sampler
    session.samplers.append(sampler.id)
    return sampler


def _sampler(runs: TinkerRuns, sampler_id: str, principal: Principal) -> Sampler:
    sampler = runs.samplers.get(sampler_id)
    session = runs.sessions.get(sampler_id.partition(":")[0])
    if sampler is None or session is None or (not holds(session.key_id, principal)):
        raise ApiError(
            404, f"sampling_session_id: no sampler {sampler_id!r}", param="sampling_session_id"
        )
    return sampler


def _prompt_tokens(prompt: dict[str, Any]) -> list[int]:
    chunks = prompt.get("chunks")
    if not isinstance(chunks, list) or not chunks:
        raise ApiError(400, "prompt.chunks: give at least one chunk", param="prompt.chunks")
    tokens: list[int] = []
    for index, chunk in enumerate(chunks):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise ApiError(
                400,
                f"prompt.chunks[{index}]: only encoded_text chunks are served",
                param=f"prompt.chunks[{index}]",
            )
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids
        ):
            raise ApiError(
                400,
                f"prompt.chunks[{index}].tokens: not a list of token ids",
                param=f"prompt.chunks[{index}].tokens",
            )
        tokens += ids
    if not tokens:
        raise ApiError(400, "prompt: has no tokens", param="prompt")
    return tokens


def _sampling_params(given: dict[str, Any], stop_ids: set[int]) -> SamplingParams:
    known = {"max_tokens", "seed", "stop", "temperature", "top_k", "top_p"}
    for key in given:
        if key not in known:
            raise ApiError(
                400,
                f"sampling_params.{key}: not a sampling parameter",
                param=f"sampling_params.{key}",
            )
    if given.get("top_k", -1) not in (-1, None):
        raise ApiError(
            400,
            "sampling_params.top_k: top-k sampling is not served (leave it -1)",
            param="sampling_params.top_k",
        )
    stop = given.get("stop")
    strings: tuple[str, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif isinstance(stop, list) and stop and all(isinstance(s, str) for s in stop):
        strings = tuple(stop)
    elif isinstance(stop, list) and stop and all(isinstance(s, int) for s in stop):
        others = set(stop) - stop_ids
        if others:
            raise ApiError(
                400,
                f"sampling_params.stop: token ids {sorted(others)} are not the model's end "
                f"tokens {sorted(stop_ids)}; give stop strings instead",
                param="sampling_params.stop",
            )
    elif stop == []:
        raise ApiError(
            400,
            "sampling_params.stop: [] (never stopping at the end token) is not served",
            param="sampling_params.stop",
        )
    elif stop is not None:
        raise ApiError(
            400,
            f"sampling_params.stop: {stop!r} is not a string or a list",
            param="sampling_params.stop",
        )
    max_tokens = given.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ApiError(
            400,
            f"sampling_params.max_tokens: {max_tokens!r} is not a positive integer",
            param="sampling_params.max_tokens",
        )
    temperature = float(given.get("temperature", 1.0))
    top_p = float(given.get("top_p", 1.0))
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ApiError(
            400,
            "sampling_params.temperature: give a number >= 0",
            param="sampling_params.temperature",
        )
    if not 0 < top_p <= 1:
        raise ApiError(
            400, "sampling_params.top_p: give a number in (0, 1]", param="sampling_params.top_p"
        )
    seed = given.get("seed")
    return SamplingParams(
        max_tokens=max_tokens or 0, temperature=temperature, top_p=top_p, stop=strings, seed=seed
    )


def _checkpoint(run: Run, checkpoint_id: str, entry: dict[str, Any]) -> dict[str, Any]:
    kind, _, name = checkpoint_id.partition("/")
    return {
        "checkpoint_id": checkpoint_id,
        "checkpoint_type": "training" if kind == "weights" else "sampler",
        "time": entry["time"],
        "tinker_path": run.path(kind, name),
        "user_metadata": entry.get("user_metadata") or None,
    }


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _json(data: dict[str, Any]) -> Response:
    return JSONResponse(data)


def _result(pending: Pending, root: str) -> Response:
    """The finished call's answer; a failure as Tinker's RequestFailedResponse, its
    message without the server's own paths (a tenant learns nothing of its files)."""
    error = pending.future.exception()
    if error is None:
        result = pending.future.result()
        if pending.proto:
            return Response(result, media_type=PROTOBUF)
        return _json(result)
    if isinstance(error, ApiError):
        message, category = error.message, "user" if error.status < 500 else "server"
    elif isinstance(error, ArtError):  # bad input, or a step the trainer refused
        message, category = str(error), "user"
    else:
        logger.error("tinker request failed", exc_info=error)
        message, category = f"{type(error).__name__}: {error}", "server"
    message = message.replace(str(Path(root).resolve()), "<art serve>").replace(root, "<art serve>")
    return _json({"error": message, "category": category})


__all__ = ["add_tinker_routes"]
