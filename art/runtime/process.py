"""Running the model service in a child process that dies with its parent.

The parent calls `ServiceAPI`'s methods (`register`, `train`, ..., `close`) as on an
in-process `ModelService`; each call is pickled over a local socket, groups and configs
as the objects they are, and answered with a value or the exception it raised (art's
errors pickle as themselves). This proxy is the only place a call is serialized. The child watches the socket: when the
parent exits, even by SIGKILL, the socket closes and the child exits too.

The child is a fresh `python -m art.runtime.process`, not a multiprocessing
spawn: spawn re-runs the parent's main script in the child, which breaks the common
training script that has no `if __name__ == "__main__":` guard. The socket's key reaches
it over its stdin, never its environment (readable in /proc), and the socket's temporary
directory is removed as soon as the child has connected, so no exit path leaves it.

A child that died is named as such on the next call, inference included: the model's
OpenAI client goes through `ServiceTransport`, which answers 503 saying so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import httpx

from ..core.data.errors import BackendError
from .service.api import ServiceAPI


def _child_main(connection: Connection, path: str) -> None:
    from .service.model_service import ModelService

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
    """A `ModelService` in a child process: a `ServiceAPI` whose calls, but `close`, are
    forwarded as they are (`__getattr__`), their arguments and results pickled."""

    def __init__(self, path: str) -> None:
        directory = tempfile.mkdtemp(prefix="art-service-")
        try:  # the directory only holds the socket until the child connects
            self._process, self._connection = _start_child(directory, path)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        self._lock = threading.Lock()

    def failure(self) -> str | None:
        """Why the child can no longer serve, with the fix; None while it runs."""
        code = self._process.poll()
        if code is None:
            return None
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return (
            f"the LocalBackend model service process (pid {self._process.pid}) {how}, so its "
            "models are no longer served or trained. Create a new LocalBackend and register "
            "the models again (their checkpoints and logs are kept); if it was out of memory, "
            "lower max_num_seqs or the batch size"
        )

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            if (failure := self.failure()) is not None:
                raise BackendError(failure)
            try:
                self._connection.send((method, args))
                status, value = self._connection.recv()
            except (EOFError, OSError) as error:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=5)  # its exit code names the cause
                raise BackendError(
                    f"during {method}: {self.failure() or 'the model service process hung up'}"
                ) from error
        if status == "error":
            raise value
        return value

    def __getattr__(self, method: str) -> Callable[..., Any]:
        """`ServiceAPI`'s calls (their signatures are stated there), each sent to the child."""
        if method.startswith("_") or not hasattr(ServiceAPI, method):
            raise AttributeError(f"{type(self).__name__} has no attribute {method!r}")
        return functools.partial(self._call, method)

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


def _start_child(directory: str, path: str) -> tuple[subprocess.Popen[bytes], Connection]:
    address = os.path.join(directory, "socket")
    authkey = secrets.token_bytes(32)
    with Listener(address, family="AF_UNIX", authkey=authkey) as listener:
        process = subprocess.Popen(
            [sys.executable, "-m", "art.runtime.process", address, path],
            stdin=subprocess.PIPE,
        )
        try:
            assert process.stdin is not None
            process.stdin.write(authkey.hex().encode() + b"\n")
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


class ServiceTransport(httpx.AsyncBaseTransport):
    """A transport for the OpenAI client of the child's endpoint that names a dead child.

    A request that cannot reach the endpoint because the child died is answered 503 with
    `failure()`'s text in OpenAI's error shape, which the OpenAI client raises as is.
    """

    def __init__(self, failure: Callable[[], str | None]) -> None:
        self._failure = failure
        # The OpenAI SDK's own pool limits, which httpx's defaults would lower.
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
        self._inner = httpx.AsyncHTTPTransport(limits=limits)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        failure = self._failure()
        if failure is None:
            try:
                return await self._inner.handle_async_request(request)
            except httpx.TransportError:
                failure = self._failure()
                if failure is None:
                    raise
        error = {"message": failure, "type": "server_error", "param": None, "code": "service_died"}
        return httpx.Response(503, json={"error": error}, request=request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def main() -> None:
    address, path = sys.argv[1], sys.argv[2]
    authkey = bytes.fromhex(sys.stdin.readline().strip())
    _child_main(Client(address, family="AF_UNIX", authkey=authkey), path)


if __name__ == "__main__":
    main()
