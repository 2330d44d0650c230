"""Ctrl-C ends every long-running program of art, every time, wherever it lands.

Each program is started 20 times and sent SIGINT at a different moment (spread from its
imports, through its model service's start, to answering requests). Each time it must exit
within EXIT_S, and every process it started must be gone EXIT_S later. A miss does not stop
the loop: the program gets SIGABRT, which makes Python print every thread's stack
(PYTHONFAULTHANDLER), and that stack is part of the failure.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.model  # each program starts the default model's service

ROUNDS = 20
EXIT_S = 60.0  # generous on a loaded 2-core machine; a hang is minutes, not seconds
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"

# Registers a model and keeps its service generating until interrupted.
LOCAL_BACKEND_SCRIPT = """
import asyncio, sys
import art
from art.local import LocalBackend

async def main() -> None:
    backend = LocalBackend(path=sys.argv[1])
    model = art.TrainableModel(name="agent", project="sigint", base_model=sys.argv[2])
    await model.register(backend)
    client = model.openai_client()
    while True:
        await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=[{"role": "user", "content": "Count to twenty."}],
            max_tokens=32,
        )

asyncio.run(main())
"""


def terminal_like() -> None:
    """In the child before exec: SIGINT as a terminal's program gets it.

    Ignored or blocked signals pass through exec, and the pytest worker may have either
    from an earlier test's library; then no SIGINT would ever land.
    """
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except (FileNotFoundError, ProcessLookupError):
                continue
            todo += children - found
            found |= children
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def interrupt(
    command: list[str], log: Path, delay: float, busy: Callable[[], None] | None = None
) -> str | None:
    """Start `command`, SIGINT it `delay` s later; what went wrong, or None."""
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONPATH": os.getcwd()}
    with log.open("w") as output:
        program = subprocess.Popen(
            command, env=env, stdout=output, stderr=output, preexec_fn=terminal_like
        )
    try:
        if busy is not None:
            threading.Thread(target=busy, daemon=True).start()
        time.sleep(delay)
        if program.poll() is not None:
            return f"exited by itself ({program.returncode}) before the SIGINT: {log.read_text()[-2000:]}"
        started = descendants(program.pid)
        program.send_signal(signal.SIGINT)
        try:
            program.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            program.send_signal(signal.SIGABRT)
            program.wait(timeout=30)
            return (
                f"still running {EXIT_S:.0f} s after SIGINT; its stacks:\n{log.read_text()[-6000:]}"
            )
        deadline = time.monotonic() + EXIT_S
        while left := [pid for pid in started if alive(pid)]:
            if time.monotonic() > deadline:
                return f"processes it started outlived it by {EXIT_S:.0f} s: {left}"
            time.sleep(0.1)
        return None
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()


def delays(last: float) -> list[float]:
    """ROUNDS moments from 0.3 s to `last`, evenly spread: the same ones every run."""
    return [0.3 + (last - 0.3) * i / (ROUNDS - 1) for i in range(ROUNDS)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def keep_busy(root: str, register: list[tuple[str, dict[str, object]]], model: str) -> None:
    """Once the server answers: register a model (its model service starts) and chat."""
    with httpx.Client(base_url=root, timeout=300) as http:
        while True:
            try:
                http.get("/health")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        try:
            for path, body in register:
                http.post(path, json=body)
            chat = {
                "model": model,
                "messages": [{"role": "user", "content": "Count to twenty."}],
                "max_tokens": 64,
            }
            for _ in range(100):
                http.post("/v1/chat/completions", json=chat)
        except httpx.TransportError:
            return  # the server went away, as it should


@pytest.mark.parametrize("program", ["serve", "run"])
def test_art_serve_and_art_run_end_on_every_sigint(tmp_path: Path, program: str) -> None:
    misses = []
    for round_, delay in enumerate(delays(8.0)):
        port = free_port()
        command = [sys.executable, "-m", "art", program, "--port", str(port)]
        command += ["--path", str(tmp_path / ".art")]
        name = f"agent{round_}"
        model = {"project": "sigint", "name": name, "base_model": BASE}
        if program == "serve":
            command.append("--no-auth")
            register = [("/v1/preview/models", model)]
        else:
            model["trainable"] = True
            register = [("/register", model), ("/_prepare_backend_for_training", {"model": model})]
        root = f"http://127.0.0.1:{port}"
        busy = functools.partial(keep_busy, root, register, f"sigint/{name}")
        miss = interrupt(command, tmp_path / f"{program}-{round_}.log", delay, busy)
        if miss is not None:
            misses.append(f"round {round_}, SIGINT after {delay:.1f} s: {miss}")
    assert misses == []


def test_a_local_backend_script_ends_on_every_sigint(tmp_path: Path) -> None:
    misses = []
    for round_, delay in enumerate(delays(10.0)):
        command = [sys.executable, "-c", LOCAL_BACKEND_SCRIPT, str(tmp_path / ".art"), BASE]
        miss = interrupt(command, tmp_path / f"script-{round_}.log", delay)
        if miss is not None:
            misses.append(f"round {round_}, SIGINT after {delay:.1f} s: {miss}")
    assert misses == []
