"""ART's `art.local.backend` import path."""

from ..backends.local import LocalBackend

__all__ = ["LocalBackend"]
