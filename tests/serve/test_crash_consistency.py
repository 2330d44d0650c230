"""`art serve` SIGKILLed at random points of log, train, SFT, fork and delete (#39).

After each kill the server starts again on the same `--path`, and every model is either
as it was before the call or as it is after it: `model.json` and `history.jsonl` parse,
every checkpoint's adapter and optimizer state load, a trained step is whole or absent,
a fork is the source's checkpoint or nothing, a deleted model is all there or all gone,
and the server answers for each. A small random Llama (the default tokenizer) is the
base, so a restart loads in a second; the points are drawn from each call's duration,
measured once unkilled, with the run's seed (`ART_TEST_SEED`).
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers import save_random_llama
from safetensors.torch import load_file
from serve_server import KEY, Server

pytestmark = pytest.mark.model  # starts art serve processes

# One kill per call kind a run (each restart of art serve costs ~9 s of `make test`'s 30
# minutes); `make test-seeds` runs five seeds, so 25 kill points in all.
KILLS = 5
PROJECT = "crash"
MODELS = "/v1/preview/models"
GROUP = {
    "trajectories": [
        {
            "messages_and_choices": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "Hi there."},
            ],
            "reward": reward,
        }
        for reward in (0.0, 1.0)
    ]
}
SFT_LINE = (
    json.dumps(
        {
            "messages": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": "Hi."},
            ]
        }
    )
    + "\n"
).encode()


@pytest.fixture(scope="module")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama, randomly initialised, saved with the default tokenizer."""
    from art.runtime.models import default_model_dir

    directory = tmp_path_factory.mktemp("random-llama")
    return save_random_llama(directory, str(default_model_dir()), hidden_size=64, layers=2)


class Crash:
    """The server under test, restarted after each kill, and the calls made to it."""

    def __init__(self, root: Path, base: Path) -> None:
        self.root, self.base = root, str(base)
        self.server = Server(root)
        self.http = self._client()

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.root, headers={"Authorization": f"Bearer {KEY}"}, timeout=120
        )

    def restart(self) -> None:
        self.http.close()
        self.server = Server(self.root)
        self.http = self._client()

    def register(self, name: str) -> str:
        body = {"project": PROJECT, "name": name, "base_model": self.base, "return_existing": True}
        created = self.http.post(MODELS, json=body)
        assert created.status_code == 200, created.text
        return f"{PROJECT}~{name}"

    def wait_for_job(self, job_id: str) -> None:
        status = "running"
        while status not in ("succeeded", "failed"):
            time.sleep(0.05)
            status = self.http.get(f"/v1/preview/training-jobs/{job_id}").json()["status"]
        assert status == "succeeded"

    def model_dir(self, name: str) -> Path:
        return self.root / PROJECT / "models" / name


# --- the calls: each (prepare, run) -------------------------------------------------------
# `prepare` runs before the clock starts and returns the model the call changes; `run`
# makes the call and returns once its effect is complete (a job: when it has ended).


def log(crash: Crash, cycle: int) -> tuple[str, Callable[[], None]]:
    model = crash.register("kept")

    def run() -> None:
        body = {"metrics": {"cycle": cycle}, "trajectory_groups": [GROUP]}
        assert crash.http.post(f"{MODELS}/{model}/log", json=body).status_code == 200

    return "kept", run


def train(crash: Crash, cycle: int) -> tuple[str, Callable[[], None]]:
    model = crash.register("kept")

    def run() -> None:
        body = {
            "model_id": model,
            "trajectory_groups": [GROUP],
            "experimental_config": {"allow_training_without_logprobs": True},
        }
        job = crash.http.post("/v1/preview/training-jobs", json=body)
        assert job.status_code == 200, job.text
        crash.wait_for_job(job.json()["id"])

    return "kept", run


def sft(crash: Crash, cycle: int) -> tuple[str, Callable[[], None]]:
    model = crash.register("kept")
    url = crash.http.post(f"{MODELS}/{model}/sft-data", content=SFT_LINE * 4).json()["url"]

    def run() -> None:
        body = {"model_id": model, "training_data_url": url, "config": {"batch_size": 2}}
        job = crash.http.post("/v1/preview/sft-training-jobs", json=body)
        assert job.status_code == 200, job.text
        crash.wait_for_job(job.json()["id"])

    return "kept", run


def fork(crash: Crash, cycle: int) -> tuple[str, Callable[[], None]]:
    crash.register("kept")
    name = f"fork-{cycle}"
    model = crash.register(name)

    def run() -> None:
        forked = crash.http.post(f"{MODELS}/{model}/fork", json={"from_model": "kept"})
        assert forked.status_code == 200, forked.text

    return name, run


def delete(crash: Crash, cycle: int) -> tuple[str, Callable[[], None]]:
    name = f"doomed-{cycle}"
    model = crash.register(name)
    body = {"metrics": {"x": 1}, "trajectory_groups": [GROUP]}
    assert crash.http.post(f"{MODELS}/{model}/log", json=body).status_code == 200

    def run() -> None:
        assert crash.http.delete(f"{MODELS}/{model}").status_code == 200

    return name, run


