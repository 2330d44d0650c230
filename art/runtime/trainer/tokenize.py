"""Trajectories to training sequences, with the exact token ids the model sampled.

Our endpoint returns each `Choice` with three extra fields: `prompt_token_ids` (the
prompt the engine saw), `token_ids` (the sampled completion, its final EOS included) and
`token_logprobs` (the sampler's logprob of each sampled token). Training on those ids,
rather than on a re-tokenization of the text, keeps the trained tokens the ones whose
logprobs the importance ratio compares.

The choices of one conversation are walked in order. A choice whose prompt begins with
the sequence built so far extends it: the new prompt tokens as context, the completion
as trained tokens. Any other choice starts a new sequence. Assistant turns given as plain
dicts are context, unless `allow_training_without_logprobs` is set: then they (and
choices without ids) are rendered with the chat template and trained with unknown
sampler logprobs (NaN), which makes their importance ratio 1.

A captured trajectory (`exchanges`) is tokenized from its conversations as
`art.core.data.exchange_histories` builds them: each sampled answer a `Choice` with its ids;
answers from other servers stay context even with `allow_training_without_logprobs`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from openai.types.chat.chat_completion import Choice

from ...core.data.errors import TrainingError
from ...core.data.exchange_histories import fill_policy_versions, histories_of
from ...core.data.trajectories import History, Trajectory, messages_of
from ...core.data.types import MessageOrChoice, Messages, Tool
from ...core.data.validation import logprob_token_ids
from ..chat_format import ChatRendering, render_prompt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_NAN = math.nan
_FIX = (
    "Sample the turn through the model's own endpoint (`model.openai_client()`), which "
    "returns the token ids, or set `allow_training_without_logprobs=True` in "
    "art.dev.TrainConfig to train on a re-encoding of its text"
)


@dataclass(frozen=True)
class TrainingSequence:
    """One sequence to train on: which tokens the model sampled, and their sampler logprobs."""

    token_ids: list[int]
    trained: list[bool]  # True on the model's own sampled tokens only
    sampler_logprobs: list[float]  # NaN where not trained, or where the sampler's is unknown
    group_index: int
    trajectory_index: int
    # True where the id is the server's own (a sampled prompt or completion), not a
    # re-encoding of text; empty on a sequence built by hand (art.tokenize reads it).
    exact: list[bool] = field(default_factory=list)


@dataclass(frozen=True)
class _Turn:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    trained: list[bool]
    prompt_exact: bool = False
    completion_exact: bool = False


@dataclass
class _Draft:
    token_ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    exact: list[bool] = field(default_factory=list)

    def add(
        self, ids: Sequence[int], trained: Sequence[bool], logprobs: Sequence[float], exact: bool
    ) -> None:
        self.token_ids.extend(ids)
        self.trained.extend(trained)
        self.logprobs.extend(logprobs)
        self.exact.extend([exact] * len(ids))


def tokenize_trajectory(
    trajectory: Trajectory,
    tokenizer: PreTrainedTokenizerBase,
    *,
    group_index: int,
    trajectory_index: int,
    rendering: ChatRendering | None = None,
    allow_training_without_logprobs: bool = False,
    last_turn_only: bool = False,
) -> list[TrainingSequence]:
    """The training sequences of a trajectory and of each of its additional histories
    (of a captured trajectory: of each conversation of its exchanges, `histories_of`,
    whose `initial_`/`final_policy_version` are filled from them where unset).

    Raises `TrainingError` for a choice without token ids, unless
    `allow_training_without_logprobs`. With `last_turn_only` (SFT's
    `assistant_turns="last"`) only each conversation's final message trains, and it must
    be the assistant's; the turns before it are context.
    """
    conversations = [("messages_and_choices", trajectory.messages_and_choices, trajectory.tools)]
    for h, history in enumerate(trajectory.additional_histories):
        where = f"additional_histories[{h}].messages_and_choices"
        conversations.append((where, history.messages_and_choices, history.tools))
    if trajectory.exchanges:
        fill_policy_versions(trajectory)
        conversations = [
            (f"exchanges (conversation {h})", history.messages_and_choices, history.tools)
            for h, history in enumerate(histories_of(trajectory))
        ]
        # Answers without token ids came from another server: context, never trained.
        allow_training_without_logprobs = False
    sequences: list[TrainingSequence] = []
    for where, items, tools in conversations:
        context = f"group {group_index}, trajectory {trajectory_index}, {where}"
        for draft in _tokenize_conversation(
            items,
            tools,
            tokenizer,
            rendering,
            allow_training_without_logprobs,
            context,
            last_turn_only,
        ):
            sequences.append(
                TrainingSequence(
                    draft.token_ids,
                    draft.trained,
                    draft.logprobs,
                    group_index,
                    trajectory_index,
                    draft.exact,
                )
            )
    return sequences


def tokenize_history(
    history: History,
    tokenizer: PreTrainedTokenizerBase | None,
    *,
    where: str,
    rendering: ChatRendering | None = None,
    allow_training_without_logprobs: bool = False,
) -> list[TrainingSequence]:
    """The training sequences of one conversation, as `tokenize_trajectory` builds them.

    `tokenizer` may be None when every trained turn carries its sampled ids (nothing is
    rendered then).
    """
    drafts = _tokenize_conversation(
        history.messages_and_choices,
        history.tools,
        tokenizer,  # type: ignore[arg-type]  # only read where a turn is rendered
        rendering,
        allow_training_without_logprobs,
        where,
    )
    return [TrainingSequence(d.token_ids, d.trained, d.logprobs, 0, 0, d.exact) for d in drafts]


def truncate(
    sequences: Sequence[TrainingSequence], max_seq_length: int
) -> tuple[list[TrainingSequence], int]:
    """Cut each sequence to its first `max_seq_length` tokens.

    Returns the sequences that still have a trained token, and how many tokens were cut.
    """
    kept: list[TrainingSequence] = []
    cut = 0
    for sequence in sequences:
        cut += max(0, len(sequence.token_ids) - max_seq_length)
        short = TrainingSequence(
            sequence.token_ids[:max_seq_length],
            sequence.trained[:max_seq_length],
            sequence.sampler_logprobs[:max_seq_length],
            sequence.group_index,
            sequence.trajectory_index,
            sequence.exact[:max_seq_length],
        )
        if any(short.trained):
            kept.append(short)
    return kept, cut


def _tokenize_conversation(
    items: Sequence[MessageOrChoice],
    tools: list[Tool] | None,
    tokenizer: PreTrainedTokenizerBase,
    rendering: ChatRendering | None,
    allow_without_ids: bool,
    context: str,
    last_turn_only: bool = False,
) -> list[_Draft]:
    messages = messages_of(items)
    if last_turn_only and (not messages or messages[-1]["role"] != "assistant"):
        last = f"a {messages[-1]['role']!r} message" if messages else "missing"
        raise TrainingError(
            f"{context}: assistant_turns='last' trains the final message, which is {last}. "
            "End the conversation with the assistant's turn, or use assistant_turns='all'"
        )
    drafts: list[_Draft] = []
    current: _Draft | None = None
    for k, item in enumerate(items):
        where = f"{context}[{k}]"
        turn: _Turn | None = None
        if last_turn_only and k != len(items) - 1:
            continue  # context: inside the prompt of the final turn
        if isinstance(item, Choice):
            turn = _sampled_turn(item, where)
            if turn is None:
                turn = _logprobs_turn(item, messages, k, tools, tokenizer, rendering)
            if turn is None and not allow_without_ids:
                raise TrainingError(
                    f"{where}: this Choice has no token ids (prompt_token_ids, token_ids), "
                    f"so it cannot be trained exactly. {_FIX}"
                )
        if turn is None and allow_without_ids and messages[k]["role"] == "assistant":
            turn = _rendered_turn(messages, k, tools, tokenizer, rendering, where)
        if turn is None:
            continue  # context: it is inside the prompt of the next trained turn
        if current is None or turn.prompt_ids[: len(current.token_ids)] != current.token_ids:
            current = _Draft()
            drafts.append(current)
        delta = turn.prompt_ids[len(current.token_ids) :]
        current.add(delta, [False] * len(delta), [_NAN] * len(delta), turn.prompt_exact)
        current.add(turn.completion_ids, turn.trained, turn.logprobs, turn.completion_exact)
    return [draft for draft in drafts if any(draft.trained)]


def _sampled_turn(choice: Choice, where: str) -> _Turn | None:
    extra: dict[str, Any] = choice.model_extra or {}
    prompt_ids = extra.get("prompt_token_ids")
    token_ids = extra.get("token_ids")
    if prompt_ids is None or token_ids is None:
        return None
    logprobs = extra.get("token_logprobs")
    if logprobs is None:
        logprobs = [None] * len(token_ids)
    if not (_is_ids(prompt_ids) and _is_ids(token_ids) and isinstance(logprobs, list)):
        raise TrainingError(
            f"{where}: prompt_token_ids and token_ids must be lists of ints and "
            "token_logprobs a list of floats. Pass the Choice on as the endpoint returned it"
        )
    if len(logprobs) != len(token_ids):
        raise TrainingError(
            f"{where}: {len(token_ids)} token_ids but {len(logprobs)} token_logprobs. "
            "Pass the Choice on as the endpoint returned it"
        )
    return _Turn(
        prompt_ids=list(prompt_ids),
        completion_ids=list(token_ids),
        logprobs=[_NAN if value is None else float(value) for value in logprobs],
        trained=[True] * len(token_ids),
        prompt_exact=True,
        completion_exact=True,
    )


def _logprobs_turn(
    choice: Choice,
    messages: Messages,
    k: int,
    tools: list[Tool] | None,
    tokenizer: PreTrainedTokenizerBase,
    rendering: ChatRendering | None,
) -> _Turn | None:
    """A Choice whose ids survive only in its logprobs (`token_id:N`, a client rebuilt it):
    the sampled ids and logprobs from there, the prompt rendered as the endpoint renders it."""
    pairs = logprob_token_ids(choice)
    if pairs is None:
        return None
    prompt = _render(messages[:k], tools, tokenizer, rendering, add_generation_prompt=True)
    return _Turn(
        prompt_ids=_encode(tokenizer, prompt),
        completion_ids=[token for token, _ in pairs],
        logprobs=[logprob for _, logprob in pairs],
        trained=[True] * len(pairs),
        completion_exact=True,
    )


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    )


def _rendered_turn(
    messages: Messages,
    k: int,
    tools: list[Tool] | None,
    tokenizer: PreTrainedTokenizerBase,
    rendering: ChatRendering | None,
    where: str,
) -> _Turn:
    prompt = _render(messages[:k], tools, tokenizer, rendering, add_generation_prompt=True)
    full = _render(messages[: k + 1], tools, tokenizer, rendering, add_generation_prompt=False)
    if not full.startswith(prompt):
        raise TrainingError(
            f"{where}: the chat template does not render this assistant turn as a "
            "continuation of the conversation before it, so its tokens cannot be found. "
            "Sample the turn through the model's own endpoint, which returns its token ids"
        )
    prompt_ids = _encode(tokenizer, prompt)
    completion_ids = _encode(tokenizer, full[len(prompt) :])
    # Tokens after the turn's end-of-sequence token (a template's trailing newline) were
    # never sampled by the model, which stops at EOS: they are context, not trained.
    trained = [True] * len(completion_ids)
    eos = tokenizer.eos_token_id
    if eos in completion_ids:
        end = completion_ids.index(eos) + 1
        trained[end:] = [False] * (len(completion_ids) - end)
    return _Turn(prompt_ids, completion_ids, [_NAN] * len(completion_ids), trained)


def _render(
    messages: Messages,
    tools: list[Tool] | None,
    tokenizer: PreTrainedTokenizerBase,
    rendering: ChatRendering | None,
    *,
    add_generation_prompt: bool,
) -> str:
    # The endpoint's renderer, so a trained turn reads as the model saw its prompts.
    return render_prompt(
        tokenizer,
        [dict(message) for message in messages],
        [dict(tool) for tool in tools] if tools else None,
        rendering or ChatRendering(),
        add_generation_prompt=add_generation_prompt,
    )


def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    # The template writes special tokens (BOS included) as text; adding them again would double them.
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(token) for token in ids]


__all__ = ["TrainingSequence", "tokenize_history", "tokenize_trajectory", "truncate"]
