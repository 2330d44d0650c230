"""Training jobs: one step run in a worker thread, reported as a numbered event feed.

A job's events are those of the W&B Training API: `training_started`
(`num_sequences`; an SFT job's number of batches, as ART's client reads it), one
`gradient_step` per optimizer step (its metrics, all numbers), then
`training_ended` (our extension: the new `step`) or `training_failed`
(`error_message`; our extension: the `art` error's type, field, problem and fix). Each
event has an id counting from "1", so a client that lost its connection asks for the
events `after` the last one it saw and misses nothing.

Each job is journaled, one JSON line per event, under `<path>/.art-serve/jobs/`, so a
restarted server still answers for its jobs: one that was cut off by the restart is
reported as failed, and its model's step is its latest checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ..core.data.errors import ArtValueError, TrainingError

logger = logging.getLogger("art.serve")

EventType = Literal["training_started", "gradient_step", "training_ended", "training_failed"]
_FINAL = ("training_ended", "training_failed")


class TrainingJob:
    """One training step of one model, and the events it has produced so far."""

    def __init__(
        self, model_id: str, num_sequences: int, journal_dir: Path, id: str | None = None
    ) -> None:
        self.id = id or f"job-{uuid.uuid4().hex}"
        self.model_id = model_id
        self.num_sequences = num_sequences
        self._events: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._journal = journal_dir / f"{self.id}.jsonl"
        if id is None:
            self._append({"model_id": model_id, "num_sequences": num_sequences})

    @classmethod
    def restore(cls, journal: Path) -> TrainingJob:
        """A job from its journal; one the server stopped during is marked failed."""
        lines = journal.read_text(encoding="utf-8").splitlines()
        header = json.loads(lines[0])
        job = cls(header["model_id"], header["num_sequences"], journal.parent, journal.stem)
        for line in lines[1:]:
            try:
                job._events.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the server died while writing this line
        if not job._ended():
            job.emit(
                "training_failed",
                {
                    "error_type": "ServerRestarted",
                    "error_message": "art serve stopped during this job; the model's step is "
                    "its latest checkpoint: train again from there",
                },
            )
        return job

    def forget(self) -> None:
        """Remove the journal (the job's model was deleted)."""
        self._journal.unlink(missing_ok=True)

    def _append(self, record: dict[str, Any]) -> None:
        self._journal.parent.mkdir(parents=True, exist_ok=True)
        with self._journal.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
            file.flush()
            os.fsync(file.fileno())

    @property
    def status(self) -> str:
        with self._changed:
            if not self._events:
                return "queued"
            last = self._events[-1]["type"]
        return {"training_ended": "succeeded", "training_failed": "failed"}.get(last, "running")

    @property
    def finished(self) -> bool:
        return self.status in ("succeeded", "failed")

    def emit(self, type: EventType, data: dict[str, Any]) -> None:
        with self._changed:
            event = {"id": str(len(self._events) + 1), "type": type, "data": data}
            self._append(event)
            self._events.append(event)
            self._changed.notify_all()

    def events_after(
        self, after: int, limit: int, timeout: float
    ) -> tuple[list[dict[str, Any]], bool]:
        """Events with id > `after` (waiting up to `timeout` s for one), and whether more follow."""
        with self._changed:
            self._changed.wait_for(
                lambda: len(self._events) > after or self._ended(), timeout=timeout
            )
            return self._events[after : after + limit], len(self._events) > after + limit

    def _ended(self) -> bool:
        return bool(self._events) and self._events[-1]["type"] in _FINAL

    def run(self, step: Callable[[], tuple[int, list[dict[str, float]]]]) -> None:
        """Run `step` (returning the new step and each optimizer step's metrics: one for
        an RL job, one per batch for SFT), emitting the job's events."""
        self.emit("training_started", {"num_sequences": self.num_sequences})
        logger.info(
            "training job %s of model %s started (%d sequences)",
            self.id,
            self.model_id,
            self.num_sequences,
        )
        try:
            new_step, metrics = step()
        except BaseException as error:  # reported to the client, which raises it
            self.emit("training_failed", error_data(error))
            logger.warning(
                "training job %s of model %s failed: %s: %s",
                self.id,
                self.model_id,
                type(error).__name__,
                error,
            )
            return
        for row in metrics:
            self.emit("gradient_step", {k: float(v) for k, v in row.items()})
        self.emit("training_ended", {"step": new_step})
        logger.info(
            "training job %s of model %s finished: step %d", self.id, self.model_id, new_step
        )

    def start(self, step: Callable[[], tuple[int, list[dict[str, float]]]]) -> None:
        threading.Thread(target=self.run, args=(step,), name=self.id, daemon=True).start()


def error_data(error: BaseException) -> dict[str, Any]:
    """An error as JSON the client can raise again as the same `art` error."""
    data: dict[str, Any] = {"error_type": type(error).__name__, "error_message": str(error)}
    if isinstance(error, ArtValueError):
        data.update(field=error.field, problem=error.problem, fix=error.fix)
    if isinstance(error, TrainingError):
        data["step"] = error.step
    return data