CALLS = {"log": log, "train": train, "sft": sft, "fork": fork, "delete": delete}


# --- what a model is on disk --------------------------------------------------------------


def snapshot(directory: Path) -> dict[str, Any] | None:
    """The model in `directory` as the checks compare it; None where it does not exist.
    Fails where a file does not parse or load."""
    if not directory.exists():
        return None
    model = json.loads((directory / "model.json").read_text())
    history = directory / "history.jsonl"
    rows = (
        [json.loads(line) for line in history.read_text().splitlines()] if history.exists() else []
    )
    steps = {}
    for checkpoint in sorted((directory / "checkpoints").glob("[0-9]*")):
        json.loads((checkpoint / "adapter_config.json").read_text())
        weights = load_file(str(checkpoint / "adapter_model.safetensors"))
        if (checkpoint / "optimizer.pt").exists():
            torch.load(checkpoint / "optimizer.pt", weights_only=True)
        steps[int(checkpoint.name)] = (checkpoint / "adapter_model.safetensors").read_bytes()
        assert weights
    return {"model": model, "rows": rows, "steps": steps}


def before_or_after(
    call: str,
    before: dict[str, Any] | None,
    now: dict[str, Any] | None,
    after_source: dict[str, Any] | None,
) -> str:
    """'before', 'after', or what is wrong."""
    if call == "delete":
        if now is None:
            return "after"
        return (
            "before"
            if now["steps"] == before["steps"] and now["rows"] == before["rows"]
            else (f"half deleted: {sorted(now['steps'])} of {sorted(before['steps'])}")
        )
    assert before is not None
    if now is None:
        return "the model is gone"
    if now["model"] != before["model"]:
        return "model.json changed"
    if call == "log":
        grown = len(now["rows"]) - len(before["rows"])
        return {0: "before", 1: "after"}.get(grown, f"{grown} history rows were added")
    if call in ("train", "sft"):
        added = sorted(set(now["steps"]) - set(before["steps"]))
        latest = max(before["steps"], default=0)
        if not added:
            return "before"
        return "after" if added == [latest + 1] else f"steps {added} appeared after {latest}"
    if call == "fork":
        added = sorted(set(now["steps"]) - set(before["steps"]))
        if not added:
            return "before"
        assert after_source is not None
        latest = max(after_source["steps"])
        if added != [latest] or now["steps"][latest] != after_source["steps"][latest]:
            return f"forked steps {added} are not the source's step {latest}"
        return "after"
    raise AssertionError(call)


@pytest.mark.sampling  # the kill points are drawn with the run's seed
def test_a_server_killed_mid_call_keeps_every_model_as_before_or_after_it(
    tmp_path: Path, random_model_dir: Path, test_seed: int
) -> None:
    crash = Crash(tmp_path / ".art", random_model_dir)
    rng = random.Random(test_seed)
    outcomes: list[tuple[str, float, str]] = []
    try:
        # Each call's duration, unkilled: the kill points are drawn from it.
        durations = {}
        for index, (call, make) in enumerate(CALLS.items()):
            name, run = make(crash, -1 - index)
            start = time.monotonic()
            run()
            durations[call] = time.monotonic() - start

        for cycle in range(KILLS):
            call = list(CALLS)[cycle % len(CALLS)]
            name, run = CALLS[call](crash, cycle)
            before = snapshot(crash.model_dir(name))
            delay = rng.uniform(0, 1.2 * durations[call])
            thread = threading.Thread(target=_ignoring_errors(run), daemon=True)
            thread.start()
            time.sleep(delay)
            crash.server.stop(signal.SIGKILL)
            thread.join(timeout=30)
            crash.restart()
            now = snapshot(crash.model_dir(name))
            source = snapshot(crash.model_dir("kept"))
            verdict = before_or_after(call, before, now, source)
            outcomes.append((call, round(delay, 3), verdict))
            # The server answers for the model as it is on disk.
            listed = crash.http.get(f"{MODELS}/{PROJECT}~{name}/checkpoints")
            assert listed.status_code == (404 if now is None else 200), listed.text
        for model_dir in (tmp_path / ".art" / PROJECT / "models").iterdir():
            if not model_dir.name.startswith("."):
                snapshot(model_dir)  # every model left parses and loads
    finally:
        crash.http.close()
        crash.server.stop()
    wrong = [outcome for outcome in outcomes if outcome[2] not in ("before", "after")]
    assert wrong == [], outcomes
    # Where the kills landed (which side of each call's effect) depends on this CPU's
    # timing, so it is reported, not asserted.
    print("kills (call, seconds in, model found):", outcomes)


def _ignoring_errors(run: Callable[[], None]) -> Callable[[], None]:
    """The call, in a thread the kill cuts off: its connection error is the expected end."""

    def call() -> None:
        with contextlib.suppress(httpx.HTTPError, AssertionError):
            run()

    return call
