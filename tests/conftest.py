"""Shared fixtures. Everything here is real: files on disk, HTTP servers on 127.0.0.1."""

from __future__ import annotations

import faulthandler
import os
import platform
import random
import re
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio
from helpers import JsonHandler, lock_waits, one_at_a_time, serving
from scheduling import LockAwareLoadFileScheduling, TestSeconds

if TYPE_CHECKING:
    from art.local import LocalBackend

# Tests never reach a hub or a tracking service, however pytest is started.
for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "offline",
    "WEAVE_DISABLED": "true",
    "LANGFUSE_TRACING_ENABLED": "false",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
}.items():
    os.environ.setdefault(_name, _value)

# Under pytest-xdist each worker, and every process it starts, gets its share of the cores
# for torch's OpenMP team: two workers that each take every core spin against each other
# (two test_trainer.py runs side by side on 2 cores: 117 s with 2 threads each, 43 s with
# 1; alone 34 s and 39 s). OMP_NUM_THREADS set by the caller wins.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (_cores or 1) // _workers)))


# The seed of this run's sampling-dependent tests (`make test-seeds` runs them under five).
TEST_SEED = int(os.environ.get("ART_TEST_SEED", "0"))

_module_seconds: defaultdict[str, float] = defaultdict(float)
_module_lock_waits: defaultdict[str, float] = defaultdict(float)
_test_seconds: defaultdict[str, float] = defaultdict(float)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` with the lock units and the longest-first order of
    tests/scheduling.py; any other mode is xdist's own."""
    if config.getoption("dist") != "loadfile":
        return None
    return LockAwareLoadFileScheduling(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or a run without workers) records each test's seconds, for the
    next run's order."""
    if not hasattr(session.config, "workerinput"):
        TestSeconds().update(_test_seconds)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Each phase's report carries the seconds it waited for `one_at_a_time` locks, so the
    controller (which runs no tests under xdist) can sum them per module."""
    report = yield
    waited = sum(lock_waits.values())
    lock_waits.clear()
    if waited:
        report.user_properties.append(("lock_wait_seconds", waited))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::")[0]
    _module_seconds[module] += report.duration
    _test_seconds[report.nodeid] += report.duration
    for key, value in report.user_properties:
        if key == "lock_wait_seconds":
            _module_lock_waits[module] += float(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Wall time per test module (setup, call and teardown, module fixtures included), the
    slowest first; with ART_TEST_DURATIONS=FILE also written there as a Markdown table."""
    if not _module_seconds:
        return
    rows = sorted(_module_seconds.items(), key=lambda row: -row[1])
    total = sum(_module_seconds.values())
    terminalreporter.write_sep("=", f"seconds per module ({total:.0f} s in all)")
    for module, seconds in rows:
        terminalreporter.write_line(f"{seconds:8.1f}  {module}")
    # A worker waiting for another's vLLM server or Ray cluster does nothing meanwhile.
    waits = sorted(
        ((module, seconds) for module, seconds in _module_lock_waits.items() if seconds >= 1),
        key=lambda row: -row[1],
    )
    if waits:
        terminalreporter.write_sep("=", "of which waiting for another worker's lock")
        for module, seconds in waits:
            terminalreporter.write_line(f"{seconds:8.1f}  {module}")
    target = os.environ.get("ART_TEST_DURATIONS")
    if target:
        lines = [
            f"machine: {platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}",
            "",
            "| module | seconds |",
            "|---|---:|",
            *(f"| {module} | {seconds:.1f} |" for module, seconds in rows),
            f"| all | {total:.1f} |",
        ]
        Path(target).write_text("\n".join(lines) + "\n")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# Fixtures that load the default model or start a model service: a test that uses one,
# through any fixture of its own, is marked `model` (`make check` leaves those out).
_MODEL_FIXTURES = {"default_model", "shared_backend", "ray_cluster"}


def pytest_itemcollected(item: pytest.Item) -> None:
    if _MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.model)


@pytest.fixture(autouse=True)
def _no_inherited_wandb_service() -> Iterator[None]:
    """wandb keeps its service's address in this process's WANDB_SERVICE, and every
    process started later connects to that service instead of its own. A test that ran
    W&B in this worker would hand its service to the scripts of the tests after it, which
    fail with "Connection lost" once it is gone (seen in CI: the W&B run of a script
    started after such a test had no rows)."""
    os.environ.pop("WANDB_SERVICE", None)
    yield
    os.environ.pop("WANDB_SERVICE", None)


@pytest.fixture
def test_seed() -> int:
    """The seed a sampling-dependent test samples under: ART_TEST_SEED (0 by default).

    Such a test is marked `sampling`, and its verdict must hold whatever the seed: `make
    test-seeds` runs every one of them under five seeds.
    """
    random.seed(TEST_SEED)
    import torch

    torch.manual_seed(TEST_SEED)
    return TEST_SEED


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A thread a test left behind must not hold the run open until CI's limit: if the
    process has not exited two minutes after the last test, print every thread's stack
    and exit with status 1.

    Not in an xdist worker: one that ran out of tests waits, done, for the controller to
    close it, which happens only when the other worker is done too (in CI once more than
    two minutes later: the guard dumped the idle worker's stacks into the log and killed
    it mid-run). The controller's own guard covers the end of the whole run.
    """
    if hasattr(config, "workerinput"):
        return
    faulthandler.dump_traceback_later(120, exit=True)


class _ChatServer(JsonHandler):
    """A minimal OpenAI-compatible chat endpoint standing in for an external model.

    It answers every request by echoing the last user message, with logprobs, and calls
    a tool when the request offers one, so the real OpenAI client parses real responses.
    """

    def do_POST(self) -> None:
        request = self.read_json()
        last_user = next(m for m in reversed(request["messages"]) if m["role"] == "user")
        text = f"echo: {last_user['content']}"
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if request.get("tools"):
            name = request["tools"][0]["function"]["name"]
            message["tool_calls"] = [
                {"id": "call_1", "type": "function", "function": {"name": name, "arguments": "{}"}}
            ]
        tokens = text.split()
        body = {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls" if "tool_calls" in message else "stop",
                    "message": message,
                    "logprobs": {
                        "content": [
                            {
                                "token": t,
                                "logprob": -0.1,
                                "bytes": list(t.encode()),
                                "top_logprobs": [],
                            }
                            for t in tokens
                        ]
                    },
                }
            ],
            "usage": {
                "prompt_tokens": 3,
                "completion_tokens": len(tokens),
                "total_tokens": 3 + len(tokens),
            },
        }
        self.send_json(body)


@pytest.fixture(scope="session")
def chat_server_url() -> Iterator[str]:
    with serving(_ChatServer) as url:
        yield url


class ScriptedChat:
    """A chat endpoint that answers with the texts queued in `answers`, in order.

    It records every request body in `requests`, so a test can count the calls that
    reached it. With nothing queued it answers 400, which clients do not retry.
    """

    def __init__(self) -> None:
        self.answers: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.url = ""


@pytest.fixture
def scripted_chat() -> Iterator[ScriptedChat]:
    script = ScriptedChat()

    class Handler(JsonHandler):
        def do_POST(self) -> None:
            request = self.read_json()
            script.requests.append(request)
            body: dict[str, Any] = {"error": {"message": "no scripted answer left"}}
            if script.answers:
                body = {
                    "id": f"chatcmpl-scripted-{len(script.requests)}",
                    "object": "chat.completion",
                    "created": 0,
                    "model": request["model"],
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": script.answers.pop(0)},
                        }
                    ],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
                }
            self.send_json(body, 200 if "choices" in body else 400)

    with serving(Handler) as url:
        script.url = url
        yield script


@pytest.fixture
def art_path(tmp_path: Path) -> Path:
    return tmp_path / ".art"


@pytest.fixture(scope="session")
def default_model() -> tuple[Any, Any]:
    """The embedded default model and its tokenizer, loaded once (converted from GGUF on first use).

    Session-wide and shared: a test that wraps the model (LoRA) must wrap a copy. fp32, so
    tests can compare numbers tightly whatever dtype the hardware would pick.
    """
    from art.runtime.models import DEFAULT_MODEL, load, resolve

    return load(resolve(DEFAULT_MODEL), "float32")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster for the module, the only one on the machine while it runs. Its
    logical CPUs exceed this machine's cores: Ray reserves them for placement, and the
    tests' actors are mostly idle."""
    import ray

    with one_at_a_time("ray"):
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()


# The session's in-process backends, once a test has started them.
_session_backends: list[LocalBackend] = []


@pytest.fixture(scope="module", autouse=True)
def _unload_the_modules_models() -> Iterator[None]:
    """After each module, the session backends unload every model it registered.

    Each model keeps a LoRA adapter on the shared base while loaded, and PEFT walks every
    adapter's modules when one is added, activated or saved: a register-and-train cycle
    took 1.7 s with no other adapter loaded and 4.3 s with 43 (one torch thread), so
    without this every training test ran slower the later it came in its worker. A
    module's models are its own (`unique_project`), and `--dist loadfile` runs a module
    whole on one worker, so none is in use at its end."""
    yield
    from art.runtime.service.model_service import ModelService

    for backend in _session_backends:
        service = backend.service
        if isinstance(service, ModelService):  # None until the backend's first registration
            for project, run in service.loaded():
                service.unload(project, run)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def dedicated_backend(
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[LocalBackend]:
    """One in-process LocalBackend for PipelineTrainer's dedicated-mode models: they cannot
    share a base model with `shared_backend`'s models, which run in shared mode."""
    from art.local import LocalBackend

    backend = LocalBackend(path=tmp_path_factory.mktemp("dedicated") / ".art", in_process=True)
    _session_backends.append(backend)
    yield backend
    await backend.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def shared_backend(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalBackend]:
    """One in-process LocalBackend for the whole session, on the default model.

    Loading the model and starting its service is the costliest set-up there is, so every
    test that needs no backend of its own shares this one. Each registers its models under
    a project of its own (`unique_project`), which keeps their names, adapters and files
    apart. A test that builds its own backend says why in one line.
    """
    from art.local import LocalBackend

    backend = LocalBackend(path=tmp_path_factory.mktemp("shared") / ".art", in_process=True)
    _session_backends.append(backend)
    yield backend
    await backend.close()


@pytest.fixture
def unique_project(request: pytest.FixtureRequest) -> str:
    """A project name no other test uses: the test's module and name."""
    module = Path(request.node.path).stem.removeprefix("test_")
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{module}-{request.node.name}")[:120]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """A real S3-compatible server on 127.0.0.1 for the session (moto's server mode, which
    takes any credentials); its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Points boto3 (`art.utils.s3`) at `s3_server` through AWS's own environment
    variables, with fake credentials and no config files; returns a bucket name no other
    test uses (not created: a push creates it, as ART's does)."""
    import uuid

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "BACKUP_BUCKET"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
    }.items():
        monkeypatch.setenv(name, value)
    return f"art-test-{uuid.uuid4().hex[:12]}"
