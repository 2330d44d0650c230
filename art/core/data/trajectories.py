"""The trajectory model: what one rollout did, and how well.

A `Trajectory` is plain data. Its `messages_and_choices` mixes message dicts (context
the model was given) with OpenAI `Choice` objects (what the model sampled, with token
ids and logprobs); only the choices are trained on. A `TrajectoryGroup` holds the
rollouts of one scenario, which GRPO compares with each other, and records the
rollouts that raised as data rather than losing them.
"""

from __future__ import annotations

import math
import numbers
import time
import traceback
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
)
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from . import observe, rollouts, scope_stack
from .errors import TrajectoryValidationError
from .exchanges import TrajectoryExchanges
from .history import History, MessageOrChoiceField, ToolField, messages_of
from .types import Messages, MetadataValue, MetricValue


def check_reward(value: object, where: str) -> float:
    """Return `value` as a finite float, or raise naming `where`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TrajectoryValidationError(
            where,
            f"must be a number, got {type(value).__name__} {value!r}",
            "Set it to a float, e.g. `float(score)` or `tensor.item()`",
        )
    reward = float(value)
    if not math.isfinite(reward):
        raise TrajectoryValidationError(
            where,
            f"must be finite, got {reward}",
            "Check the reward function for a division by zero or an empty mean",
        )
    return reward


def check_metric(value: object, where: str) -> MetricValue:
    if isinstance(value, bool):
        return value
    if not isinstance(value, numbers.Real):
        raise TrajectoryValidationError(
            where,
            f"a metric must be a number or bool, got {type(value).__name__}",
            "Put text in `metadata` or `logs` instead",
        )
    number = value if isinstance(value, int) else float(value)
    if not math.isfinite(number):
        raise TrajectoryValidationError(
            where, f"must be finite, got {number}", "Leave the metric out when it is undefined"
        )
    return number


def check_metadata_value(value: object, where: str) -> MetadataValue:
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, numbers.Real):
        return float(value)
    raise TrajectoryValidationError(
        where,
        f"a {type(value).__name__} cannot be stored as metadata",
        "Metadata values must be str, int, float, bool or None; "
        "store structured data as `json.dumps(value)`",
    )


def check_str_keys(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise TrajectoryValidationError(
            where, f"expected a dict, got {type(value).__name__}", "Pass a dict of str keys"
        )
    for key in value:
        if not isinstance(key, str):
            raise TrajectoryValidationError(
                f"{where}[{key!r}]", "keys must be strings", "Use str keys"
            )
    return value


def check_one_shape(trajectory: Trajectory, where: str) -> None:
    """Refuse a trajectory holding captured `exchanges` beside the hand-built fields."""
    if not trajectory.exchanges:
        return
    held = [
        name
        for name, present in (
            ("messages_and_choices", bool(trajectory.messages_and_choices)),
            ("tools", trajectory.tools is not None),
            ("additional_histories", bool(trajectory.additional_histories)),
        )
        if present
    ]
    if held:
        raise TrajectoryValidationError(
            f"{where}.{held[0]}",
            "a trajectory holding captured exchanges cannot also hold "
            "messages_and_choices, tools or additional_histories (as in ART)",
            f"Leave {held[0]} empty in a captured trajectory, or build the trajectory "
            "by hand without exchanges",
        )


def _refuse_reconcile(reconcile: bool) -> None:
    if reconcile:
        raise TrajectoryValidationError(
            "reconcile_text_equivalent_tokenizations",
            "merging conversations whose served token ids differ but whose text agrees "
            "is not built",
            "Leave it False: conversations are grouped by their exact token ids",
        )


class Trajectory(BaseModel):
    """One rollout: the conversation, the tools the model had, its reward and metrics.

    Either built by hand (`messages_and_choices`, `tools`, `additional_histories`, ART
    0.5.18's shape) or captured (`exchanges`: `with art.Trajectory() as t:` records the
    model calls made inside it, ART 0.5.23's shape); never both.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    exchanges: TrajectoryExchanges = Field(
        default_factory=TrajectoryExchanges, exclude_if=lambda value: not value
    )
    messages_and_choices: list[MessageOrChoiceField] = Field(default_factory=list)
    tools: list[ToolField] | None = None
    additional_histories: list[History] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, MetricValue] = Field(default_factory=dict)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    # ART's names. The checkpoint step of the policy that sampled this rollout's first and
    # last turns; PipelineTrainer fills them (from each choice's `policy_version`, which
    # the LocalBackend endpoint reports) and drops groups sampled too many steps ago.
    initial_policy_version: int | None = None
    final_policy_version: int | None = None

    _started_at: float = PrivateAttr(default_factory=time.monotonic)

    def model_post_init(self, context: Any, /) -> None:
        # Made inside a traced rollout (`@weave.op`): keep the trace's ids with the
        # trajectory, so the step's Parquet log links each rollout to its trace.
        for key, value in observe.trace_links().items():
            self.metadata.setdefault(key, value)

    @field_validator("reward", mode="before")
    @classmethod
    def _check_reward(cls, value: object) -> float:
        return check_reward(value, "reward")

    @model_validator(mode="after")
    def _check_one_shape(self) -> Trajectory:
        check_one_shape(self, "trajectory")
        return self

    @field_validator("metrics", mode="before")
    @classmethod
    def _check_metrics(cls, value: object) -> dict[str, MetricValue]:
        items = check_str_keys(value, "metrics")
        return {key: check_metric(v, f"metrics[{key!r}]") for key, v in items.items()}

    @field_validator("metadata", mode="before")
    @classmethod
    def _check_metadata(cls, value: object) -> dict[str, MetadataValue]:
        items = check_str_keys(value, "metadata")
        return {key: check_metadata_value(v, f"metadata[{key!r}]") for key, v in items.items()}

    def __eq__(self, other: object) -> bool:
        # Fields only: the private start time says when an object was made, not what it holds.
        return isinstance(other, Trajectory) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return (
            f"Trajectory(reward={self.reward}, messages={len(self.messages_and_choices)}, "
            f"metrics={self.metrics})"
        )

    def messages(self) -> Messages:
        """The conversation as plain messages, each `Choice` as its assistant message.

        Of a captured trajectory (`exchanges`): its main conversation's.
        """
        if self.exchanges:
            return self.histories()[0].messages()
        return messages_of(self.messages_and_choices)

    def histories(
        self, *, model: str | None = None, reconcile_text_equivalent_tokenizations: bool = False
    ) -> list[History]:
        """Every conversation of this trajectory, the main one first (ART 0.5.23's name).

        Captured exchanges are grouped as `art.core.data.exchange_histories` says (`model`, a
        name or shell pattern, selects whose); a trajectory built by hand gives its
        `messages_and_choices`, then its `additional_histories`. Each is a `History`.
        """
        from .exchange_histories import histories_of

        _refuse_reconcile(reconcile_text_equivalent_tokenizations)
        return histories_of(self, model=model)

    def history(
        self, *, model: str | None = None, reconcile_text_equivalent_tokenizations: bool = False
    ) -> History:
        """The trajectory's one conversation; an error names how many it has otherwise."""
        found = self.histories(
            model=model,
            reconcile_text_equivalent_tokenizations=reconcile_text_equivalent_tokenizations,
        )
        if len(found) != 1:
            raise TrajectoryValidationError(
                "history",
                f"the trajectory has {len(found)} conversations, not one",
                "Call histories() for all of them (the main one first)",
            )
        return found[0]

    def __enter__(self) -> Trajectory:
        """Capture the model calls made inside the block into `exchanges` (ART 0.5.23's)."""
        return scope_stack.enter(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        exc_traceback: TracebackType | None,
    ) -> None:
        """Close the scope (the innermost one) and `finish()` the trajectory."""
        scope_stack.exit(self)

    def log(self, message: str) -> None:
        """Keep a line of text with this trajectory (stored with it, shown in reports)."""
        self.logs.append(message)

    def finish(self) -> Trajectory:
        """Record the seconds since this trajectory was created as `metrics['duration']`."""
        self.metrics["duration"] = time.monotonic() - self._started_at
        return self

    @asynccontextmanager
    async def track_duration(self, name: str) -> AsyncIterator[None]:
        """Add the seconds spent inside the block to `metrics[f'{name}_duration']`."""
        started = time.monotonic()
        try:
            yield
        finally:
            key = f"{name}_duration"
            self.metrics[key] = float(self.metrics.get(key, 0.0)) + time.monotonic() - started


