"""ART's `art.local` import path."""

from ..backends.local import LocalBackend

__all__ = ["LocalBackend"]
