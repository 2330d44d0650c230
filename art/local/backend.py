"""ART's `art.local.backend` import path."""

import logging

from ..backends.local import LocalBackend

logger = logging.getLogger(__name__)

__all__ = ["LocalBackend", "logger"]