class PydanticException(BaseModel):
    """An exception a rollout raised, kept as data. (ART's name for it.)"""

    type: str
    message: str
    traceback: str

    @classmethod
    def from_exception(cls, error: BaseException) -> PydanticException:
        return cls(
            type=f"{type(error).__module__}.{type(error).__qualname__}",
            message=str(error),
            traceback="".join(traceback.format_exception(error)),
        )


class TrajectoryGroup(BaseModel):
    """The rollouts of one scenario, compared with each other by GRPO.

    Built from finished trajectories (and exceptions), it is a group at once. Built from
    awaitables, such as calls of an async rollout function, it is an awaitable group
    that `gather_trajectory_groups` runs; a rollout that raises is recorded in
    `exceptions`. `metrics` are the group's own numbers (logged as `group_<name>`, the
    mean over the groups with trajectories, as ART does); `logs` are its lines of text.
    """

    model_config = ConfigDict(extra="forbid")

    trajectories: list[Trajectory] = Field(default_factory=list)
    exceptions: list[PydanticException] = Field(default_factory=list)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    metrics: dict[str, MetricValue] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)

    # Python calls __init__ again on what __new__ returns, with the caller's (by then
    # exhausted) iterable; this flag makes that second call a no-op.
    _built: bool = PrivateAttr(default=False)

    @overload
    def __new__(
        cls,
        trajectories: Iterable[Trajectory | BaseException] = ...,
        *,
        exceptions: Iterable[BaseException | PydanticException] = ...,
        metadata: Mapping[str, MetadataValue] | None = ...,
        metrics: Mapping[str, MetricValue] | None = ...,
        logs: Iterable[str] | None = ...,
    ) -> TrajectoryGroup: ...

    @overload
    def __new__(  # type: ignore[misc]  # awaitable until gathered, then a group
        cls,
        trajectories: Iterable[Awaitable[Trajectory]],
        *,
        exceptions: Iterable[BaseException | PydanticException] = ...,
        metadata: Mapping[str, MetadataValue] | None = ...,
        metrics: Mapping[str, MetricValue] | None = ...,
        logs: Iterable[str] | None = ...,
    ) -> PendingTrajectoryGroup: ...

    def __new__(  # type: ignore[misc]
        cls,
        trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]] = (),
        *,
        exceptions: Iterable[BaseException | PydanticException] = (),
        metadata: Mapping[str, MetadataValue] | None = None,
        metrics: Mapping[str, MetricValue] | None = None,
        logs: Iterable[str] | None = None,
    ) -> TrajectoryGroup | PendingTrajectoryGroup:
        items = list(trajectories)
        extra_exceptions = list(exceptions)
        if any(_is_awaitable(item) for item in items):
            return PendingTrajectoryGroup(
                items,
                extra_exceptions,
                dict(metadata or {}),
                metrics=_checked_metrics(metrics),
                logs=_checked_logs(logs),
            )
        group = super().__new__(cls)
        group._build(items, extra_exceptions, metadata, metrics, logs)
        return group

    def __init__(
        self,
        trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]] = (),
        *,
        exceptions: Iterable[BaseException | PydanticException] = (),
        metadata: Mapping[str, MetadataValue] | None = None,
        metrics: Mapping[str, MetricValue] | None = None,
        logs: Iterable[str] | None = None,
    ) -> None:
        if getattr(self, "__pydantic_private__", None) and self._built:
            return
        self._build(list(trajectories), list(exceptions), metadata, metrics, logs)

    def _build(
        self,
        items: list[Any],
        exceptions: list[BaseException | PydanticException],
        metadata: Mapping[str, MetadataValue] | None,
        metrics: Mapping[str, MetricValue] | None = None,
        logs: Iterable[str] | None = None,
    ) -> None:
        trajectories: list[Trajectory] = []
        records: list[PydanticException] = []
        for index, item in enumerate(items):
            if isinstance(item, Trajectory):
                trajectories.append(item)
            elif isinstance(item, Mapping):  # read back from JSON (pydantic calls cls(**data))
                trajectories.append(Trajectory.model_validate(item))
            elif isinstance(item, BaseException):
                records.append(PydanticException.from_exception(item))
            else:
                raise TrajectoryValidationError(
                    f"trajectories[{index}]",
                    f"expected a Trajectory, got {type(item).__name__}",
                    "Make the rollout function return an `art.Trajectory`",
                )
        for error in exceptions:
            if isinstance(error, Mapping):
                records.append(PydanticException.model_validate(error))
            elif isinstance(error, PydanticException):
                records.append(error)
            else:
                records.append(PydanticException.from_exception(error))
        checked_metadata = {
            key: check_metadata_value(value, f"metadata[{key!r}]")
            for key, value in check_str_keys(metadata or {}, "metadata").items()
        }
        BaseModel.__init__(
            self,
            trajectories=trajectories,
            exceptions=records,
            metadata=checked_metadata,
            metrics=_checked_metrics(metrics),
            logs=_checked_logs(logs),
        )
        self._built = True

    @field_validator("metrics", mode="before")
    @classmethod
    def _check_metrics(cls, value: object) -> dict[str, MetricValue]:
        return _checked_metrics(value)  # type: ignore[arg-type]

    def log(self, message: str) -> None:
        """Keep a line of text with this group (stored with it in the step's Parquet file)."""
        self.logs.append(message)

    def __copy__(self) -> TrajectoryGroup:
        """A new group with new lists and dicts holding the same trajectories (as ART's)."""
        copied = super().__copy__()
        for name, value in copied.__dict__.items():
            if isinstance(value, list | dict):
                copied.__dict__[name] = value.copy()
        return copied

    def __iter__(self) -> Iterator[Trajectory]:  # type: ignore[override]
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    def __str__(self) -> str:
        return f"TrajectoryGroup({len(self.trajectories)} trajectories, {len(self.exceptions)} exceptions)"


