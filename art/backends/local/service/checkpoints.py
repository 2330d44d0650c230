"""Checkpoints loaded into an engine, each leased while a request uses it.

A checkpoint (`name@step`, or the latest step of an engine that holds its own weights)
is served by loading its adapter directory into the engine under a name of its own.
At most `keep` checkpoints stay loaded; the least recently used one that no request
holds is unloaded when a new one comes in, or when a lease ends. A checkpoint a request
holds (`lease`, until `release`) is never unloaded under it, so many concurrent
requests over more checkpoints than `keep` are all answered: the cache holds more than
`keep` while they run, and shrinks back afterwards.

Each load gets a new adapter name, so a checkpoint unloaded and loaded again never
meets its old name still being unloaded. `drop` (a model deleted, its checkpoint
directories removed) unloads whatever the leases: the engine lets running rows finish
and fails waiting requests with `AdapterGone`.

Lock: `_lock` guards the tables and is held while an adapter loads (so one checkpoint
is loaded once); adapters are unloaded after it is released, since unloading waits for
the requests still sampling with them.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..engines.base import Engine


@dataclass(frozen=True)
class Lease:
    """A request's hold on a loaded checkpoint; `release()` when the request has ended."""

    adapter: str
    release: Callable[[], None]


class CheckpointCache:
    """The checkpoints loaded into one engine, keyed by (owner, step)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._loaded: OrderedDict[tuple[str, int], str] = OrderedDict()  # LRU first
        self._leases: Counter[str] = Counter()  # adapter -> requests holding it
        self._lock = threading.Lock()
        self._names = itertools.count()

    def lease(self, engine: Engine, owner: str, step: int, directory: Path) -> Lease:
        """Hold checkpoint `step` of `owner` (a model's adapter name), loading it if needed."""
        with self._lock:
            key = (owner, step)
            adapter = self._loaded.get(key)
            if adapter is None:
                adapter = f"{owner}_step{step}_{next(self._names)}"
                engine.load_adapter(adapter, directory)
                self._loaded[key] = adapter
            self._loaded.move_to_end(key)
            self._leases[adapter] += 1
            evicted = self._evict()
        self._unload(engine, evicted)
        released = threading.Event()

        def release() -> None:
            if released.is_set():  # idempotent: a stream may end two ways
                return
            released.set()
            with self._lock:
                self._leases[adapter] -= 1
                if self._leases[adapter] <= 0:
                    del self._leases[adapter]
                gone = self._evict()
            self._unload(engine, gone)

        return Lease(adapter, release)

    def load(self, engine: Engine, owner: str, step: int, directory: Path) -> None:
        """Load checkpoint `step` of `owner` (a training step's publication), unleased."""
        self.lease(engine, owner, step, directory).release()

    def drop(
        self, engine: Engine, owner: str, keep: Callable[[int], bool] = lambda _: False
    ) -> None:
        """Unload `owner`'s checkpoints whose step `keep` refuses, leased or not."""
        with self._lock:
            gone = [key for key in self._loaded if key[0] == owner and not keep(key[1])]
            adapters = [self._loaded.pop(key) for key in gone]
        self._unload(engine, adapters)

    def loaded(self) -> list[tuple[str, int]]:
        """(owner, step) of every loaded checkpoint, least recently used first."""
        with self._lock:
            return list(self._loaded)

    def leased(self) -> int:
        """Leases held now (0 once every request has ended)."""
        with self._lock:
            return sum(self._leases.values())

    def _evict(self) -> list[str]:
        """Take the least recently used unleased checkpoints out while over `keep`."""
        evicted: list[str] = []
        for key in list(self._loaded):
            if len(self._loaded) <= self.keep:
                break
            adapter = self._loaded[key]
            if not self._leases[adapter]:
                del self._loaded[key]
                evicted.append(adapter)
        return evicted

    @staticmethod
    def _unload(engine: Engine, adapters: list[str]) -> None:
        for adapter in adapters:  # each waits for the requests still sampling with it
            engine.unload_adapter(adapter)


__all__ = ["CheckpointCache", "Lease"]
