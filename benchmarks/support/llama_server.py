"""`llama-server` run on 127.0.0.1 for as long as a block runs: the llama.cpp peer of
`llama_cpp.py` and the RULER judge of `local_judge.py` both start it this way."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(binary: Path, port: int, arguments: list[str]) -> Iterator[str]:
    """`binary --host 127.0.0.1 --port <port> <arguments>` until the block ends; yields its
    OpenAI base URL once `/health` answers. A server that exits or is not up within 120 s
    is an error carrying the end of its log."""
    command = [str(binary), "--host", "127.0.0.1", "--port", str(port), *arguments]
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"llama-server did not start:\n{log.read()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                        break
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


__all__ = ["free_port", "running"]
