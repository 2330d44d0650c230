"""Running the model service in a child process that dies with its parent.

The parent calls `register`, `train` and `close` as on an in-process `ModelService`;
each call is sent over a local socket and answered with a value or the exception it
raised (art's errors pickle as themselves). The child watches the socket: when the
parent exits, even by SIGKILL, the socket closes and the child exits too.

The child is a fresh `python -m art.backends.local.process`, not a multiprocessing
spawn: spawn re-runs the parent's main script in the child, which breaks the common
training script that has no `if __name__ == "__main__":` guard.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from ...core.errors import BackendError


def _child_main(connection: Connection, path: str) -> None:
    from .service import ModelService

    service = ModelService(path)
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
    """A `ModelService` in a child process, called like the in-process one."""

    def __init__(self, path: str) -> None:
        self._dir = tempfile.mkdtemp(prefix="art-service-")
        address = os.path.join(self._dir, "socket")
        authkey = secrets.token_bytes(32)
        with Listener(address, family="AF_UNIX", authkey=authkey) as listener:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "art.backends.local.process", address, path],
                env={**os.environ, "ART_SERVICE_AUTHKEY": authkey.hex()},
            )
            listener._listener._socket.settimeout(120)  # type: ignore[attr-defined]
            try:
                self._connection = listener.accept()
            except OSError as error:
                self._process.kill()
                raise BackendError(
                    f"the model service process did not start (exit code {self._process.poll()})"
                ) from error
        self._lock = threading.Lock()

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            if self._process.poll() is not None:
                raise BackendError(
                    f"the model service process exited (code {self._process.returncode}); "
                    "create a new LocalBackend"
                )
            try:
                self._connection.send((method, args))
                status, value = self._connection.recv()
            except (EOFError, OSError) as error:
                raise BackendError(
                    f"the model service process died during {method} (code {self._process.poll()})"
                ) from error
        if status == "error":
            raise value
        return value

    def register(self, record: dict[str, Any]) -> dict[str, str]:
        result: dict[str, str] = self._call("register", record)
        return result

    def train(
        self,
        project: str,
        name: str,
        groups_json: list[str],
        config: dict[str, Any],
        dev_config: dict[str, Any],
    ) -> dict[str, float]:
        result: dict[str, float] = self._call(
            "train", project, name, groups_json, config, dev_config
        )
        return result

    def close(self) -> None:
        if self._process.poll() is None:
            with contextlib.suppress(BackendError):  # it may already be exiting
                self._call("close")
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._connection.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def main() -> None:
    address, path = sys.argv[1], sys.argv[2]
    authkey = bytes.fromhex(os.environ.pop("ART_SERVICE_AUTHKEY"))
    _child_main(Client(address, family="AF_UNIX", authkey=authkey), path)


if __name__ == "__main__":
    main()
