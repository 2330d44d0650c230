"""`ServerlessBackend`: the client of the W&B Training API, served by `art serve` too.

The requests are those ART's own published client sends to the managed service
(`https://api.training.wandb.ai/v1`):

    POST   /preview/models                     {entity, project, name, base_model, return_existing}
    DELETE /preview/models/{id}
    POST   /preview/models/{id}/log            {model_id, trajectory_groups, split}
    GET    /preview/models/{id}/checkpoints    ?after&limit&order: a cursor page of {id, step, metrics}
    DELETE /preview/models/{id}/checkpoints    {steps}
    POST   /preview/training-jobs              {model_id, trajectory_groups, experimental_config}
    GET    /preview/training-jobs/{id}/events  ?after&limit: training_started {num_sequences},
                                               gradient_step {metrics}, training_ended,
                                               training_failed {error_message}

and a checkpoint is served as `wandb-artifact:///{entity}/{project}/{name}` (the latest)
or `...:step{N}`. A few fields are ours (a log's `step` and `metrics`, a model's
`internal_config`, `config` and `trainable`); `art serve` acknowledges each in its
answer, and this client refuses to go on where a server did not (the managed service
does not know them). Tested against `art serve` only, not against the managed service.

As in ART 0.5.23's client, a trainable model is created, logged, trained and served
under its durable name, `model.storage_name` (its `run_name`): `{name}` above is that,
and `model.get_inference_name()` names it; `name` itself is not an alias here.

Only idempotent requests are retried (reads, deletes, and model creation, which
returns the existing model): a log or a training job is never sent twice.
"""

from __future__ import annotations

import asyncio
import json as json_module
import os
import tempfile
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, Unpack

import httpx

from ..core.backend import InferenceEndpoint
from ..core.data import dev
from ..core.data.errors import (
    ArtValueError,
    BackendError,
    ConfigError,
    ModelNotRegisteredError,
    TrainingError,
    TrajectoryValidationError,
)
from ..core.data.sft_data import SFTDataError, trajectory_problems
from ..core.data.train_options import ServerlessTrainKeywords, serverless_train_options
from ..core.data.trajectories import Trajectory, TrajectoryGroup
from ..core.data.types import ServerlessTrainResult, TrainConfig, TrainSFTConfig
from ..core.data.wandb_names import STEP_SEPARATOR, inference_name, parse_inference_name
from ..core.model import Model, TrainableModel
from ..core.store.model_store import ModelStore
from ..core.training import run_step

DEFAULT_BASE_URL = "https://api.training.wandb.ai/v1"
_POLL_SECONDS = 20.0  # how long one events request waits on `art serve` for news
_RETRY_STATUSES = (502, 503, 504)
_PAGE_LIMIT = 100
_UPLOAD_PART_BYTES = 16 * 1024 * 1024  # under art serve's default 64 MiB body limit
_EXPERIMENTAL = "experimental_config."
_VALUE_ERRORS: dict[str, type[ArtValueError]] = {
    cls.__name__: cls for cls in (ArtValueError, ConfigError, TrajectoryValidationError)
}


