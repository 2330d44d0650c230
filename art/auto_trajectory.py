"""ART 0.5.18's `art.auto_trajectory` import path."""

import logging
from typing import Any

from ._refusals import refused_name
from .integrations.capture import auto_trajectory, capture_auto_trajectory

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["auto_trajectory", "capture_auto_trajectory", "logger"]
