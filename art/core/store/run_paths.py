"""Where a run's files are, as ART's `art.utils.output_dirs` names them.

The layout is `ModelStore`'s: `<art_path>/<project>/models/<name>/` holding
`checkpoints/{step:04d}/` and `trajectories/{split}/`. Paths are returned as strings
joined with "/", as ART returns them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class StoredModel(Protocol):
    """What names a model's directory; `Model` and `TrainableModel` have both."""

    @property
    def project(self) -> str: ...

    @property
    def storage_name(self) -> str: ...


# LocalBackend's default `path`: relative to the working directory, as `LocalBackend()`.
_DEFAULT_ART_PATH = "./.art"


def get_repo_root_path() -> str:
    """The nearest directory above the `art` package that holds `.git` (a source checkout
    of it), or "." where there is none (an installed package), as ART's."""
    here = Path(__file__).resolve().parent
    for directory in (here, *here.parents):
        if (directory / ".git").exists():
            return str(directory)
    return "."


def get_default_art_path() -> str:
    """Where `LocalBackend()` stores runs when given no `path`: ./.art.

    ART's is `<repo root>/.art`, which is its LocalBackend's default; ours is the working
    directory's `.art`, so this names the directory our LocalBackend really wrote.
    """
    return _DEFAULT_ART_PATH


def get_models_dir(project_name: str, art_path: str | None = None) -> str:
    return f"{get_default_art_path() if art_path is None else art_path}/{project_name}/models"


def get_model_dir(model: StoredModel, art_path: str | None = None) -> str:
    return get_output_dir_from_model_properties(model.project, model.storage_name, art_path)


def get_output_dir_from_model_properties(
    project: str, name: str, art_path: str | None = None
) -> str:
    return f"{get_default_art_path() if art_path is None else art_path}/{project}/models/{name}"


def get_step_checkpoint_dir(model_output_dir: str, step: int) -> str:
    return f"{model_output_dir}/checkpoints/{step:04d}"


def get_trajectories_dir(model_output_dir: str) -> str:
    return f"{model_output_dir}/trajectories"


def get_trajectories_split_dir(model_output_dir: str, split: str) -> str:
    return f"{model_output_dir}/trajectories/{split}"


__all__ = [
    "get_default_art_path",
    "get_model_dir",
    "get_models_dir",
    "get_output_dir_from_model_properties",
    "get_repo_root_path",
    "get_step_checkpoint_dir",
    "get_trajectories_dir",
    "get_trajectories_split_dir",
]
