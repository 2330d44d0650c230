"""`art.tokenize` and `art.tensorize` (ART 0.5.23's calls) on the trainer's tokenization.

Each trajectory's one conversation becomes the token sequence the trainer trains on: the
prompt ids and sampled ids the endpoint returned (flagged `EXACT`, and `SAMPLED` on the
model's own tokens), with the sampler's logprobs. A captured trajectory's conversations are
`art.core.data.exchange_histories`'; a hand-built trajectory's plain assistant turns are
rendered with the base model's chat template as the trainer renders them (flagged
`ASSISTANT | OUTPUT`, not `EXACT`). The sequence ends with the last trained token: context
after it is never part of a training sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from ..core.data.dev import InternalModelConfig
from ..core.data.errors import TrajectoryValidationError
from ..core.data.exchange_histories import histories_of, selected_exchanges
from ..core.data.tokenized import (
    Device,
    TensorizedTrajectory,
    TensorizedTrajectoryGroup,
    TokenFlag,
    TokenizedTrajectory,
    TokenizedTrajectoryGroup,
)
from ..core.data.trajectories import History, Trajectory, TrajectoryGroup
from .chat_format import ChatRendering, chat_rendering
from .tokenizer import get_tokenizer
from .trainer.tokenize import TrainingSequence, tokenize_history

_SAMPLED = TokenFlag.EXACT | TokenFlag.SAMPLED | TokenFlag.OUTPUT | TokenFlag.ASSISTANT
_RENDERED = TokenFlag.ASSISTANT | TokenFlag.OUTPUT


def _refuse(
    multi_history: bool,
    reconcile: bool,
    chat_template: str | None,
    chat_template_kwargs: Mapping[str, object] | None,
    base_model: str | None,
    tokenizer: object | None,
) -> None:
    refusals = [
        (
            multi_history,
            "multi_history",
            "tokenizing each conversation of a trajectory apart is not built",
            "Leave it False and give trajectories of one conversation each",
        ),
        (
            reconcile,
            "reconcile_text_equivalent_tokenizations",
            "merging conversations whose token ids differ but whose text agrees is not built",
            "Leave it False",
        ),
        (
            chat_template is not None,
            "chat_template",
            "a template override is not built: sampled turns are the endpoint's own ids, "
            "and plain assistant turns are rendered with the base model's template, as the "
            "trainer renders them",
            "Leave chat_template out",
        ),
        (
            chat_template_kwargs is not None,
            "chat_template_kwargs",
            "template variables are not built here (see chat_template)",
            "Leave chat_template_kwargs out",
        ),
        (
            base_model is not None and tokenizer is not None,
            "base_model",
            "both a tokenizer and a base_model to load one from were given",
            "Pass one of them",
        ),
    ]
    for refused, field, problem, fix in refusals:
        if refused:
            raise TrajectoryValidationError(field, problem, fix)


class _Tokenizers:
    """The tokenizer of a call and its chat rendering, loaded on first need (a captured
    trajectory needs none: its tokens are the endpoint's)."""

    def __init__(self, tokenizer: object | None, base_model: str | None) -> None:
        self.given = tokenizer
        self.base_model = base_model
        self._loaded: dict[str, tuple[Any, ChatRendering]] = {}

    def get(self, name: str | None) -> tuple[Any, ChatRendering]:
        source = self.base_model or name or ""
        if self.given is None and not source:
            raise TrajectoryValidationError(
                "base_model",
                "a plain assistant turn must be rendered with the model's chat template, "
                "and no tokenizer was named",
                "Pass base_model= (or tokenizer=), or sample the turns through the model's "
                "endpoint, whose answers carry their token ids",
            )
        if source not in self._loaded:
            loaded = self.given if self.given is not None else get_tokenizer(source)
            self._loaded[source] = (loaded, chat_rendering(InternalModelConfig(), loaded))
        return self._loaded[source]


def _needs_rendering(history: History) -> bool:
    for item in history.messages_and_choices:
        if isinstance(item, dict):
            if item.get("role") == "assistant":
                return True
        elif not {"prompt_token_ids", "token_ids"} <= set(item.model_extra or {}):
            return True
    return False


def _model_name(trajectory: Trajectory, model: str | None) -> str:
    names = sorted({e.model or "" for e in selected_exchanges(trajectory, model)})
    if len(names) != 1:
        raise TrajectoryValidationError(
            "model",
            f"the trajectory's exchanges name {len(names)} models ({names})",
            "Pass model= to select one",
        )
    return model if model is not None else names[0]


def _flags(sequence: TrainingSequence) -> list[TokenFlag]:
    exact = sequence.exact or [False] * len(sequence.token_ids)
    return [
        (_SAMPLED if is_exact else _RENDERED)
        if trained
        else (TokenFlag.EXACT if is_exact else TokenFlag(0))
        for trained, is_exact in zip(sequence.trained, exact, strict=True)
    ]


def _tokenize_one(
    trajectory: Trajectory,
    where: str,
    model: str | None,
    base_model: str | None,
    tokenizers: _Tokenizers,
) -> TokenizedTrajectory:
    if trajectory.exchanges:
        histories = histories_of(trajectory, model=model)
        name = _model_name(trajectory, model)
        allow = False  # answers of other servers are context
    else:
        histories = trajectory.histories()
        name = model or base_model or str(getattr(tokenizers.given, "name_or_path", ""))
        allow = True
    if len(histories) != 1:
        raise TrajectoryValidationError(
            f"{where}.histories",
            f"the trajectory has {len(histories)} conversations; art.tokenize takes one per "
            "trajectory (multi_history=True is not built)",
            "Select one model's exchanges with model=, or tokenize trajectories of one "
            "conversation",
        )
    history = histories[0]
    tokenizer, rendering = None, None
    if allow and _needs_rendering(history):
        tokenizer, rendering = tokenizers.get(model)
    sequences = tokenize_history(
        history,
        tokenizer,
        where=where,
        rendering=rendering,
        allow_training_without_logprobs=allow,
    )
    if len(sequences) != 1:
        problem = (
            "it has no sampled or assistant turn"
            if not sequences
            else f"its turns form {len(sequences)} token sequences (a sampled turn's prompt "
            "does not begin with the tokens before it)"
        )
        raise TrajectoryValidationError(
            where,
            f"the conversation is not one token sequence: {problem}",
            "Give each trajectory one conversation that the model's sampled turns extend",
        )
    sequence = sequences[0]
    return TokenizedTrajectory(
        history=history,
        model=name,
        tokens=sequence.token_ids,
        logprobs=sequence.sampler_logprobs,
        flags=_flags(sequence),
        trajectory=trajectory,
    )


def _tokenize_all(
    items: list[Trajectory] | list[TrajectoryGroup],
    model: str | None,
    base_model: str | None,
    tokenizers: _Tokenizers,
) -> list[TokenizedTrajectory] | list[TokenizedTrajectoryGroup]:
    if all(isinstance(item, Trajectory) for item in items):
        return [
            _tokenize_one(t, f"items[{i}]", model, base_model, tokenizers)
            for i, t in enumerate(items)
            if isinstance(t, Trajectory)
        ]
    if all(isinstance(item, TrajectoryGroup) for item in items):
        return [
            TokenizedTrajectoryGroup(
                trajectory_group=group,
                trajectories=[
                    _tokenize_one(t, f"items[{g}].trajectories[{i}]", model, base_model, tokenizers)
                    for i, t in enumerate(group.trajectories)
                ],
            )
            for g, group in enumerate(items)
            if isinstance(group, TrajectoryGroup)
        ]
    kinds = sorted({type(item).__name__ for item in items})
    raise TrajectoryValidationError(
        "items",
        f"expected only Trajectories or only TrajectoryGroups, got {', '.join(kinds)}",
        "Pass a list of art.Trajectory, or a list of art.TrajectoryGroup",
    )


async def tokenize(
    items: Iterable[Trajectory] | Iterable[TrajectoryGroup],
    *,
    multi_history: bool = False,
    reconcile_text_equivalent_tokenizations: bool = False,
    model: str | None = None,
    base_model: str | None = None,
    tokenizer: object | None = None,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, object] | None = None,
) -> list[TokenizedTrajectory] | list[TokenizedTrajectoryGroup]:
    """Each trajectory (or each group's) as the token sequence the trainer trains on.

    `model` selects a captured trajectory's exchanges by model name or shell pattern (of
    a hand-built trajectory, it names the model, and its tokenizer when no `base_model`
    is given); `base_model` or `tokenizer` gives the tokenizer that renders plain
    assistant turns. Runs in a worker thread; results keep the order given.
    """
    _refuse(
        multi_history,
        reconcile_text_equivalent_tokenizations,
        chat_template,
        chat_template_kwargs,
        base_model,
        tokenizer,
    )
    listed = list(items)
    tokenizers = _Tokenizers(tokenizer, base_model)
    return await asyncio.to_thread(_tokenize_all, listed, model, base_model, tokenizers)  # type: ignore[arg-type]


async def tensorize(
    items: Iterable[Trajectory] | Iterable[TrajectoryGroup],
    *,
    device: Device = None,
    **keywords: Any,
) -> list[TensorizedTrajectory] | list[TensorizedTrajectoryGroup]:
    """`tokenize(items, **keywords)` (its keywords, each checked there), then each result
    as torch tensors on `device` (the CPU by default)."""
    tokenized = await tokenize(items, **keywords)
    return [item.tensorize(device=device) for item in tokenized]  # type: ignore[return-value]


__all__ = ["tensorize", "tokenize"]
