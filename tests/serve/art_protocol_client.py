"""A backend as an outside integration writes one for ART's protocol: its own httpx
client, ART's private method names, the model's JSON in each request (as ART 0.4's
`art.Backend` and SkyPilot's did). Nothing of `art`'s is imported to build it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import httpx


class ThirdPartyBackend:
    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600)

    async def _post(self, path: str, body: Any) -> Any:
        response = await self._client.post(path, json=body)
        response.raise_for_status()
        return response.json()

    async def close(self) -> None:
        await self._client.aclose()

    async def register(self, model: Any) -> None:
        await self._post("/register", model.model_dump())

    async def _get_step(self, model: Any) -> int:
        return int(await self._post("/_get_step", model.model_dump()))

    async def _prepare_backend_for_training(
        self, model: Any, config: dict[str, Any] | None
    ) -> tuple[str, str]:
        body = {"model": model.model_dump(), "config": config}
        base_url, api_key = await self._post("/_prepare_backend_for_training", body)
        return base_url, api_key

    async def _train_model(
        self,
        model: Any,
        trajectory_groups: Iterable[Any],
        config: Any,
        dev_config: dict[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        body = {
            "model": model.model_dump(),
            "trajectory_groups": [group.model_dump() for group in trajectory_groups],
            "config": config.model_dump(),
            "dev_config": dev_config,
            "verbose": verbose,
        }
        async with self._client.stream("POST", "/_train_model", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)

    async def _delete_checkpoint_files(self, model: Any, steps_to_keep: list[int]) -> None:
        body = {"model": model.model_dump(), "steps_to_keep": steps_to_keep}
        await self._post("/_delete_checkpoint_files", body)

    async def _experimental_push_to_s3(
        self,
        model: Any,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
    ) -> None:
        body = {"model": model.model_dump(), "s3_bucket": s3_bucket, "prefix": prefix}
        await self._post(
            "/_experimental_push_to_s3", {**body, "verbose": verbose, "delete": delete}
        )

    async def _experimental_pull_from_s3(
        self,
        model: Any,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
    ) -> None:
        body = {"model": model.model_dump(), "s3_bucket": s3_bucket, "prefix": prefix}
        await self._post(
            "/_experimental_pull_from_s3", {**body, "verbose": verbose, "delete": delete}
        )
