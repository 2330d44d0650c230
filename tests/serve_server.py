"""One real `art serve` process on 127.0.0.1, for the tests of the server and its client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
KEY = "test-key-123"


class Server:
    """One `art serve` process; `url` is its API root (`.../v1`), `log()` its stderr so far."""

    def __init__(self, path: Path, *extra: str) -> None:
        self.path = path
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.root}/v1"
        command = [sys.executable, "-m", "art", "serve", "--port", str(self.port)]
        command += ["--path", str(path), *extra]
        env = {**os.environ, "ART_API_KEY": KEY}
        # A file, not a pipe: nobody reads a pipe while the tests run, and a full one blocks.
        self.log_path = path.parent / f"serve-{self.port}.log"
        self._log_file = self.log_path.open("w")
        self.process = subprocess.Popen(command, env=env, stderr=self._log_file)
        deadline = time.monotonic() + 120
        while True:
            assert self.process.poll() is None, self.log()
            try:
                if httpx.get(f"{self.root}/health").is_success:
                    return
            except httpx.TransportError:
                assert time.monotonic() < deadline, "art serve did not start"
                time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.process.wait(timeout=30)
        self._log_file.close()
