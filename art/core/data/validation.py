"""Checks run on trajectory groups right before they are logged or trained.

Pydantic validates a trajectory when it is built and when a field is assigned, but
not when a list inside it is mutated (`trajectory.messages_and_choices.append(...)`),
so everything is checked again here, with the full path of any bad value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from openai.types.chat.chat_completion import Choice

from .errors import TrajectoryValidationError
from .exchange_histories import has_sampled_tokens, histories_of, note_untrained
from .history import check_message_or_choice, check_tool
from .trajectories import (
    History,
    Trajectory,
    TrajectoryGroup,
    check_metadata_value,
    check_metric,
    check_one_shape,
    check_reward,
)


def _check_history(history: History | Trajectory, where: str) -> None:
    for index, item in enumerate(history.messages_and_choices):
        check_message_or_choice(item, f"{where}.messages_and_choices[{index}]")
    for index, tool in enumerate(history.tools or []):
        check_tool(tool, f"{where}.tools[{index}]")


def check_trajectory(trajectory: Trajectory, where: str) -> None:
    """Raise `TrajectoryValidationError` naming the first bad value in `trajectory`."""
    check_one_shape(trajectory, where)  # exchanges are appended without validation
    if trajectory.exchanges:
        try:
            histories_of(trajectory)  # what logging, display and training read
        except ValueError as error:
            raise TrajectoryValidationError(
                f"{where}.exchanges",
                f"the captured requests cannot be read as conversations ({error})",
                "Send each request in its protocol's documented shape",
            ) from error
    _check_history(trajectory, where)
    for index, history in enumerate(trajectory.additional_histories):
        _check_history(history, f"{where}.additional_histories[{index}]")
    check_reward(trajectory.reward, f"{where}.reward")
    for key, metric in trajectory.metrics.items():
        check_metric(metric, f"{where}.metrics[{key!r}]")
    for key, value in trajectory.metadata.items():
        check_metadata_value(value, f"{where}.metadata[{key!r}]")


def coerce_groups(
    items: Iterable[TrajectoryGroup | Trajectory | BaseException], where: str
) -> list[TrajectoryGroup]:
    """Accept groups, or loose trajectories (which become one group), and check them all."""
    items = list(items)
    if not items:
        raise TrajectoryValidationError(
            where, "no trajectory groups given", "Pass the groups from `gather_trajectory_groups`"
        )
    if all(isinstance(item, TrajectoryGroup) for item in items):
        groups = [item for item in items if isinstance(item, TrajectoryGroup)]
    elif all(isinstance(item, Trajectory | BaseException) for item in items):
        groups = [TrajectoryGroup(item for item in items if not isinstance(item, TrajectoryGroup))]
    else:
        kinds = sorted({type(item).__name__ for item in items})
        raise TrajectoryValidationError(
            where,
            f"expected TrajectoryGroups or Trajectories, got {', '.join(kinds)}",
            "Pass a list of `art.TrajectoryGroup` (or of `art.Trajectory`), "
            "awaited: `await art.gather_trajectory_groups(...)`",
        )
    for group_index, group in enumerate(groups):
        group_where = f"{where}[{group_index}]"
        if not group.trajectories and not group.exceptions:
            raise TrajectoryValidationError(
                group_where,
                "the group is empty",
                "Give every group at least one trajectory, or leave the group out",
            )
        for index, trajectory in enumerate(group.trajectories):
            check_trajectory(trajectory, f"{group_where}.trajectories[{index}]")
    return groups


def check_trainable(groups: Sequence[TrajectoryGroup], *, allow_without_logprobs: bool) -> None:
    """Refuse a training step whose trajectories hold no turn the model could be trained on.

    A trainable turn is a `Choice` the endpoint returned with its sampled `token_ids`; with
    `allow_without_logprobs` (art.dev.TrainConfig's `allow_training_without_logprobs`) any
    assistant turn is. Checked before anything is logged or checkpointed, by every backend.
    A captured trajectory (`exchanges`) is trainable when an exchange carries the token ids
    our endpoint sampled; its exchanges without them are context, each named in its logs.
    """
    trainable = False
    captured = 0
    for group in groups:
        for trajectory in group.trajectories:
            if trajectory.exchanges:
                captured += 1
                note_untrained(trajectory)
                trainable = trainable or has_sampled_tokens(trajectory)
                continue
            histories: list[History | Trajectory] = [trajectory, *trajectory.additional_histories]
            trainable = trainable or any(
                _trainable(item, allow_without_logprobs)
                for history in histories
                for item in history.messages_and_choices
            )
    if trainable:
        return
    trajectories = sum(len(group.trajectories) for group in groups)
    failed = sum(len(group.exceptions) for group in groups)
    if captured:
        raise TrajectoryValidationError(
            "trajectory_groups",
            f"nothing to train: none of the {trajectories} trajectories has an answer "
            f"sampled with its token ids ({captured} hold captured exchanges, whose answers "
            "came from servers that return no prompt_token_ids and token_ids); nothing was "
            "logged or checkpointed",
            "Call the model through this backend's endpoint (`model.openai_client()`, or "
            "any SDK pointed at `model.inference_base_url`), inside the `with "
            "art.Trajectory() as t:` scope, with a client the scope captures",
        )
    what = (
        f"none of the {trajectories} trajectories has an assistant turn sampled with its "
        "token ids (a Choice from the model's own endpoint)"
        if trajectories
        else f"every rollout failed ({failed} exceptions), so there is no trajectory"
    )
    raise TrajectoryValidationError(
        "trajectory_groups",
        f"nothing to train: {what}; nothing was logged or checkpointed",
        "Sample the assistant turns through `model.openai_client()` and keep the returned "
        "Choice in messages_and_choices, or set allow_training_without_logprobs=True in "
        "art.dev.TrainConfig to train on plain assistant messages",
    )


def _trainable(item: object, allow_without_logprobs: bool) -> bool:
    if isinstance(item, Choice):
        token_ids = (item.model_extra or {}).get("token_ids")
        if isinstance(token_ids, list) and token_ids:
            return True
        return allow_without_logprobs or bool(logprob_token_ids(item))
    return allow_without_logprobs and isinstance(item, dict) and item.get("role") == "assistant"


def logprob_token_ids(choice: Choice) -> list[tuple[int, float]] | None:
    """The sampled `(token id, logprob)` pairs a Choice's logprobs hold as ART writes them
    (`token_id:N` tokens, vLLM's `return_tokens_as_token_ids`), or None.

    They survive a client that rebuilds each Choice from its index, message, logprobs and
    finish reason, dropping our `token_ids` field.
    """
    content = choice.logprobs.content if choice.logprobs is not None else None
    if not content:
        return None
    pairs = []
    for entry in content:
        token = entry.token
        number = token.removeprefix("token_id:")
        if number == token or not (number.isascii() and number.isdigit()):
            return None
        pairs.append((int(number), float(entry.logprob)))
    return pairs
