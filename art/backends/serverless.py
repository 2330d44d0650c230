"""`ServerlessBackend`: the HTTP client of an `art serve` server or the managed service.

Both speak the same training API (models, trajectory logs, training jobs with an
event feed, checkpoints) next to an OpenAI-compatible `/v1` endpoint, so a training
script moves between `LocalBackend`, `art serve` and the managed service by changing
the backend line only.

Only idempotent requests are retried (reads, deletes, and model creation, which
returns the existing model): a log or a training job is never sent twice.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx

from ..core import dev
from ..core.backend import InferenceEndpoint
from ..core.errors import (
    ArtValueError,
    BackendError,
    ConfigError,
    ModelNotRegisteredError,
    TrainingError,
    TrajectoryValidationError,
)
from ..core.model import Model, TrainableModel
from ..core.trajectories import TrajectoryGroup
from ..core.types import TrainConfig

DEFAULT_BASE_URL = "https://api.training.wandb.ai/v1"
_POLL_SECONDS = 20.0  # how long one events request waits on the server for news
_RETRY_STATUSES = (502, 503, 504)
_VALUE_ERRORS: dict[str, type[ArtValueError]] = {
    cls.__name__: cls for cls in (ArtValueError, ConfigError, TrajectoryValidationError)
}


class ServerlessBackend:
    """Trains and serves models on a remote server: `art serve`, or the managed service.

    Args:
        api_key: the server's key; defaults to `WANDB_API_KEY`.
        base_url: the server's API root, such as `http://gpu-box:8000/v1` for `art serve`;
            defaults to the managed service. A URL without `/v1` gets it added.
        max_retries: how often an idempotent request is retried (with exponential
            backoff) after a dropped connection or a 502/503/504.
        timeout: seconds to wait for a response (loading a base model on `register`
            takes a while).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 4,
        timeout: float = 600.0,
    ) -> None:
        key = api_key or os.environ.get("WANDB_API_KEY")
        if not key:
            raise ConfigError(
                "api_key",
                "no API key was given and WANDB_API_KEY is not set",
                "Pass ServerlessBackend(api_key=...) (for `art serve`, the key it was started "
                "with) or set WANDB_API_KEY",
            )
        self.api_key = key
        self.base_url = _api_root(base_url or DEFAULT_BASE_URL)
        self.max_retries = max_retries
        self.timeout = timeout
        self._client: httpx.AsyncClient | None = None
        self._ids: dict[tuple[str, str], str] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    # --- the Backend protocol -----------------------------------------------------------

    async def register(self, model: Model) -> InferenceEndpoint | None:
        body: dict[str, Any] = {
            "project": model.project,
            "name": model.name,
            "entity": model.entity,
            "trainable": model.trainable,
            "config": model.config,
        }
        if isinstance(model, TrainableModel):
            body["base_model"] = model.base_model
            body["internal_config"] = model.internal_config.model_dump(mode="json")
        created = await self._request("POST", "/preview/models", json=body, idempotent=True)
        self._ids[(model.project, model.name)] = created["id"]
        if isinstance(model, TrainableModel):
            return InferenceEndpoint(base_url=self.base_url, api_key=self.api_key)
        return None

    async def get_step(self, model: Model) -> int:
        found = await self._request("GET", f"/preview/models/{self._id(model)}")
        return int(found["step"])

    async def log(
        self,
        model: Model,
        groups: list[TrajectoryGroup],
        *,
        split: str,
        step: int,
        metrics: dict[str, float],
    ) -> None:
        body = {
            "trajectory_groups": [group.model_dump(mode="json") for group in groups],
            "split": split,
            "step": step,
            "metrics": metrics,
        }
        await self._request(
            "POST", f"/preview/models/{self._id(model)}/log", json=body, idempotent=False
        )

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        *,
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        verbose: bool,
    ) -> dict[str, float]:
        body = {
            "model_id": self._id(model),
            "trajectory_groups": [group.model_dump(mode="json") for group in groups],
            "config": config.model_dump(mode="json"),
            "dev_config": dev_config.model_dump(mode="json"),
        }
        job = await self._request("POST", "/preview/training-jobs", json=body, idempotent=False)
        return await self._follow(job["id"], verbose)

    async def delete_checkpoints(self, model: Model, *, best_checkpoint_metric: str) -> list[int]:
        result = await self._request(
            "DELETE",
            f"/preview/models/{self._id(model)}/checkpoints",
            json={"best_checkpoint_metric": best_checkpoint_metric},
        )
        return [int(step) for step in result["deleted_steps"]]

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    async def __aenter__(self) -> ServerlessBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- training jobs ---------------------------------------------------------------------

    async def _follow(self, job_id: str, verbose: bool) -> dict[str, float]:
        """Read the job's events until it ends, resuming after the last event seen."""
        after = 0
        while True:
            try:
                page = await self._request(
                    "GET",
                    f"/preview/training-jobs/{job_id}/events",
                    params={"after": after, "wait": _POLL_SECONDS},
                    read_timeout=_POLL_SECONDS + 30,
                )
            except BackendError as error:
                raise BackendError(
                    f"lost training job {job_id} on {self.base_url}: {error}. Completed steps "
                    "are kept on the server; once it is back, register the model again and "
                    "check `await model.get_step()` before training on"
                ) from error
            for event in page["data"]:
                after = int(event["id"])
                data = event["data"]
                if verbose:
                    print(f"[{job_id}] {event['type']}: {data}")
                if event["type"] == "training_ended":
                    return {k: float(v) for k, v in data["metrics"].items()}
                if event["type"] == "training_failed":
                    raise _rebuild(data)

    # --- HTTP ----------------------------------------------------------------------------------

    def _id(self, model: Model) -> str:
        try:
            return self._ids[(model.project, model.name)]
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


def _api_root(base_url: str) -> str:
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else f"{root}/v1"


def _result(method: str, url: str, response: httpx.Response) -> Any:
    if response.is_success:
        return response.json()
    try:
        error = response.json()["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        error, message = {}, response.text[:500]
    cls = _VALUE_ERRORS.get(str(error.get("code")))
    if cls is not None and "problem" in error:
        raise cls(str(error.get("param")), str(error["problem"]), str(error.get("fix", "")))
    if response.status_code == 401:
        raise BackendError(
            f"the art server at {url} refused the API key (401); pass the key it was "
            "started with (`art serve --api-key` or its ART_API_KEY)"
        )
    raise BackendError(f"{method} {url} failed with {response.status_code}: {message}")


def _rebuild(data: dict[str, Any]) -> Exception:
    """The `art` error a failed training job reported, raised again on this side."""
    cls = _VALUE_ERRORS.get(str(data.get("error_type")))
    if cls is not None and "problem" in data:
        return cls(str(data.get("field")), str(data["problem"]), str(data.get("fix", "")))
    return TrainingError(
        f"training failed on the server: {data.get('error_type')}: {data.get('message')}",
        step=data.get("step"),
    )


__all__ = ["DEFAULT_BASE_URL", "ServerlessBackend"]
