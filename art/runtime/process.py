"""Running the model service in a child process that dies with its parent.

The parent calls `ServiceAPI`'s methods (`register`, `train`, ..., `close`) as on an
in-process `ModelService`; each call is pickled over a local socket, groups and configs
as the objects they are, and answered with a value or the exception it raised (art's
errors pickle as themselves). This proxy is the only place a call is serialized. The
child watches the socket: when the parent exits, even by SIGKILL, the socket closes and
the child exits too.

The child is a fresh `python -m art.runtime.process`, not a multiprocessing
spawn: spawn re-runs the parent's main script in the child, which breaks the common
training script that has no `if __name__ == "__main__":` guard. The socket's key and
the endpoint's reach it over its stdin, never its environment (readable in /proc), and
the socket's temporary directory is removed as soon as the child has connected, so no
exit path leaves it.

A child that died is named by the call it was answering, inference included (the model's
OpenAI client goes through `service_transport`'s transport, which answers 503 saying so), and replaced
at once by a new child serving the same models at the same address.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from ..core.data.errors import BackendError
from .service.api import ServiceAPI

logger = logging.getLogger("art.service")


def _child_main(connection: Connection, path: str, api_key: str, port: int) -> None:
    from .service.model_service import ModelService

    service = ModelService(path, api_key=api_key, port=port)
    while True:
        try:
            method, args = connection.recv()
        except (EOFError, OSError):  # the parent is gone
            os._exit(0)
        try:
            result = getattr(service, method)(*args)
        except BaseException as error:
            try:
                connection.send(("error", error))
            except Exception:  # an exception that does not pickle: send its text instead
                connection.send(("error", BackendError("".join(traceback.format_exception(error)))))
        else:
            connection.send(("ok", result))
        if method == "close":
            connection.close()
            os._exit(0)


class ServiceProcess:
    """A `ModelService` in a child process: a `ServiceAPI` whose calls, but `register`,
    `unload` and `close`, are forwarded as they are (`__getattr__`), their arguments and
    results pickled.

    When the child dies (killed, out of memory), the call it was answering raises
    `BackendError` naming the cause, and a new child is started at once: it serves at the
    same port with the same key, and the models registered with the old one are registered
    again, each from its latest checkpoint on disk. A step the dead child did not finish
    left no checkpoint (checkpoints are written atomically), so the next step takes its
    number.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._api_key = f"art-{secrets.token_urlsafe(24)}"
        self._port = 0  # the endpoint's, once a model is registered; kept over restarts
        self._records: dict[str, dict[str, Any]] = {}  # registered models, by project/run
        self._lock = threading.Lock()  # one call, start or restart at a time
        self._closed = False
        self._death: str | None = None  # why the last child died
        self.deaths = 0  # children that died, so far
        self._restart_failure: str | None = None  # why the last restart failed
        self._noted: subprocess.Popen[bytes] | None = None  # the child whose death is noted
        self._restarting = False  # a new child is started and its models registered
        self._died_starting = False  # the last new child died before it served
        self._start()

    def _start(self) -> None:
        """Start a child (the lock held, or in `__init__`) and watch it."""
        directory = tempfile.mkdtemp(prefix="art-service-")
        try:  # the directory only holds the socket until the child connects
            self._process, self._connection = _start_child(
                directory, self.path, self._api_key, self._port
            )
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        threading.Thread(
            target=self._watch, args=(self._process,), name="art-service-watch", daemon=True
        ).start()

    def _watch(self, process: subprocess.Popen[bytes]) -> None:
        """Wait for `process` to exit; if it died serving, start a new child."""
        _wait_without_reaping(process)
        process.wait()
        with self._lock:
            if self._closed or process is not self._process:
                return
            self._note_death()
            if not self._died_starting:  # a child that dies as it starts: the next call retries
                self._restart()

    def _note_death(self) -> None:
        """Count the child's death and keep its cause, once (the lock held)."""
        if self._noted is not self._process:
            self._noted = self._process
            self.deaths += 1
            self._death = self._failure_of(self._process)

    def _restart(self) -> None:
        """Start a new child and register the dead one's models with it (the lock held);
        on failure, say why in `failure()` and leave it to the next call to try again."""
        old = self._process.pid
        self._connection.close()
        self._restarting = True
        try:
            self._start()
            for record in list(self._records.values()):
                self._send("register", record)
        except Exception as error:
            self._restart_failure = f"starting it again failed: {error}"
            self._died_starting = self._process.poll() is not None
            logger.error("the model service process (pid %d) died and %s", old, error)
            return
        finally:
            self._restarting = False
        self._restart_failure = None
        self._died_starting = False
        logger.warning(
            "the model service process (pid %d) died (%s); started a new one (pid %d) and "
            "registered its %d model(s) again from their latest checkpoints",
            old,
            self._death,
            self._process.pid,
            len(self._records),
        )

    def failure(self) -> str | None:
        """Why the service cannot serve now, with the fix; None while a child serves."""
        if self._process.poll() is None and not self._restarting:
            return None
        how = self._death or self._failure_of(self._process)
        return how if self._restart_failure is None else f"{how}; {self._restart_failure}"

    @property
    def pid(self) -> int:
        """The running child's process id (a new one after a restart)."""
        return self._process.pid

    def restart_failed(self) -> bool:
        """Whether the last attempt to start a new child failed (the next call tries again)."""
        return self._restart_failure is not None

    def death(self) -> str | None:
        """Why the last child died, with what was done about it; None if none has."""
        return self._death

    @staticmethod
    def _failure_of(process: subprocess.Popen[bytes]) -> str:
        code = process.returncode
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return (
            f"the LocalBackend model service process (pid {process.pid}) {how}; what it was "
            "doing is lost, but not its models: a new process is started, serves at the "
            "same address and registers them again from their latest checkpoints (a step "
            "it did not finish wrote no checkpoint). If it was out of memory, lower "
            "max_num_seqs or the batch size"
        )

    def _send(self, method: str, *args: Any) -> Any:
        """One call to the running child (the lock held)."""
        try:
            self._connection.send((method, args))
            status, value = self._connection.recv()
        except (EOFError, OSError) as error:
            try:
                self._process.wait(timeout=5)  # its exit code names the cause
            except subprocess.TimeoutExpired:
                raise BackendError(f"during {method}: the model service process hung up") from error
            self._note_death()
            raise BackendError(f"during {method}: {self._death}") from error
        if status == "error":
            raise value
        return value

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            if self._closed:
                raise BackendError("the model service was closed (LocalBackend.close)")
            # Dead: the watcher has not restarted it yet, or its restart failed.
            if self._process.poll() is not None:
                self._note_death()
                self._restart()
                if (failure := self.failure()) is not None:
                    raise BackendError(failure)
            return self._send(method, *args)

    def register(self, record: dict[str, Any]) -> dict[str, str]:
        """`ServiceAPI.register`, remembered so that a new child registers it again."""
        served: dict[str, str] = self._call("register", record)
        with self._lock:
            self._records[f"{record['project']}/{record.get('run_name') or record['name']}"] = (
                record
            )
            self._port = int(served["base_url"].rsplit(":", 1)[1].split("/", 1)[0])
        return served

    def unload(self, project: str, name: str) -> None:
        """`ServiceAPI.unload`; a new child no longer registers the model."""
        with self._lock:
            self._records.pop(f"{project}/{name}", None)
        self._call("unload", project, name)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        """`ServiceAPI`'s calls (their signatures are stated there), each sent to the child."""
        if method.startswith("_") or not hasattr(ServiceAPI, method):
            raise AttributeError(f"{type(self).__name__} has no attribute {method!r}")
        return functools.partial(self._call, method)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._process.poll() is None:
                with contextlib.suppress(BackendError):  # it may already be exiting
                    self._send("close")
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._connection.close()


