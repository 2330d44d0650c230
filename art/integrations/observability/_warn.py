"""One warning per service and cause: a service that cannot work says so once, then is quiet."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("art.observability")

_said: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str) -> None:
    """Log `message` as a warning unless a warning under `key` was logged in this process."""
    with _lock:
        if key in _said:
            return
        _said.add(key)
    logger.warning(message)


__all__ = ["logger", "warn_once"]
