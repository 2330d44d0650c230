"""Model names on `art serve`'s OpenAI route, checked against the request's key.

A checkpoint is served as the W&B Training API names it,
`wandb-artifact:///{entity}/{project}/{name}` (the latest) or `...:step{N}`, which
names the project, so it is never ambiguous. `name` and `name@N` (LocalBackend's
names) are accepted too while one model the key may use has that name. Base models
are served under their own names to any key. A model the key may not use is unknown to
it (404), as one that does not exist.
"""

from __future__ import annotations

import threading
from typing import Any

from ..core.data.arguments import parse_step
from ..core.data.wandb_names import inference_name, parse_inference_name
from ..core.store.model_store import ModelStore
from ..runtime.endpoint.server import ApiError, Route
from ..runtime.service.model_service import ModelService, served_name
from .access import current


class LoadedModels:
    """The registered models this server has loaded, by (project, name): their records."""

    def __init__(self) -> None:
        self._records: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def add(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._records[(record["project"], record["name"])] = record

    def remove(self, project: str, name: str) -> None:
        with self._lock:
            self._records.pop((project, name), None)

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._records.values())


class ScopedRouter:
    """The OpenAI endpoint's `Router`: resolves names, refuses models the key may not use."""

    def __init__(self, service: ModelService, loaded: LoadedModels, path: str) -> None:
        self.service = service
        self.loaded = loaded
        self.path = path

    def route(self, model: str) -> Route:
        if model in self._base_names():
            return self.service.route(model)
        record, step = self._resolve(model)
        return self.service.route(_service_name(record["project"], record["name"], step))

    def longest_context(self) -> int:
        return self.service.longest_context()

    def model_names(self) -> list[str]:
        principal = current()
        names = self._base_names()
        for record in self.loaded.records():
            if not principal.allows(record["project"], record["name"]):
                continue
            entity, project, name = record["entity"], record["project"], record["name"]
            names.append(inference_name(entity, project, name))
            steps = ModelStore(self.path, project, name).checkpoint_steps()
            names.extend(inference_name(entity, project, name, step) for step in steps)
        return names

    def _resolve(self, model: str) -> tuple[dict[str, Any], int | None]:
        parsed = parse_inference_name(model)
        principal = current()
        # A model the key may not use is as unknown to it as one that does not exist: a
        # 403 would tell one tenant the names of another's models.
        records = [r for r in self.loaded.records() if principal.allows(r["project"], r["name"])]
        if parsed is not None:
            entity, project, name, step = parsed
            found = [
                r
                for r in records
                if (r["entity"], r["project"], r["name"]) == (entity, project, name)
            ]
        else:
            name, _, step_text = model.partition("@")
            step = parse_step(step_text)
            if step_text and step is None:
                raise KeyError(f"model {model!r}: {step_text!r} is not a step number")
            found = [r for r in records if r["name"] == name]
            if len(found) > 1:
                full = ", ".join(inference_name(r["entity"], r["project"], name) for r in found)
                raise ApiError(
                    400,
                    f"model: {model!r} names {len(found)} models; use one of {full}",
                    param="model",
                    code="model_ambiguous",
                )
        if not found:
            raise KeyError(
                f"unknown model {model!r}; register it first, or use one of "
                f"{', '.join(self.model_names())}"
            )
        return found[0], step

    def _base_names(self) -> list[str]:
        # Only base models, each meaning its base for every key: a trainable model is never
        # served under a base's name (the service refuses it at registration).
        return self.service.base_names()


def _service_name(project: str, name: str, step: int | None) -> str:
    """The model service's own name for a checkpoint: unambiguous across projects."""
    served = served_name(project, name)
    return served if step is None else f"{served}@{step}"


__all__ = ["LoadedModels", "ScopedRouter"]
