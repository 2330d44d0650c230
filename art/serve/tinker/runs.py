"""What `art serve` holds for Tinker's API: sessions, training runs, samplers, futures.

A training run (a Tinker training client) is an art model `project/name` whose name is
derived from its run id (`<session>:train:<n>`, the id the SDK expects), so the W&B
Training API and the OpenAI endpoint see its checkpoints as `project/name@step`. Its
saves are checkpoints; their Tinker names (`weights/<name>`, `sampler_weights/<name>`)
are kept beside the model (`tinker.json`), and the run ids in
`<path>/.art-serve/tinker-runs.json`, so `tinker://` paths outlive the server.
Sessions and futures live in memory: a restart ends them, as a lost connection would.

Each run's calls execute one after another in the order they arrived (the SDK submits
them in `seq_id` order), each in a worker thread; the SDK polls `retrieve_future` for
their results.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...core.store.atomic import write_text_atomic
from ...runtime.endpoint.server import ApiError
from ..access import Principal

RUNS_FILE = "tinker-runs.json"
_TYPES = ("weights", "sampler_weights")
_FUTURES_KEPT = 4096  # finished results kept for retrieval; the oldest go first


@dataclass
class Session:
    id: str
    key_id: str
    project: str
    user_metadata: dict[str, str]
    display_name: str | None = None
    runs: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=list)
    model_seq: int = 0
    sampler_seq: int = 0
    heartbeat: float = field(default_factory=time.time)
    finished: str | None = None  # the client's reason, once it closed the session


@dataclass(frozen=True)
class Run:
    """A training run: its Tinker id and the art model that holds it."""

    id: str
    project: str
    name: str
    base_model: str
    rank: int
    targets: tuple[str, ...]  # the LoRA's modules (Tinker's train_attn, train_mlp, train_unembed)
    user_metadata: dict[str, str] = field(default_factory=dict)

    def path(self, kind: str, name: str) -> str:
        return f"tinker://{self.id}/{kind}/{name}"


@dataclass(frozen=True)
class Sampler:
    """A sampling session: a run's checkpoint, or a loaded base model alone (`run` None)."""

    id: str
    project: str
    base_model: str
    run: Run | None
    step: int | None
    model_path: str | None


@dataclass
class Pending:
    key_id: str
    future: asyncio.Future[Any]
    proto: bool  # its result is protobuf bytes


def holds(key_id: str, principal: Principal) -> bool:
    """Whether `principal` may see what the key `key_id` made (its own, or the admin)."""
    return principal.admin or key_id == principal.key_id


def refuse_finished(session: Session) -> None:
    if session.finished is not None:
        raise ApiError(
            400,
            f"session_id: session {session.id} was finished ({session.finished}); "
            "start a new ServiceClient",
            param="session_id",
        )


def art_name(run_id: str) -> str:
    """The art model name of run `<session>:train:<n>` (names hold no colons)."""
    return run_id.replace(":", "-")


def parse_path(path: str, param: str = "path") -> tuple[str, str, str]:
    """(run id, kind, name) of `tinker://<run>/<weights|sampler_weights>/<name>`."""
    rest = path.removeprefix("tinker://")
    parts = rest.split("/")
    if rest == path or len(parts) != 3 or parts[1] not in _TYPES or not all(parts):
        raise ApiError(
            400,
            f"{param}: {path!r} is not a checkpoint path of this server "
            "(tinker://<run>/weights/<name> or tinker://<run>/sampler_weights/<name>)",
            param=param,
        )
    return parts[0], parts[1], parts[2]


