"""Where the observability services (W&B, Weave, Langfuse) see a run, if one is on.

Core code calls these hooks at four moments:

    history_row(model, step, metrics)   a row was added to the model's history.jsonl
    rollout_scope(name)                 a rollout runs inside `gather` (one trace each)
    chat_call(request_body)             a chat completion goes out through a model's client
    trace_links()                       a trajectory is created (inside a traced rollout?)

Each hook first checks, cheaply and without importing anything, whether a service is
switched on (the model's `report_metrics`, `WANDB_API_KEY`, the Langfuse keys, a `weave`
the user imported). Only then is `art.integrations.observability` imported, by name: core
never imports the integrations at import time, and a run with every service off never
imports them (nor wandb, weave or langfuse) at all.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any, Protocol

from .types import MetadataValue

# The services `Model.report_metrics` may name; ART also knows "trackio", not built here.
REPORTERS = ("wandb",)
_PLUGIN = "art.integrations.observability"


class ReportingModel(Protocol):
    """What the hooks read of a model (`art.Model` is one): which services it reports to."""

    @property
    def report_metrics(self) -> list[str] | None: ...


class RolloutTrace(Protocol):
    """One rollout's trace: told how the rollout ended."""

    def finish(self, outcome: object) -> None:
        """`outcome` is the rollout's result (a Trajectory, normally) or its exception."""
        ...


class ChatTrace(Protocol):
    """One chat completion's trace: told the response body once the client has read it."""

    def finish(self, status: int, body: bytes) -> None:
        """The response's status and its whole body (JSON, or server-sent events)."""
        ...

    def fail(self, reason: str) -> None:
        """The request failed, or its response was closed before the body ended."""
        ...


def _plugin() -> ModuleType:
    return importlib.import_module(_PLUGIN)


def _off(variable: str, disabled_when: str) -> bool:
    return os.environ.get(variable, "").strip().lower() == disabled_when


def wandb_wanted(model: ReportingModel) -> bool:
    """ART's rule: `report_metrics` names the services; None means W&B if a key is set."""
    if model.report_metrics is None:
        return bool(os.environ.get("WANDB_API_KEY"))
    return "wandb" in model.report_metrics


def langfuse_wanted() -> bool:
    """Langfuse is on when its keys are in the environment and its own switch is not off."""
    if _off("LANGFUSE_TRACING_ENABLED", "false"):
        return False
    return bool(os.environ.get("LANGFUSE_PUBLIC_KEY") or os.environ.get("LANGFUSE_SECRET_KEY"))


def weave_active() -> bool:
    """Weave can only be tracing if it was imported (by the user, or by us for them)."""
    return "weave" in sys.modules and not _off("WEAVE_DISABLED", "true")


def history_row(model: ReportingModel, step: int, metrics: Mapping[str, float]) -> None:
    """Send a history row to the model's W&B run, if it has one. Never raises for W&B."""
    if metrics and wandb_wanted(model):
        _plugin().report_history(model, step, dict(metrics))


def wandb_config_updated(model: ReportingModel) -> None:
    """Send the model's W&B config (`update_wandb_config`) to its run, if one is open;
    a run opened later starts with it. Never raises for W&B."""
    if wandb_wanted(model):
        _plugin().update_wandb_config(model)


@contextmanager
def rollout_scope(name: str = "rollout") -> Iterator[RolloutTrace | None]:
    """A trace named `name` around one rollout of a gather (Langfuse), or None when off."""
    if not langfuse_wanted():
        yield None
        return
    with _plugin().rollout_trace(name) as trace:
        yield trace


def chat_call(request: dict[str, Any]) -> ChatTrace | None:
    """A trace for one chat completion inside the current rollout's trace, if tracing."""
    if not langfuse_wanted():
        return None
    trace: ChatTrace | None = _plugin().chat_trace(request)
    return trace


def trace_links() -> dict[str, MetadataValue]:
    """Ids of the traced call this code runs in (a `@weave.op` rollout), for metadata."""
    if not weave_active():
        return {}
    links: dict[str, MetadataValue] = _plugin().weave_links()
    return links


__all__ = [
    "REPORTERS",
    "ChatTrace",
    "RolloutTrace",
    "chat_call",
    "history_row",
    "langfuse_wanted",
    "rollout_scope",
    "trace_links",
    "wandb_wanted",
    "weave_active",
]
