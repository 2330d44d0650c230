"""ART's `art.utils.trajectory_migration`: older JSONL trajectory logs moved to Parquet.

result = migrate_model_dir("./.art/my-project/models/my-model")   # or: art migrate PATH
"""

from ..core.trajectory_migration import (
    MigrationResult,
    auto_migrate_on_register,
    deserialize_trajectory_groups,
    dict_to_history,
    dict_to_message_or_choice,
    dict_to_trajectory,
    dict_to_trajectory_group,
    history_to_dict,
    message_or_choice_to_dict,
    migrate_all_models,
    migrate_jsonl_to_parquet,
    migrate_model_dir,
    migrate_trajectories_dir,
    serialize_trajectory_groups,
    trajectory_group_to_dict,
    trajectory_to_dict,
)

__all__ = [
    "MigrationResult",
    "auto_migrate_on_register",
    "deserialize_trajectory_groups",
    "dict_to_history",
    "dict_to_message_or_choice",
    "dict_to_trajectory",
    "dict_to_trajectory_group",
    "history_to_dict",
    "message_or_choice_to_dict",
    "migrate_all_models",
    "migrate_jsonl_to_parquet",
    "migrate_model_dir",
    "migrate_trajectories_dir",
    "serialize_trajectory_groups",
    "trajectory_group_to_dict",
    "trajectory_to_dict",
]
