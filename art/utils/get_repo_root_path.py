"""ART's `art.utils.get_repo_root_path`: the source checkout the `art` package is in."""

from ..core.store.run_paths import get_repo_root_path

__all__ = ["get_repo_root_path"]
