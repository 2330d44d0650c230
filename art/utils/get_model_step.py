"""`get_model_step`: a model's current step read from a LocalBackend's directory."""

from __future__ import annotations

import os

from ..core.model import Model
from ..core.store.model_store import ModelStore


def get_step_from_dir(output_dir: str | os.PathLike[str]) -> int:
    """The highest checkpoint step in the model directory `output_dir` (0 before any
    training, or where it does not exist: unlike ART's, reading creates nothing)."""
    return ModelStore.at(output_dir).step()


def get_model_step(model: Model, art_path: str | os.PathLike[str]) -> int:
    """The highest checkpoint step of `model` under `art_path` (0 before any training)."""
    return ModelStore(art_path, model.project, model.storage_name).step()


__all__ = ["get_model_step", "get_step_from_dir"]
