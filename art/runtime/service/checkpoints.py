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

Lock: `_lock` guards the tables and is held only briefly, never while an adapter loads
or unloads: `release()` runs on the endpoint's event loop, which must not wait for a
batch. One request loads a checkpoint while the others asking for it wait on its
`_Loading` event; the adapters a release evicts are unloaded on a thread of their own
(unloading waits for the requests still sampling with them).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..engines.base import Engine

logger = logging.getLogger("art.service")


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
        self._loading: dict[tuple[str, int], threading.Event] = {}  # set once it is loaded
        self._leases: Counter[str] = Counter()  # adapter -> requests holding it
        self._lock = threading.Lock()
        self._names = itertools.count()

    def lease(self, engine: Engine, owner: str, step: int, directory: Path) -> Lease:
        """Hold checkpoint `step` of `owner` (a model's adapter name), loading it if needed."""
        key = (owner, step)
        while True:
            with self._lock:
                loaded = self._loaded.get(key)
                if loaded is not None:
                    self._loaded.move_to_end(key)
                    self._leases[loaded] += 1
                    return self._lease(engine, loaded)
                loading = self._loading.get(key)
                if loading is None:  # this request loads it
                    self._loading[key] = threading.Event()
                adapter = f"{owner}_step{step}_{next(self._names)}"
            if loading is not None:
                loading.wait()  # loaded (or failed) by another request: look again
                continue
            try:
                engine.load_adapter(adapter, directory)
            finally:  # loaded or failed, those waiting look again
                with self._lock:
                    self._loading.pop(key).set()
            with self._lock:
                self._loaded[key] = adapter
                self._leases[adapter] += 1
                evicted = self._evict()
            self._unload(engine, evicted)
            return self._lease(engine, adapter)

    def _lease(self, engine: Engine, adapter: str) -> Lease:
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
            if gone:  # the caller may be an event loop: unloading waits for batches
                threading.Thread(
                    target=self._unload_logged, args=(engine, gone), name="art-unload", daemon=True
                ).start()

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

    @classmethod
    def _unload_logged(cls, engine: Engine, adapters: list[str]) -> None:
        """`_unload` on a thread of its own, where an error has no caller to reach."""
        try:
            cls._unload(engine, adapters)
        except Exception:
            logger.exception("could not unload checkpoint adapters %s", adapters)


__all__ = ["CheckpointCache", "Lease"]
