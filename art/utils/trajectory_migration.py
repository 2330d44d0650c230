"""ART's `art.utils.trajectory_migration`: older JSONL trajectory logs moved to Parquet.

result = migrate_model_dir("./.art/my-project/models/my-model")   # or: art migrate PATH
"""

# The implementation's names, as they are: its __all__ is this path's.
from ..core.store.trajectory_migration import *  # noqa: F403
from ..core.store.trajectory_migration import __all__ as __all__
