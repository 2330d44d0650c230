"""`UnslothTrainer`: the model service's `Trainer` whose steps run in an Unsloth process.

Unsloth pins transformers<=5.17.0 and trl<=1.15.0, so, like vLLM's server, it runs from an
environment of its own: `make venv-unsloth` builds `.venv-unsloth` beside this checkout,
and `ART_UNSLOTH_PYTHON` names any other interpreter that has unsloth (and the trainer's
dependencies, `scripts/unsloth_requirements.py`). The child (`unsloth_worker.py`) loads
the base with `FastLanguageModel.from_pretrained`, the adapter with `get_peft_model`, and
trains with our `PeftTrainer` on that model: one loss and step body for both trainers.

This object is the driver: each `Trainer` call is one request over a pipe, answered with
plain values. The service keeps its own copy of the base and adapter for its engine; every
checkpoint the child writes (`save`) or goes back to (`restore`) is loaded into that copy
here, so an engine that samples from the service's training model serves what the child
trained, and one with its own weights loads the same checkpoint directory.

A child that dies fails the call with its log's tail; the next call starts a new child
from the latest checkpoint (`TrainerSpec.latest_checkpoint`), as the Ray trainer group
does. The child exits when the service does, even by SIGKILL (its request pipe closes).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ...core.data import dev
from ...core.data.errors import ConfigError, TrainingError
from ...core.data.trajectories import Trajectory, TrajectoryGroup
from ...core.data.types import TrainConfig
from ..chat_format import ChatRendering
from ..sidecar import find_python, require_python

_PACKAGE = Path(__file__).resolve().parents[2]  # the `art` package: art/runtime/trainer/
_REPO = _PACKAGE.parent
_START_TIMEOUT_S = 900.0  # importing Unsloth and loading a base; a 4-bit one quantizes
INSTALL_HINT = (
    "Run `make venv-unsloth` in the art checkout (it builds .venv-unsloth: unsloth "
    "2026.10.9 with the CPU torch), or set ART_UNSLOTH_PYTHON to a Python interpreter that "
    "has unsloth and its requirements (scripts/unsloth_requirements.py)"
)


def find_unsloth_python() -> Path | None:
    """The interpreter to train with: `ART_UNSLOTH_PYTHON`, else this checkout's
    `.venv-unsloth` (built whole: its stamp is written last)."""
    return find_python("ART_UNSLOTH_PYTHON", _REPO / ".venv-unsloth", stamp=".installed")


def require_unsloth_python() -> Path:
    """`find_unsloth_python`, or a `ConfigError` naming the field and the fix."""
    return require_python(
        find_unsloth_python(),
        env_var="ART_UNSLOTH_PYTHON",
        field="_internal_config.trainer_backend",
        needs="trainer_backend='unsloth' needs Unsloth",
        fix=INSTALL_HINT,
        package="unsloth",
    )


@dataclass(frozen=True)
class UnslothSpec:
    """What the child process is started with."""

    python: Path
    weights: str  # a local model directory or hub name, as the service loaded it
    dtype: str  # the service's resolved dtype ("float32", "bfloat16", "float16")
    config: dev.InternalModelConfig
    log_path: Path


class UnslothTrainer:
    """A `Trainer` for the model service whose steps run in an Unsloth child process.

    `mirror(directory)` loads a checkpoint written by the child into the service's own
    copy of the adapter; the service calls `save` and `restore` with sole use of that copy.
    """

    def __init__(
        self,
        spec: UnslothSpec,
        start_from: Path | None,
        latest_checkpoint: Callable[[], Path],
        mirror: Callable[[Path], None],
    ) -> None:
        self.spec = spec
        self._latest_checkpoint = latest_checkpoint
        self._mirror = mirror
        self._process: subprocess.Popen[bytes] | None = None
        self._requests: Connection | None = None
        self._replies: Connection | None = None
        self._path_dir: Path | None = None  # holds the `art` link the child imports through
        self._start(start_from)

    # --- the Trainer protocol -------------------------------------------------------------

    def step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        dev_config: dev.TrainConfig,
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]:
        metrics: dict[str, float] = self._call(
            "step",
            "a training step",
            groups=[group.model_dump_json() for group in groups],
            config=config.model_dump(mode="json"),
            dev_config=dev_config.model_dump(mode="json"),
            rendering=rendering,
        )
        return metrics

    def sft_step(
        self,
        trajectories: list[Trajectory],
        learning_rate: float,
        dev_config: dev.TrainSFTConfig,
        rendering: ChatRendering | None = None,
    ) -> dict[str, float]:
        metrics: dict[str, float] = self._call(
            "sft_step",
            "a supervised step",
            trajectories=[trajectory.model_dump_json() for trajectory in trajectories],
            learning_rate=learning_rate,
            dev_config=dev_config.model_dump(mode="json"),
            rendering=rendering,
        )
        return metrics

    def save(self, directory: Path) -> None:
        """The child writes the adapter and optimizer state; the service's copy loads it."""
        self._call("save", "saving a checkpoint", directory=str(directory))
        self._mirror(directory)

    def restore(self, directory: Path) -> None:
        """Back to the checkpoint in `directory`: the child (a new one if it died) and the
        service's copy."""
        if self._process is None:
            self._start(directory)
        else:
            self._call("restore", "restoring a checkpoint", directory=str(directory))
        self._mirror(directory)

    def close(self) -> None:
        """End the child: its pipe closed (it exits at end of file), then its group."""
        process, self._process = self._process, None
        for connection in (self._requests, self._replies):
            if connection is not None:
                connection.close()
        self._requests = self._replies = None
        if self._path_dir is not None:
            shutil.rmtree(self._path_dir, ignore_errors=True)  # a symlink: `art` stays
            self._path_dir = None
        if process is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10.0)  # it exits once its request pipe is closed
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10.0)
                return

    @property
    def pid(self) -> int | None:
        """The child's process id (None while none runs)."""
        return self._process.pid if self._process is not None else None

    # --- the child process ------------------------------------------------------------------

    def _start(self, start_from: Path | None) -> None:
        """Start a child and wait until it has loaded the base and adapter."""
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        # Only `art` on the child's path: this process's site-packages (another torch and
        # transformers) must not leak into Unsloth's environment.
        path_dir = self._path_dir = Path(tempfile.mkdtemp(prefix="art-unsloth-path-"))
        (path_dir / "art").symlink_to(_PACKAGE, target_is_directory=True)
        env = {
            **os.environ,
            "PYTHONPATH": str(path_dir),
            "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
            "UNSLOTH_DISABLE_STATISTICS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        env.pop("ART_UNSLOTH_PYTHON", None)
        try:
            with open(spec.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    [
                        str(spec.python),
                        "-P",
                        "-m",
                        "art.runtime.trainer.unsloth_worker",
                        str(request_read),
                        str(reply_write),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    pass_fds=(request_read, reply_write),
                    start_new_session=True,  # its own group, which `close` ends
                )
        finally:
            os.close(request_read)
            os.close(reply_write)
        self._requests = Connection(request_write, readable=False)
        self._replies = Connection(reply_read, writable=False)
        self._requests.send(
            {
                "weights": spec.weights,
                "dtype": spec.dtype,
                "config": spec.config.model_dump(mode="json"),
                "start_from": str(start_from) if start_from is not None else None,
            }
        )
        self._answer("starting", _START_TIMEOUT_S)

    def _call(self, method: str, what: str, **kwargs: Any) -> Any:
        if self._process is None:  # the last child died: a new one from the last checkpoint
            self._start(self._latest_checkpoint())
        assert self._requests is not None
        with contextlib.suppress(OSError):  # it died: `_answer` says how
            self._requests.send((method, kwargs))
        return self._answer(what, None)

    def _answer(self, what: str, timeout_s: float | None) -> Any:
        """The child's answer to the last request; its error raised here, with context."""
        assert self._process is not None
        assert self._replies is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._replies.poll(1.0):
            if self._process.poll() is not None:
                break
            if deadline is not None and time.monotonic() > deadline:
                self.close()
                raise TrainingError(
                    f"the Unsloth trainer did not answer {what} within {timeout_s:.0f} s; "
                    f"its log is {self.spec.log_path}"
                )
        try:
            reply = self._replies.recv()
        except (EOFError, OSError):
            code = self._process.wait()
            pid = self._process.pid
            self.close()
            raise TrainingError(
                f"the Unsloth trainer process (pid {pid}) exited with code {code} during "
                f"{what}. Nothing was saved: the last checkpoint is intact, and the next "
                f"step starts a new trainer from it. The end of its log "
                f"({self.spec.log_path}):\n{_tail(self.spec.log_path)}"
            ) from None
        if reply[0] == "ok":
            return reply[1]
        kind = reply[1]
        if what == "starting":
            self.close()
        if kind == "config":
            raise ConfigError(reply[2], reply[3], reply[4])
        if kind == "training":
            raise TrainingError(reply[2])
        raise TrainingError(
            f"the Unsloth trainer failed during {what}: {reply[2]} (its log, with the "
            f"traceback: {self.spec.log_path})"
        )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


__all__ = [
    "INSTALL_HINT",
    "UnslothSpec",
    "UnslothTrainer",
    "find_unsloth_python",
    "require_unsloth_python",
]
