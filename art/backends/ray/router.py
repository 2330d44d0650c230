"""`ReplicaRouter`: the `Engine` the OpenAI front calls, spread over replica actors.

Routing, per request:
1. a prompt that extends a conversation a live replica served goes back to it (sticky,
   see `sticky.py`), so a multi-turn rollout reuses that replica's prefix cache;
2. otherwise the live replica with the fewest sequences in flight from this router
   (least-loaded), ties broken in turn.
Model names (`name`, `name@step`) are resolved by the model service before the router is
called, exactly as with one engine; the router only sees the adapter's name.

Publication: `load_adapter` returns once every live replica has loaded the checkpoint,
so the service routes nothing to it before that (the rule of dedicated mode). Published
adapters are remembered, and a restarted replica loads all of them before it is routed to.

Failure: a replica that dies (its actor is gone) is reported in `failures` and logged,
taken out of routing, and restarted on its placement group bundle; the request it was
serving is sent to another replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...runtime.engines.base import EngineUnavailable, OnToken, Sample, SamplingParams
from ...runtime.engines.structured import Grammars
from .sticky import StickyTable

logger = logging.getLogger(__name__)

StartReplica = Callable[[int], Any]  # replica index -> a ready Ray actor handle


class ReplicaRouter:
    """Routes requests over `count` replicas started (and restarted) by `start_replica`."""

    serves_training_weights = False
    serves_while_training = True  # training runs in its own workers

    def __init__(self, start_replica: StartReplica, count: int, grammars: Grammars) -> None:
        self.grammars = grammars
        self._start_replica = start_replica
        self._replicas: list[Any | None] = [start_replica(index) for index in range(count)]
        self._in_flight = [0] * count
        self._turns = itertools.count()
        self._sticky = StickyTable()
        self._sticky_lock = threading.Lock()
        self._adapters: OrderedDict[str, str] = OrderedDict()  # published name -> directory
        self._publish_lock = threading.Lock()  # publication and a restart's catch-up
        self._state_lock = threading.Lock()
        self._closed = False
        self.failures: list[str] = []  # one line per replica that died, in order
        self.restarts = 0

    # --- the Engine protocol ----------------------------------------------------------

    @property
    def active_rows(self) -> int:
        return sum(self._in_flight)

    @property
    def samples_merged(self) -> bool:
        """Whether the live replicas sample from merged copies (each decides on its own
        node, from one config): asks each of them, as `status()` does."""
        answers = self.status()
        return bool(answers) and all(s is not None and s["merged"] for s in answers)

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        n: int = 1,
        adapter: str | None = None,
        on_token: OnToken | None = None,
    ) -> list[Sample]:
        """Sample on one replica; a replica that dies meanwhile is replaced by another.

        Tokens reach `on_token` when the replica answers, not one by one: a stream from
        a replica arrives as one burst.
        """
        from ray.exceptions import RayActorError

        grammar = None if params.grammar is None else (params.grammar.key, params.grammar.source)
        params = replace(params, grammar=None)
        tried: set[int] = set()
        while True:
            index, replica = self._choose(prompt_ids, tried)
            self._in_flight[index] += n
            reference = replica.generate.remote(prompt_ids, params, n, adapter, grammar)
            try:
                samples: list[Sample] = await reference
            except asyncio.CancelledError:
                import ray

                ray.cancel(reference)  # the replica stops decoding its rows
                raise
            except RayActorError as error:
                self._died(index, replica, error)
                tried.add(index)
                continue
            finally:
                self._in_flight[index] -= n
            break
        with self._sticky_lock:
            for sample in samples:
                self._sticky.record(prompt_ids, sample.token_ids, index)
        if on_token is not None:
            for row, sample in enumerate(samples):
                for token in sample.token_ids:
                    on_token(row, token)
        return samples

    def training(self) -> contextlib.AbstractContextManager[None]:
        """Training runs in its own workers: inference goes on."""
        return contextlib.nullcontext()

    def memory_bytes(self) -> int:
        """0: the replicas hold their weights in their own processes."""
        return 0

    @property
    def kv_cache_bytes(self) -> int:
        """0: the replicas hold their caches in their own processes."""
        return 0

    @property
    def prefix_cache_bytes(self) -> int:
        return 0

    def load_adapter(self, name: str, directory: Path) -> None:
        """Load the checkpoint on every live replica; return once all of them serve it."""
        with self._publish_lock:
            self._adapters[name] = str(directory)
            self._on_every_replica("load_adapter", name, str(directory))

    def unload_adapter(self, name: str) -> None:
        with self._publish_lock:
            self._adapters.pop(name, None)
            self._on_every_replica("unload_adapter", name)

    def close(self) -> None:
        import ray

        self._closed = True
        for replica in self._replicas:
            if replica is not None:
                ray.kill(replica)

    # --- what an operator (or a test) asks ----------------------------------------------

    def replicas(self) -> list[Any | None]:
        """The replica actor handles, None where one is being restarted."""
        return list(self._replicas)

    def status(self) -> list[dict[str, Any] | None]:
        """Each live replica's `Replica.status()`; None for one that is restarting or dead."""
        import ray
        from ray.exceptions import RayActorError

        answers: list[dict[str, Any] | None] = []
        for replica in self._replicas:
            try:
                answers.append(None if replica is None else ray.get(replica.status.remote()))
            except RayActorError:
                answers.append(None)
        return answers

    # --- inside ----------------------------------------------------------------------

    def _choose(self, prompt_ids: list[int], tried: set[int]) -> tuple[int, Any]:
        live = [
            (index, replica)
            for index, replica in enumerate(self._replicas)
            if replica is not None and index not in tried
        ]
        if not live:
            restarting = [i for i, replica in enumerate(self._replicas) if replica is None]
            raise EngineUnavailable(
                f"no inference replica can answer: replicas {restarting} are being restarted "
                f"after dying ({'; '.join(self.failures[-3:])}). Retry shortly"
            )
        with self._sticky_lock:
            owner = self._sticky.find(prompt_ids)
        for index, replica in live:
            if index == owner:
                return index, replica
        fewest = min(self._in_flight[index] for index, _ in live)
        least = [(index, replica) for index, replica in live if self._in_flight[index] == fewest]
        return least[next(self._turns) % len(least)]

    def _on_every_replica(self, method: str, *args: Any) -> None:
        import ray
        from ray.exceptions import RayActorError

        calls = [
            (index, replica, getattr(replica, method).remote(*args))
            for index, replica in enumerate(self._replicas)
            if replica is not None
        ]
        for index, replica, reference in calls:
            try:
                ray.get(reference)
            except RayActorError as error:  # its successor loads every published adapter
                self._died(index, replica, error)

    def _died(self, index: int, replica: Any, error: BaseException) -> None:
        """Take a dead replica out of routing, report it, and start its successor."""
        with self._state_lock:
            if self._replicas[index] is not replica or self._closed:
                return  # already handled
            self._replicas[index] = None
            cause = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            message = (
                f"inference replica {index} died ({cause}); it is out of routing and restarting"
            )
            self.failures.append(message)
        logger.warning(message)
        with self._sticky_lock:
            self._sticky.forget(index)
        threading.Thread(
            target=self._restart, args=(index,), name=f"art-replica-{index}-restart", daemon=True
        ).start()

    def _restart(self, index: int) -> None:
        try:
            replica = self._start_replica(index)
            with self._publish_lock:  # no publication slips between catch-up and routing
                import ray

                for name, directory in self._adapters.items():
                    ray.get(replica.load_adapter.remote(name, directory))
                with self._state_lock:
                    if self._closed:
                        ray.kill(replica)
                        return
                    self._replicas[index] = replica
                    self.restarts += 1
            logger.warning("inference replica %d restarted and back in routing", index)
        except Exception as error:  # reported: the router keeps serving on the others
            with self._state_lock:
                self.failures.append(f"inference replica {index} could not restart: {error!r}")
            logger.exception("inference replica %d could not restart", index)


__all__ = ["ReplicaRouter", "StartReplica"]
