"""`LocalBackend`: the model service (`art.runtime`) on this machine, in-process or in a
child process that dies with its parent."""

from .backend import LocalBackend

__all__ = ["LocalBackend"]