class TinkerRuns:
    """Sessions, runs, samplers and futures of one `art serve` process."""

    def __init__(self, path: str) -> None:
        self.root = Path(path)
        self._file = self.root / ".art-serve" / RUNS_FILE
        self._lock = threading.Lock()
        self.sessions: dict[str, Session] = {}
        self.samplers: dict[str, Sampler] = {}
        self.futures: dict[str, Pending] = {}
        self._runs: dict[str, Run] = {}
        self._chains: dict[str, asyncio.Future[Any]] = {}  # run id -> its last call
        self._seen: dict[tuple[str, int], str] = {}  # (client, seq_id) -> request id
        if self._file.exists():
            for record in json.loads(self._file.read_text(encoding="utf-8")):
                self._runs[record["id"]] = Run(**{**record, "targets": tuple(record["targets"])})

    # --- sessions --------------------------------------------------------------------------

    def new_session(
        self,
        principal: Principal,
        project: str,
        metadata: dict[str, str],
        display_name: str | None,
    ) -> Session:
        session = Session(
            f"s{secrets.token_hex(8)}", principal.key_id, project, metadata, display_name
        )
        self.sessions[session.id] = session
        return session

    def session(self, session_id: str, principal: Principal) -> Session:
        session = self.sessions.get(session_id)
        if session is None or not holds(session.key_id, principal):
            raise ApiError(404, f"session_id: no session {session_id!r}", param="session_id")
        return session

    def open_session(self, session_id: str, principal: Principal) -> Session:
        """The session, refused once its client finished it (the SDK's `close`)."""
        session = self.session(session_id, principal)
        refuse_finished(session)
        return session

    def refuse_finished_run(self, run: Run) -> None:
        """Refuse a call on a run whose session was finished (a run whose session ended
        with a restart of the server is open to any later session)."""
        session = self.sessions.get(run.id.partition(":")[0])
        if session is not None:
            refuse_finished(session)

    # --- runs ------------------------------------------------------------------------------

    def add_run(self, run: Run) -> None:
        with self._lock:
            self._runs[run.id] = run
            records = [vars(r) for r in self._runs.values()]
            write_text_atomic(self._file, json.dumps(records, indent=1))

    def run(self, run_id: str, principal: Principal, param: str = "model_id") -> Run:
        """The run, if the key may use its project; 404 alike for unknown and foreign runs,
        so a key learns nothing of other projects."""
        run = self._runs.get(run_id)
        if run is None or not principal.allows(run.project, run.name):
            raise ApiError(404, f"{param}: no training run {run_id!r}", param=param)
        return run

    def runs(self, principal: Principal) -> list[Run]:
        return [r for r in self._runs.values() if principal.allows(r.project, r.name)]

    def forget_run(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
            write_text_atomic(self._file, json.dumps([vars(r) for r in self._runs.values()]))

    # --- checkpoint names ------------------------------------------------------------------

    def _names_file(self, run: Run) -> Path:
        return self.root / run.project / "models" / run.name / "tinker.json"

    def checkpoint_names(self, run: Run) -> dict[str, dict[str, Any]]:
        """`<kind>/<name>` -> {"step", "time"} of the run's saves."""
        file = self._names_file(run)
        if not file.exists():
            return {}
        loaded: dict[str, dict[str, Any]] = json.loads(file.read_text(encoding="utf-8"))
        return loaded

    def name_checkpoint(
        self, run: Run, kind: str, name: str, step: int, metadata: dict[str, str]
    ) -> None:
        with self._lock:
            names = self.checkpoint_names(run)
            names[f"{kind}/{name}"] = {
                "step": step,
                "time": datetime.now(UTC).isoformat(),
                "user_metadata": metadata,
            }
            write_text_atomic(self._names_file(run), json.dumps(names, indent=1))

    def forget_checkpoint(self, run: Run, checkpoint_id: str) -> int | None:
        with self._lock:
            names = self.checkpoint_names(run)
            entry = names.pop(checkpoint_id, None)
            write_text_atomic(self._names_file(run), json.dumps(names, indent=1))
        return None if entry is None else int(entry["step"])

    def step_of(self, path: str, principal: Principal, param: str = "path") -> tuple[Run, int]:
        """The run and checkpoint step a `tinker://` path names."""
        run_id, kind, name = parse_path(path, param)
        run = self.run(run_id, principal, param)
        entry = self.checkpoint_names(run).get(f"{kind}/{name}")
        if entry is None:
            raise ApiError(
                404, f"{param}: run {run_id} has no checkpoint {kind}/{name}", param=param
            )
        return run, int(entry["step"])

    # --- futures ---------------------------------------------------------------------------

    def submit(
        self,
        principal: Principal,
        work: Callable[[], Awaitable[Any]],
        *,
        proto: bool,
        after: str | None = None,
        seq: tuple[str, int] | None = None,
    ) -> str:
        """Start `work` (after the run `after`'s earlier calls); its future's request id.

        `seq` is the SDK's (client, seq_id) of the call: the same call submitted again (a
        retry whose first try did arrive) gets the first one's request id, not a second run.
        """
        if seq is not None and seq in self._seen:
            return self._seen[seq]
        loop = asyncio.get_running_loop()
        previous = self._chains.get(after) if after else None

        async def ordered() -> Any:
            if previous is not None:
                await asyncio.wait([previous])  # its failure is its own future's
            return await work()

        task = loop.create_task(ordered())
        if after:
            self._chains[after] = task
        request_id = f"r{secrets.token_hex(10)}"
        self.futures[request_id] = Pending(principal.key_id, task, proto)
        if seq is not None:
            self._seen[seq] = request_id
        while len(self.futures) > _FUTURES_KEPT:
            oldest = next(iter(self.futures))
            if not self.futures[oldest].future.done():
                break
            del self.futures[oldest]
        while len(self._seen) > _FUTURES_KEPT:
            del self._seen[next(iter(self._seen))]
        return request_id

    def pending(self, request_id: str, principal: Principal) -> Pending:
        pending = self.futures.get(request_id)
        if pending is None or not holds(pending.key_id, principal):
            raise ApiError(404, f"request_id: no request {request_id!r}", param="request_id")
        return pending


__all__ = [
    "Pending",
    "Run",
    "Sampler",
    "Session",
    "TinkerRuns",
    "art_name",
    "holds",
    "parse_path",
]
