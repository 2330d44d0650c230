"""The names the W&B Training API serves checkpoints as, shared by its client
(`ServerlessBackend`) and its server (`art serve`): `wandb-artifact:///entity/project/name`,
a step as `...:step3`."""

from __future__ import annotations

import re

INFERENCE_PREFIX = "wandb-artifact:///"
STEP_SEPARATOR = ":step"

_INFERENCE_NAME = re.compile(
    r"^wandb-artifact:///(?P<entity>[^/]+)/(?P<project>[^/]+)/(?P<name>[^/:@]+)"
    r"(?::step(?P<step>[0-9]{1,18}))?$"
)


def inference_name(entity: str, project: str, name: str, step: int | None = None) -> str:
    """The `model` a checkpoint is served as: W&B's artifact name."""
    base = f"{INFERENCE_PREFIX}{entity}/{project}/{name}"
    return base if step is None else f"{base}{STEP_SEPARATOR}{step}"


def parse_inference_name(model: str) -> tuple[str, str, str, int | None] | None:
    """(entity, project, name, step or None) of a W&B artifact name; None for other names."""
    match = _INFERENCE_NAME.match(model)
    if match is None:
        return None
    step = match["step"]
    return match["entity"], match["project"], match["name"], None if step is None else int(step)


__all__ = ["INFERENCE_PREFIX", "STEP_SEPARATOR", "inference_name", "parse_inference_name"]
