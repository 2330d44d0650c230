"""One thread for a process's torch work on the CPU: loading, decoding and training, in turn.

torch's CPU kernels run on OpenMP (libgomp). Each thread that runs a parallel region
becomes the master of a team of worker threads of its own, which lives as long as that
thread does. Once a process holds more team threads than it has cores, libgomp cuts its
workers' spin-wait between regions to ~100 spins (it assumes oversubscription), so each
of a decode step's ~1,000 small parallel regions waits for a futex wake-up. A model
service that loaded on one thread and decoded on another ran at 22 tokens/s for one
request on 2 cores, against 40 once every torch call ran on a single thread
(`benchmarks/RESULTS.md`). Hence one `TorchThread` per process, `shared()`: the model
service submits its loads and training steps to it, and the transformers engine's decode
loop runs on it as jobs between them.

Rule for callers: never wait on this thread while holding a lock that one of its jobs
takes (an engine's `paused()` from another thread, say): that job could never finish.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TorchThread:
    """Runs submitted jobs one at a time, in order, on one daemon thread."""

    def __init__(self, name: str = "art-torch") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue `work`; its future has its result or exception."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def job() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = work()
            except BaseException as error:  # delivered to whoever waits on the future
                future.set_exception(error)
            else:
                future.set_result(result)

        self._jobs.put(job)
        return future

    def run(self, work: Callable[[], T]) -> T:
        """`work()` on this thread: at once when called from it, else after the queued jobs."""
        if self.is_current():
            return work()
        return self.submit(work).result()

    def is_current(self) -> bool:
        """Whether the caller is this thread."""
        return threading.current_thread() is self._thread

    @property
    def others_waiting(self) -> bool:
        """Whether jobs are queued behind the running one (a long job should yield soon)."""
        return not self._jobs.empty()

    def _run(self) -> None:
        while True:
            self._jobs.get()()


_shared: tuple[int, TorchThread] | None = None
_shared_lock = threading.Lock()


def shared() -> TorchThread:
    """This process's torch thread, started on first use."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():  # a forked child has no thread
            _shared = (os.getpid(), TorchThread())
        return _shared[1]


__all__ = ["TorchThread", "shared"]
