"""The writer lock of a model directory: one process trains a model, a second is refused.

Real processes: a child Python takes the lock on the same directory as the test.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import art
from art.core.data.errors import ModelInUseError
from art.core.store.model_store import ModelStore
from art.local import LocalBackend

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the writer lock is POSIX")

# Takes the lock (or reports who holds it), says so on stdout, then waits for stdin to close.
_CHILD = """
import sys
from art.core.data.errors import ModelInUseError
from art.core.store.model_store import ModelStore
try:
    lock = ModelStore(sys.argv[1], sys.argv[2], "agent").hold_writer_lock()
except ModelInUseError as error:
    print("refused", error.pid, flush=True)
else:
    print("locked", flush=True)
sys.stdin.read()
"""


@contextmanager
def child_asking(
    base: Path, project: str = "project"
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process that asks for the lock of `base`'s model "agent" of `project`;
    yields it and its answer."""
    root = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(base), project],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        yield child, child.stdout.readline().strip()
    finally:
        child.kill()
        child.wait()


def test_a_second_process_is_refused_naming_the_holder_until_it_dies(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "project", "agent")
    with child_asking(tmp_path) as (child, answer):
        assert answer == "locked"
        holder = json.loads(store.lock_path.read_text())
        assert holder["pid"] == child.pid

        with pytest.raises(ModelInUseError) as refused:
            store.hold_writer_lock()
        error = refused.value
        assert isinstance(error, art.ConfigError)
        assert error.pid == child.pid
        message = str(error)
        assert str(store.dir) in message
        assert f"close the other backend (pid {child.pid})" in message.lower()
        assert "another name or path" in message
        # It crosses a process boundary (the model service's) as itself.
        copied = pickle.loads(pickle.dumps(error))
        assert (type(copied), copied.pid, str(copied)) == (ModelInUseError, child.pid, message)

        os.kill(child.pid, signal.SIGKILL)  # no cleanup runs: the OS frees the flock
        child.wait()

    lock = store.hold_writer_lock()
    try:
        assert json.loads(store.lock_path.read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def test_a_released_lock_can_be_taken_again_here_and_elsewhere(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "project", "agent")
    first = store.hold_writer_lock()
    with child_asking(tmp_path) as (_, answer):
        assert answer == f"refused {os.getpid()}"
    first.release()
    first.release()  # idempotent: it does not drop another hold
    with child_asking(tmp_path) as (_, answer):
        assert answer == "locked"
    again = store.hold_writer_lock()
    try:
        assert json.loads(store.lock_path.read_text())["pid"] == os.getpid()
    finally:
        again.release()
    assert store.lock_path.read_text() == ""  # nobody is named once it is free


def test_the_lock_is_reentrant_within_a_process(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, "project", "agent")
    first = store.hold_writer_lock()
    second = ModelStore(tmp_path, "project", "agent").hold_writer_lock()
    first.release()
    with child_asking(tmp_path) as (_, answer):
        assert answer == f"refused {os.getpid()}"  # the second hold keeps it
    second.release()
    with child_asking(tmp_path) as (_, answer):
        assert answer == "locked"


def test_models_apart_lock_apart(tmp_path: Path) -> None:
    other = ModelStore(tmp_path, "project", "other")
    with other.hold_writer_lock(), child_asking(tmp_path) as (_, answer):
        assert answer == "locked"


async def test_a_model_unloaded_by_its_service_can_be_trained_by_another_process(
    shared_backend: LocalBackend, unique_project: str
) -> None:
    """The service holds a model's lock from its first step until it unloads the model
    (`art serve` does when a model is deleted): then another process may take it."""
    from art.runtime.service.model_service import ModelService

    model = art.TrainableModel(
        name="agent", project=unique_project, base_model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    await model.register(shared_backend)
    client = model.openai_client()
    trajectories = []
    for reward in (0.0, 1.0):
        trajectory = art.Trajectory(
            messages_and_choices=[{"role": "user", "content": "Say hi."}], reward=reward
        )
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=3
        )
        trajectory.messages_and_choices.append(completion.choices[0])
        trajectories.append(trajectory)
    await model.train([art.TrajectoryGroup(trajectories)])
    path = Path(shared_backend.path)
    with child_asking(path, unique_project) as (_, answer):
        assert answer == f"refused {os.getpid()}"  # trained here: held
    service = shared_backend.service
    assert isinstance(service, ModelService)
    service.unload(unique_project, "agent")
    with child_asking(path, unique_project) as (_, answer):
        assert answer == "locked"