class ServerlessBackend:
    """Trains and serves models on a remote server: `art serve`, or the managed service.

    `backend = ServerlessBackend(...)` and `backend = await ServerlessBackend(...)` (as
    ART's docs write it) are the same.

    Args:
        api_key: the server's key; defaults to `WANDB_API_KEY`.
        base_url: the server's API root, such as `http://gpu-box:8000/v1` for `art serve`;
            defaults to the managed service. A URL without `/v1` gets it added.
        max_retries: how often an idempotent request is retried (with exponential
            backoff) after a dropped connection or a 502/503/504.
        timeout: seconds to wait for a response (loading a base model on `register`
            takes a while).
        path: where logs are kept that the server does not store (the managed service
            keeps trajectories only): `<path>/<project>/models/<name>/`, as ART's client
            keeps them under its `base_path` (".art" by default), and where
            `delete_checkpoints` then finds the metric to rank by.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 4,
        timeout: float = 600.0,
        path: str | os.PathLike[str] = ".art",
    ) -> None:
        key = api_key or os.environ.get("WANDB_API_KEY")
        if not key:
            raise ConfigError(
                "api_key",
                "no API key was given and WANDB_API_KEY is not set",
                "Pass ServerlessBackend(api_key=...) (for `art serve`, the key it was started "
                "with or a key it issued) or set WANDB_API_KEY",
            )
        self.api_key = key
        self.base_url = _api_root(base_url or DEFAULT_BASE_URL)
        self.max_retries = max_retries
        self.timeout = timeout
        self.path = Path(path)
        self._told_local_logs = False
        self._client: httpx.AsyncClient | None = None
        self._ids: dict[tuple[str, str], str] = {}

    def __await__(self) -> Generator[Any, None, ServerlessBackend]:
        async def ready() -> ServerlessBackend:
            return self

        return ready().__await__()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    # --- the Backend protocol -----------------------------------------------------------

    async def register(self, model: Model) -> InferenceEndpoint | None:
        body: dict[str, Any] = {
            "entity": model.entity,
            "project": model.project,
            "name": model.storage_name,
            "base_model": None,
            "return_existing": True,
            "trainable": model.trainable,
            "config": model.config,
        }
        internal: dict[str, Any] | None = None
        if isinstance(model, TrainableModel):
            body["base_model"] = model.base_model
            internal = model.internal_config.model_dump(mode="json", exclude_defaults=True)
            body["internal_config"] = internal
        created = await self._request("POST", "/preview/models", json=body, idempotent=True)
        if internal and created.get("internal_config") is None:
            raise ConfigError(
                "_internal_config",
                f"the server at {self.base_url} does not apply an internal config",
                "Leave _internal_config at its defaults for this server",
            )
        self._ids[(model.project, model.storage_name)] = str(created["id"])
        model.id = str(created["id"])
        if created.get("entity"):
            model.entity = str(created["entity"])
        if not isinstance(model, TrainableModel):
            return None
        entity = model.entity or ""
        return InferenceEndpoint(
            base_url=self.base_url,
            api_key=self.api_key,
            model_name=inference_name(entity, model.project, model.storage_name),
            step_separator=STEP_SEPARATOR,
        )

    async def get_step(self, model: Model) -> int:
        page = await self._request(
            "GET",
            f"/preview/models/{self._id(model)}/checkpoints",
            params={"limit": 1, "order": "desc"},
        )
        return int(page["data"][0]["step"]) if page["data"] else 0

    async def log(
        self,
        model: Model,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        model_id = self._id(model)
        body = {
            "model_id": model_id,
            "trajectory_groups": [group.model_dump(mode="json") for group in groups],
            "split": split,
            "step": step,
            "metrics": metrics,
        }
        answer = await self._request(
            "POST", f"/preview/models/{model_id}/log", json=body, idempotent=False
        )
        if (step or metrics) and not (isinstance(answer, dict) and answer.get("step") == step):
            # The managed service answers a log with nothing and keeps trajectories only;
            # ART's client keeps the rest on its side, and so do we.
            store = ModelStore(self.path, model.project, model.storage_name)
            if groups:
                store.write_trajectories(split, step, groups)
            if metrics:
                store.append_history(step, metrics)
            if not self._told_local_logs:
                self._told_local_logs = True
                print(
                    f"art: {self.base_url} keeps trajectories only; logs and metrics are "
                    f"also kept in {store.dir} (ServerlessBackend(path=...))"
                )

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        **keywords: Unpack[ServerlessTrainKeywords],
    ) -> ServerlessTrainResult:
        """One training step on the server (ART 0.5.18's call); nothing is logged.

        Log the groups and `result.metrics` with `model.log` yourself, or use
        `model.train`. The keywords are ART's, with its defaults (what each does:
        `art.core.data.train_options`), sent as the job's `experimental_config`; `art serve`
        trains with each of them.
        """
        options = serverless_train_options(**keywords)
        try:
            result = await run_step(
                model,
                trajectory_groups,
                config=options.config,
                dev_config=options.dev_config,
                verbose=options.verbose,
                log=False,
                backend=self,
            )
        except ConfigError as error:
            # art serve names the field by its place in the request; the caller knows it
            # as this keyword.
            if not error.field.startswith(_EXPERIMENTAL):
                raise
            raise ConfigError(
                error.field.removeprefix(_EXPERIMENTAL), error.problem, error.fix
            ) from error
        step = await self.get_step(model)
        artifact = f"{model.entity}/{model.project}/{model.storage_name}:step{step}"
        return ServerlessTrainResult(
            step=step, metrics=result.metrics, artifact_name=artifact if model.entity else None
        )

    async def train_sft(
        self,
        model: TrainableModel,
        examples: Iterator[tuple[str, Trajectory]],
        *,
        config: TrainSFTConfig,
        dev_config: dev.TrainSFTConfig,
        verbose: bool,
    ) -> list[dict[str, float]]:
        """SFT through `art serve`: the examples are checked, written as chat JSONL and
        uploaded in parts (`art serve`'s extension; the managed service reads W&B artifacts
        instead, which this client does not write), then an SFT job trains on them and
        reports one `gradient_step` per batch.

        The API's SFT config has a learning rate and a batch size only: a non-default
        `_config`, or a trajectory with `additional_histories`, is refused by name.
        """
        if config.assistant_turns != "all":
            raise ConfigError(
                "config.assistant_turns",
                f"is {config.assistant_turns!r}; the Training API's SFT jobs train every "
                "assistant turn",
                "Use LocalBackend for assistant_turns='last', or leave it 'all'",
            )
        if dev_config != dev.TrainSFTConfig():
            raise ConfigError(
                "_config",
                "the Training API's SFT jobs take a learning rate and a batch size only",
                "Leave _config unset with ServerlessBackend",
            )
        model_id = self._id(model)
        with tempfile.TemporaryDirectory(prefix="art-sft-") as scratch:
            data, count = await asyncio.to_thread(_chat_jsonl, examples, Path(scratch))
            if count == 0:
                return []
            url = await self._upload(model_id, data)
        body: dict[str, Any] = {
            "model_id": model_id,
            "training_data_url": url,
            "config": {"learning_rate": config.learning_rate},
        }
        if config.batch_size != "auto":
            body["config"]["batch_size"] = config.batch_size
        job = await self._request("POST", "/preview/sft-training-jobs", json=body, idempotent=False)
        return await self._follow(str(job["id"]), verbose)

    async def _experimental_fork_checkpoint(
        self,
        model: Model,
        from_model: str,
        from_project: str | None = None,
        from_s3_bucket: str | None = None,
        not_after_step: int | None = None,
        verbose: bool = False,
        prefix: str | None = None,
    ) -> None:
        """Start `model` from another model's checkpoint on the server (ART's experimental
        call): its latest, or its latest at or before `not_after_step`, becomes `model`'s
        checkpoint of the same step. `art serve` does it (`POST .../models/{id}/fork`, our
        extension); ART's client forks W&B artifacts, which this one does not use, so
        against the managed service it fails with the server's answer.

        With `from_s3_bucket` (and `prefix`, the key prefix it was pushed under), the
        checkpoint is pulled from S3 here, with this machine's AWS settings (as ART's
        client does), and uploaded to the server (`PUT .../models/{id}/checkpoints/{step}`,
        our extension; ART uploads it as a W&B artifact)."""
        if prefix is not None and from_s3_bucket is None:
            raise ConfigError(
                "prefix",
                "is an S3 key prefix, and no from_s3_bucket was given",
                "Pass from_s3_bucket too, or leave prefix=None",
            )
        if from_s3_bucket is not None:
            step = await self._fork_from_s3(
                model, from_model, from_project or model.project, from_s3_bucket, prefix,
                not_after_step, verbose,
            )  # fmt: skip
            if verbose:
                print(
                    f"[{model.project}/{model.storage_name}] forked {from_model} from S3 at "
                    f"step {step}"
                )
            return
        model_id = self._id(model)
        answer = await self._request(
            "POST",
            f"/preview/models/{model_id}/fork",
            json={
                "from_model": from_model,
                "from_project": from_project,
                "not_after_step": not_after_step,
            },
            idempotent=False,
        )
        if verbose:
            print(
                f"[{model.project}/{model.storage_name}] forked {from_model} at step {answer['step']}"
            )

    async def _fork_from_s3(
        self,
        model: Model,
        name: str,
        project: str,
        bucket: str,
        prefix: str | None,
        not_after_step: int | None,
        verbose: bool,
    ) -> int:
        """Pull the source's checkpoint from S3 into a temporary path, check its base
        model, and upload it zipped as `model`'s checkpoint of the same step."""
        from ..core.store import s3

        step = await s3.fork_step_from_s3(name, project, bucket, prefix, not_after_step, verbose)
        with tempfile.TemporaryDirectory(prefix="art-fork-") as tmp:
            await s3.pull_model_from_s3(name, project, step, bucket, prefix, verbose, art_path=tmp)
            await s3.pull_model_record(name, project, bucket, prefix, tmp)
            source = ModelStore(tmp, project, name)
            record = source.read_model() or {}
            base_model = getattr(model, "base_model", None)
            if record.get("base_model") not in (None, base_model):
                raise ConfigError(
                    "from_model",
                    f"{project}/{name} was trained on {record['base_model']!r}, and "
                    f"{model.project}/{model.storage_name} is {base_model!r}: its adapter "
                    "would not fit",
                    "Fork from a model with the same base_model",
                )
            archive = await asyncio.to_thread(_zip_dir, source.checkpoint_dir(step))
        answer = await self._request(
            "PUT",
            f"/preview/models/{self._id(model)}/checkpoints/{step}",
            content=archive,
            idempotent=False,
        )
        return int(answer["step"])

    async def _upload(self, model_id: str, data: Path) -> str:
        """Send `data` to the server in parts of at most `_UPLOAD_PART_BYTES` (whole lines);
        returns the URL an SFT job reads it by."""
        upload: dict[str, Any] | None = None
        for part in _parts(data, _UPLOAD_PART_BYTES):
            path = f"/preview/models/{model_id}/sft-data"
            if upload is not None:
                path += f"/{upload['id']}"
            upload = await self._request("POST", path, content=part, idempotent=False)
        assert upload is not None
        return str(upload["url"])

    async def train_step(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        *,
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        verbose: bool,
    ) -> dict[str, float]:
        return await self._job(model, groups, experimental_config(config, dev_config), verbose)

    async def _job(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        experimental: dict[str, Any],
        verbose: bool,
    ) -> dict[str, float]:
        """Post a training job with the API's `experimental_config` and follow it to its end."""
        body = {
            "model_id": self._id(model),
            "trajectory_groups": [group.model_dump(mode="json") for group in groups],
            "experimental_config": experimental,
        }
        try:
            job = await self._request("POST", "/preview/training-jobs", json=body, idempotent=False)
        except BackendError as error:
            if not isinstance(error.__cause__, httpx.TransportError):
                raise  # the server answered: its error stands as it is
            # The connection broke before the answer: the server may have started the job.
            raise BackendError(
                f"lost training job (its creation was not acknowledged) on {self.base_url}: "
                f"{error}. The server may have started it, and completed steps are kept "
                "there; once it is back, register the model again and check "
                "`await model.get_step()` before training on"
            ) from error
        rows = await self._follow(str(job["id"]), verbose)
        return rows[-1] if rows else {}

    async def delete_checkpoints(self, model: Model, *, best_checkpoint_metric: str) -> list[int]:
        """Keep the latest checkpoint and the best on `best_checkpoint_metric`; delete the rest.

        The metric is the server's record of each checkpoint where it keeps one, else the
        history kept under `path`. Where neither has it yet (ART's examples call this from
        step 0, before anything is validated) a note is printed and the latest is kept."""
        model_id = self._id(model)
        listed = await self._checkpoints(model_id)
        if not listed:
            return []
        scores = {
            int(c["step"]): float(c["metrics"][best_checkpoint_metric])
            for c in listed
            if isinstance(c.get("metrics", {}).get(best_checkpoint_metric), int | float)
        }
        steps = sorted(int(c["step"]) for c in listed)
        if not scores:
            store = ModelStore(self.path, model.project, model.storage_name)
            kept = store.metric_by_step(best_checkpoint_metric)
            scores = {step: value for step, value in kept.items() if step in steps}
        if not scores:
            print(f'No "{best_checkpoint_metric}" metric found in history')
        best = max(scores, key=lambda step: (scores[step], step)) if scores else steps[-1]
        doomed = [step for step in steps if step not in (steps[-1], best)]
        if doomed:
            await self._request(
                "DELETE", f"/preview/models/{model_id}/checkpoints", json={"steps": doomed}
            )
        return doomed

    async def delete(self, model: Model) -> None:
        """Delete the model on the server: its checkpoints, logs, and what serves it (ART's API)."""
        await self._request("DELETE", f"/preview/models/{self._id(model)}")
        self._ids.pop((model.project, model.storage_name), None)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def __aenter__(self) -> ServerlessBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- pages ------------------------------------------------------------------------------

    async def _checkpoints(self, model_id: str) -> list[dict[str, Any]]:
        """Every checkpoint of the model, following the cursor pages."""
        found: list[dict[str, Any]] = []
        params: dict[str, Any] = {"limit": _PAGE_LIMIT, "order": "asc"}
        while True:
            page = await self._request(
                "GET", f"/preview/models/{model_id}/checkpoints", params=params
            )
            found.extend(page["data"])
            if not page["data"] or page.get("has_more") is False:
                return found
            params["after"] = page["data"][-1]["id"]

    async def _follow(self, job_id: str, verbose: bool) -> list[dict[str, float]]:
        """Read the job's events until it ends, resuming after the last event seen;
        returns the metrics of each `gradient_step`."""
        after: str | None = None
        metrics: list[dict[str, float]] = []
        while True:
            params: dict[str, Any] = {"limit": _PAGE_LIMIT, "wait": _POLL_SECONDS}
            if after is not None:
                params["after"] = after
            try:
                page = await self._request(
                    "GET",
                    f"/preview/training-jobs/{job_id}/events",
                    params=params,
                    read_timeout=_POLL_SECONDS + 30,
                )
            except BackendError as error:
                raise BackendError(
                    f"lost training job {job_id} on {self.base_url}: {error}. Completed steps "
                    "are kept on the server; once it is back, register the model again and "
                    "check `await model.get_step()` before training on"
                ) from error
            if not page["data"]:
                await asyncio.sleep(1.0)  # a server that does not long-poll: ask again soon
            for event in page["data"]:
                after = str(event["id"])
                data = event["data"]
                if verbose:
                    print(f"[{job_id}] {event['type']}: {data}")
                if event["type"] == "gradient_step":
                    metrics.append({k: float(v) for k, v in data.items()})
                elif event["type"] == "training_ended":
                    return metrics
                elif event["type"] == "training_failed":
                    raise _rebuild(data)

    # --- HTTP ----------------------------------------------------------------------------------

    def _id(self, model: Model) -> str:
        try:
            return self._ids[(model.project, model.storage_name)]
        except KeyError:
            raise ModelNotRegisteredError(model.name, f"use {self!r}") from None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {self.api_key}"},
                timeout=self.timeout,
            )
        return self._client

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        idempotent: bool | None = None,
        read_timeout: float | None = None,
    ) -> Any:
        retry = method in ("GET", "DELETE") if idempotent is None else idempotent
        url = f"{self.base_url}{path}"
        for attempt in range(self.max_retries + 1):
            last = attempt >= self.max_retries or not retry
            try:
                response = await self._http().request(
                    method,
                    path,
                    json=json,
                    content=content,
                    params=params,
                    timeout=self.timeout if read_timeout is None else read_timeout,
                )
            except httpx.TransportError as error:
                if last:
                    raise BackendError(
                        f"cannot reach the art server at {url} ({type(error).__name__}: "
                        f"{error or 'connection failed'}); check that it is running and "
                        "that base_url is right"
                    ) from error
            else:
                if response.status_code not in _RETRY_STATUSES or last:
                    return _result(method, url, response)
            await asyncio.sleep(0.25 * 2**attempt)
        raise AssertionError("unreachable")


