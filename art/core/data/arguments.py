"""Checks of plain arguments (counts, sizes) that raise `ConfigError` naming the argument."""

from __future__ import annotations

import re

from .errors import ConfigError

_STEP = re.compile(r"[0-9]{1,18}")


def check_at_least(**bounds: tuple[object, int]) -> None:
    """Raise `ConfigError` for the first argument that is not an integer of at least its
    bound, given as `name=(value, least)`, in order."""
    for name, (value, least) in bounds.items():
        if not isinstance(value, int) or value < least:
            raise ConfigError(name, f"got {value!r}", f"Pass an integer of at least {least}")


def parse_step(text: str) -> int | None:
    """A step number as a name or cursor writes it (`model@3`, `id@3`): ASCII digits, at
    most 18 of them; None for anything else (`²` is a digit to `str.isdigit`, not to `int`)."""
    return int(text) if _STEP.fullmatch(text) else None


__all__ = ["check_at_least", "parse_step"]
