"""Checks of plain arguments (counts, sizes) that raise `ConfigError` naming the argument."""

from __future__ import annotations

from .errors import ConfigError


def check_at_least(**bounds: tuple[object, int]) -> None:
    """Raise `ConfigError` for the first argument that is not an integer of at least its
    bound, given as `name=(value, least)`, in order."""
    for name, (value, least) in bounds.items():
        if not isinstance(value, int) or value < least:
            raise ConfigError(name, f"got {value!r}", f"Pass an integer of at least {least}")


__all__ = ["check_at_least"]