def _zip_dir(directory: Path) -> bytes:
    """The files of `directory`, zipped with paths relative to it."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                zipped.write(path, path.relative_to(directory).as_posix())
    return buffer.getvalue()


def experimental_config(config: TrainConfig, dev_config: dev.TrainConfig) -> dict[str, Any]:
    """Our training configs as the API's `experimental_config` (ART's field names)."""
    body: dict[str, Any] = {
        "learning_rate": config.learning_rate,
        "beta": config.beta or None,
        "kl_penalty_coef": config.kl_penalty_coef or None,
        "kl_penalty_source": config.kl_penalty_source,
        # Ours (art serve's); the managed API keeps its own cadence, so sent only when set.
        "optimizer_save_interval": config.optimizer_save_interval
        if config.optimizer_save_interval != 1
        else None,
        "final_training_step": config.final_training_step,
        **dev_config.model_dump(mode="json"),
    }
    return {key: value for key, value in body.items() if value is not None}


def _api_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else f"{root}/v1"


def _result(method: str, url: str, response: httpx.Response) -> Any:
    if response.is_success:
        return response.json() if response.content else None
    try:
        body = response.json()
        error = body.get("error", body)
        message = str(error.get("message") or error.get("detail") or body)
    except (ValueError, AttributeError):
        error, message = {}, response.text[:500]
    if error.get("code") == "SFTDataError" and isinstance(error.get("problems"), list):
        total = error.get("problems_total")
        raise SFTDataError(
            str(error.get("param")),
            [str(p) for p in error["problems"]],
            total if isinstance(total, int) else None,
        )
    cls = _VALUE_ERRORS.get(str(error.get("code")))
    if cls is not None and "problem" in error:
        raise cls(str(error.get("param")), str(error["problem"]), str(error.get("fix", "")))
    if response.status_code in (400, 422) and error.get("param"):
        param = str(error["param"])
        raise ConfigError(param, message.removeprefix(f"{param}: "), "Fix that field and retry")
    if response.status_code == 401:
        raise BackendError(
            f"the art server at {url} refused the API key (401); pass the key it was "
            "started with (`art serve --api-key` or its ART_API_KEY) or one it issued"
        )
    raise BackendError(f"{method} {url} failed with {response.status_code}: {message}")


def _chat_jsonl(examples: Iterator[tuple[str, Trajectory]], directory: Path) -> tuple[Path, int]:
    """The examples as the API's chat JSONL (`messages`, `tools`), each checked first;
    `SFTDataError` names every bad one."""
    path = directory / "train.jsonl"
    problems: list[str] = []
    count = 0
    with path.open("w", encoding="utf-8") as file:
        for where, trajectory in examples:
            found = trajectory_problems(trajectory)
            if trajectory.additional_histories:
                found.append(
                    "additional_histories: the SFT API takes one conversation per example; "
                    "send each history as a trajectory of its own"
                )
            problems += [f"{where}: {problem}" for problem in found]
            line: dict[str, Any] = {"messages": trajectory.messages()}
            if trajectory.tools:
                line["tools"] = trajectory.tools
            file.write(json_module.dumps(line, default=str) + "\n")
            count += 1
    if problems:
        raise SFTDataError("trajectories", problems)
    return path, count


def _parts(path: Path, size: int) -> Iterator[bytes]:
    """The file in parts of about `size` bytes, each ending at a line's end."""
    part = bytearray()
    with path.open("rb") as file:
        for line in file:
            if part and len(part) + len(line) > size:
                yield bytes(part)
                part.clear()
            part += line
    if part:
        yield bytes(part)


def _rebuild(data: dict[str, Any]) -> Exception:
    """The `art` error a failed training job reported, raised again on this side."""
    cls = _VALUE_ERRORS.get(str(data.get("error_type")))
    if cls is not None and "problem" in data:
        return cls(str(data.get("field")), str(data["problem"]), str(data.get("fix", "")))
    return TrainingError(
        f"training failed on the server: {data.get('error_message', 'no reason given')}",
        step=data.get("step"),
    )


__all__ = [
    "DEFAULT_BASE_URL",
    "ServerlessBackend",
    "experimental_config",
    "inference_name",
    "parse_inference_name",
]
