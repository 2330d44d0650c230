"""The stack of open capture scopes (`with art.Trajectory() as t:`), per context.

The scopes of a context form a stack held in a context variable, so each asyncio task
and each thread run in a copied context sees the scopes it was started in, and a scope
it enters is its own. `no_capture()` hides every enclosing scope; a scope entered inside
it captures again. This holds the stack only: what a scope is (a trajectory) and what
runs in one are `art.core.capture.capture_scope`'s; the data model opens and closes scopes here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

from .errors import RolloutError


class Scope(Protocol):
    """What a scope is to the stack: something finished when its scope closes."""

    def finish(self) -> object: ...


S = TypeVar("S", bound=Scope)

_scopes: ContextVar[tuple[Scope, ...]] = ContextVar("art_capture_scopes", default=())


class CaptureScopeError(RolloutError, RuntimeError):
    """A capture scope used out of order, or required where none is open.

    A RuntimeError too, as ART's.
    """


def enter(scope: S) -> S:
    """Open `scope`: calls made from here on are recorded into it."""
    _scopes.set((*_scopes.get(), scope))
    return scope


def exit(scope: Scope) -> None:
    """Close `scope`, which must be the innermost, and `finish()` it."""
    stack = _scopes.get()
    if not stack or stack[-1] is not scope:
        raise CaptureScopeError(
            "trajectory scopes must close in the order they opened (innermost first), in "
            "the task or thread that opened them: this trajectory is not the innermost "
            "open scope here. Nest `with art.Trajectory()` blocks instead of interleaving them"
        )
    _scopes.set(stack[:-1])
    scope.finish()


def innermost() -> Scope | None:
    """The innermost open scope here, if any."""
    stack = _scopes.get()
    return stack[-1] if stack else None


@contextmanager
def no_capture() -> Iterator[None]:
    """Hide every enclosing capture scope; scopes opened inside it capture as usual."""
    token = _scopes.set(())
    try:
        yield
    finally:
        _scopes.reset(token)


__all__ = ["CaptureScopeError", "Scope", "enter", "exit", "innermost", "no_capture"]