def _is_awaitable(item: object) -> bool:
    return hasattr(item, "__await__")


def _checked_metrics(value: Mapping[str, MetricValue] | None) -> dict[str, MetricValue]:
    items = check_str_keys(value if value is not None else {}, "metrics")
    return {key: check_metric(v, f"metrics[{key!r}]") for key, v in items.items()}


def _checked_logs(value: Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str | bytes):
        raise TrajectoryValidationError(
            "logs", "expected a list of str, got one string", "Pass `logs=[line]`"
        )
    lines = list(value)
    for index, line in enumerate(lines):
        if not isinstance(line, str):
            raise TrajectoryValidationError(
                f"logs[{index}]",
                f"expected a str, got {type(line).__name__}",
                "Put numbers in `metrics`, other data in `metadata`",
            )
    return lines


class PendingTrajectoryGroup:
    """A group whose rollouts have not run yet; awaiting it runs them concurrently (the
    first that raises an Exception is kept in the group's `exceptions`; a gather running
    it is told of each, see `art.core.data.rollouts`)."""

    def __init__(
        self,
        items: list[Any],
        exceptions: list[BaseException | PydanticException],
        metadata: dict[str, MetadataValue],
        *,
        metrics: dict[str, MetricValue] | None = None,
        logs: list[str] | None = None,
    ) -> None:
        self.items = items
        self.exceptions = exceptions
        self.metadata = metadata
        self.metrics = metrics or {}
        self.logs = logs or []

    def __len__(self) -> int:
        return len(self.items)

    def __await__(self) -> Generator[Any, None, TrajectoryGroup]:
        return self._run().__await__()

    async def _run(self) -> TrajectoryGroup:
        """Await every rollout; failures become the group's `exceptions`."""
        listener = rollouts.listener()
        outcomes: list[Trajectory | BaseException | None] = [None] * len(self.items)

        async def run_one(index: int, rollout: Awaitable[Any]) -> None:
            try:
                result = await rollouts.observed(rollout)
                if not isinstance(result, Trajectory):
                    raise TrajectoryValidationError(
                        "rollout result",
                        f"expected an art.Trajectory, got {type(result).__name__}",
                        "Make the rollout function return the Trajectory it built",
                    )
            except Exception as error:
                outcomes[index] = error
                if listener is not None:
                    listener.add_exception(error)
                return
            outcomes[index] = result
            if listener is not None:
                listener.add_trajectory(result)

        await rollouts.run_all([run_one(i, item) for i, item in enumerate(self.items)])
        return TrajectoryGroup(
            [outcome for outcome in outcomes if outcome is not None],
            exceptions=self.exceptions,
            metadata=self.metadata,
            metrics=self.metrics,
            logs=self.logs,
        )

    def close(self) -> None:
        """Close rollouts that will never be awaited, so Python does not warn about them."""
        for item in self.items:
            close = getattr(item, "close", None)
            if callable(close):
                close()


__all__ = [
    "History",
    "MetadataValue",
    "MetricValue",
    "PendingTrajectoryGroup",
    "PydanticException",
    "Trajectory",
    "TrajectoryGroup",
    "messages_of",
]