def _wait_without_reaping(process: subprocess.Popen[bytes]) -> None:
    """Block until `process` exits, without `Popen.wait`: that holds the Popen's lock while
    it blocks, and `Popen.poll` answers None meanwhile, so `failure()` could not see a death."""
    try:
        descriptor = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd (not Linux, or an old kernel): poll
        while process.poll() is None:
            time.sleep(0.1)
        return
    try:
        select.select([descriptor], [], [])
    finally:
        os.close(descriptor)


def _start_child(
    directory: str, path: str, api_key: str, port: int
) -> tuple[subprocess.Popen[bytes], Connection]:
    address = os.path.join(directory, "socket")
    authkey = secrets.token_bytes(32)
    with Listener(address, family="AF_UNIX", authkey=authkey) as listener:
        process = subprocess.Popen(
            [sys.executable, "-m", "art.runtime.process", address, path],
            stdin=subprocess.PIPE,
        )
        try:
            assert process.stdin is not None
            start = {"authkey": authkey.hex(), "api_key": api_key, "port": port}
            process.stdin.write(json.dumps(start).encode() + b"\n")
            process.stdin.close()
            listener._listener._socket.settimeout(120)  # type: ignore[attr-defined]
            return process, listener.accept()
        except BaseException as error:  # SIGINT included: no child outlives a failed start
            process.kill()
            process.wait()
            if isinstance(error, OSError):
                raise BackendError(
                    f"the model service process did not start (exit code {process.returncode})"
                ) from error
            raise


def main() -> None:
    address, path = sys.argv[1], sys.argv[2]
    start = json.loads(sys.stdin.readline())
    connection = Client(address, family="AF_UNIX", authkey=bytes.fromhex(start["authkey"]))
    _child_main(connection, path, start["api_key"], start["port"])


if __name__ == "__main__":
    main()
