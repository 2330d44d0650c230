"""`strip_logprobs`: a copy of any nested data with its logprobs removed, to store less."""

from __future__ import annotations

import copy
import logging
from typing import Any

logger = logging.getLogger("art")


def strip_logprobs(obj: Any) -> Any:
    """A deep copy of `obj` without `logprobs`: dict keys named so are dropped, and an
    object's `logprobs` attribute (a `Choice`'s) is set to None. Lists stay lists, tuples
    tuples. `obj` itself is never changed; where it cannot be copied (it holds a lock, a
    socket), a warning is logged and `obj` is returned as it is, as ART does."""
    try:
        copied = copy.deepcopy(obj)
    except (TypeError, copy.Error, RecursionError) as error:
        logger.warning(
            "strip_logprobs could not copy %s (%s); returned unchanged", type(obj), error
        )
        return obj
    return _strip(copied)


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {key: _strip(value) for key, value in obj.items() if key != "logprobs"}
    if isinstance(obj, list):
        return [_strip(value) for value in obj]
    if isinstance(obj, tuple):
        return tuple(_strip(value) for value in obj)
    if hasattr(obj, "__dict__"):
        # The copy is ours to change in place (a pydantic model keeps its class this way).
        for key, value in list(vars(obj).items()):
            setattr(obj, key, None if key == "logprobs" else _strip(value))
    return obj


__all__ = ["strip_logprobs"]
