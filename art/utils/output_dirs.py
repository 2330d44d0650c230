"""ART's `art.utils.output_dirs`: the paths of a model's directory, checkpoints and logs."""

from ..core.store.run_paths import (
    get_default_art_path,
    get_model_dir,
    get_models_dir,
    get_output_dir_from_model_properties,
    get_step_checkpoint_dir,
    get_trajectories_dir,
    get_trajectories_split_dir,
)

__all__ = [
    "get_default_art_path",
    "get_model_dir",
    "get_models_dir",
    "get_output_dir_from_model_properties",
    "get_step_checkpoint_dir",
    "get_trajectories_dir",
    "get_trajectories_split_dir",
]
