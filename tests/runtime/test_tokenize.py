"""Trajectories to training sequences, with the real default-model tokenizer."""

from __future__ import annotations

import math
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

import art
from art.core.data.errors import TrainingError
from art.runtime.trainer.tokenize import TrainingSequence, tokenize_trajectory, truncate

SYSTEM = {"role": "system", "content": "You are terse."}
USER_1 = {"role": "user", "content": "Say hello."}
USER_2 = {"role": "user", "content": "Now say goodbye."}


@pytest.fixture(scope="module")
def tokenizer(default_model: tuple[Any, Any]) -> Any:
    return default_model[1]


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """What our endpoint sends the engine: the chat template with a generation prompt."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return encode(tokenizer, text)


def sampled(content: str, prompt: list[int], tokenizer: Any, *, ids: bool = True) -> Choice:
    """A Choice as our endpoint returns it: the text, and (with `ids`) the extras."""
    data: dict[str, Any] = {
        "index": 0,
        "finish_reason": "stop",
        "message": {"role": "assistant", "content": content},
    }
    if ids:
        tokens = [*encode(tokenizer, content), tokenizer.eos_token_id]
        data |= {
            "prompt_token_ids": prompt,
            "token_ids": tokens,
            "token_logprobs": [-0.1 * (i + 1) for i in range(len(tokens))],
        }
    return Choice.model_validate(data)


def extras(choice: Choice) -> dict[str, Any]:
    assert choice.model_extra is not None
    return choice.model_extra


def two_turns(tokenizer: Any) -> tuple[art.Trajectory, Choice, Choice]:
    first = sampled("Hello!", prompt_ids(tokenizer, [SYSTEM, USER_1]), tokenizer)
    history = [SYSTEM, USER_1, {"role": "assistant", "content": "Hello!"}, USER_2]
    second = sampled("Goodbye.", prompt_ids(tokenizer, history), tokenizer)
    trajectory = art.Trajectory(
        messages_and_choices=[SYSTEM, USER_1, first, USER_2, second], reward=1.0
    )
    return trajectory, first, second


def test_a_choice_whose_prompt_extends_the_sequence_merges_into_it(tokenizer: Any) -> None:
    trajectory, first, second = two_turns(tokenizer)
    p1, c1, l1 = (extras(first)[k] for k in ("prompt_token_ids", "token_ids", "token_logprobs"))
    p2, c2, l2 = (extras(second)[k] for k in ("prompt_token_ids", "token_ids", "token_logprobs"))
    assert p2[: len(p1) + len(c1)] == p1 + c1  # the template re-renders turn 1 as sampled
    between = len(p2) - len(p1) - len(c1)  # "\n<|im_start|>user\n...<|im_start|>assistant\n"
    assert between > 0

    [sequence] = tokenize_trajectory(trajectory, tokenizer, group_index=2, trajectory_index=3)

    assert sequence.token_ids == p2 + c2
    assert sequence.trained == [False] * len(p1) + [True] * len(c1) + [False] * between + [
        True
    ] * len(c2)
    assert (sequence.group_index, sequence.trajectory_index) == (2, 3)
    trained_logprobs = [
        lp for lp, t in zip(sequence.sampler_logprobs, sequence.trained, strict=True) if t
    ]
    assert trained_logprobs == l1 + l2
    untrained = [
        lp for lp, t in zip(sequence.sampler_logprobs, sequence.trained, strict=True) if not t
    ]
    assert all(math.isnan(lp) for lp in untrained)
    assert tokenizer.decode(c1) == "Hello!<|im_end|>"


def test_a_choice_whose_prompt_does_not_extend_the_sequence_starts_a_new_one(
    tokenizer: Any,
) -> None:
    first = sampled("Hello!", prompt_ids(tokenizer, [SYSTEM, USER_1]), tokenizer)
    # The rollout rewrote its history (a summary instead of the first turn).
    summary = [SYSTEM, {"role": "user", "content": "Earlier you said hello."}, USER_2]
    second = sampled("Goodbye.", prompt_ids(tokenizer, summary), tokenizer)
    trajectory = art.Trajectory(messages_and_choices=[SYSTEM, USER_1, first, *summary[1:], second])

    sequences = tokenize_trajectory(trajectory, tokenizer, group_index=0, trajectory_index=0)

    assert [s.token_ids for s in sequences] == [
        extras(first)["prompt_token_ids"] + extras(first)["token_ids"],
        extras(second)["prompt_token_ids"] + extras(second)["token_ids"],
    ]
    for sequence, choice in zip(sequences, (first, second), strict=True):
        n = len(extras(choice)["token_ids"])
        assert sequence.trained == [False] * (len(sequence.token_ids) - n) + [True] * n


def test_additional_histories_are_sequences_of_their_own(tokenizer: Any) -> None:
    trajectory, first, _ = two_turns(tokenizer)
    trajectory.additional_histories = [art.History(messages_and_choices=[SYSTEM, USER_1, first])]
    sequences = tokenize_trajectory(trajectory, tokenizer, group_index=0, trajectory_index=1)
    assert len(sequences) == 2
    assert sequences[1].token_ids == extras(first)["prompt_token_ids"] + extras(first)["token_ids"]


def rebuilt_with_id_tokens(choice: Choice) -> Choice:
    """`choice` as a client that keeps only OpenAI's fields has it, from an endpoint that
    writes logprob tokens `token_id:N` (ART's vLLM server, `art run`)."""
    ids, logprobs = extras(choice)["token_ids"], extras(choice)["token_logprobs"]
    content = [
        {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
        for i, lp in zip(ids, logprobs, strict=True)
    ]
    return Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": choice.message.model_dump(),
            "logprobs": {"content": content},
        }
    )


def test_a_rebuilt_choice_trains_from_the_ids_in_its_logprob_tokens(tokenizer: Any) -> None:
    trajectory, first, second = two_turns(tokenizer)
    [exact] = tokenize_trajectory(trajectory, tokenizer, group_index=0, trajectory_index=0)
    trajectory.messages_and_choices = [
        SYSTEM,
        USER_1,
        rebuilt_with_id_tokens(first),
        USER_2,
        rebuilt_with_id_tokens(second),
    ]
    assert all(not item.model_extra for item in trajectory.messages_and_choices[2::2])  # type: ignore[union-attr]

    [rebuilt] = tokenize_trajectory(trajectory, tokenizer, group_index=0, trajectory_index=0)

    # The same sequence: sampled ids and logprobs from the tokens, the prompt rendered.
    assert rebuilt.token_ids == exact.token_ids
    assert rebuilt.trained == exact.trained
    assert [lp for lp in rebuilt.sampler_logprobs if not math.isnan(lp)] == [
        lp for lp in exact.sampler_logprobs if not math.isnan(lp)
    ]


def test_a_choice_without_token_ids_is_an_error_naming_it_and_the_fix(tokenizer: Any) -> None:
    trajectory, first, _ = two_turns(tokenizer)
    plain = sampled("Goodbye.", [], tokenizer, ids=False)
    trajectory.messages_and_choices = [SYSTEM, USER_1, first, USER_2, plain]

    with pytest.raises(TrainingError) as caught:
        tokenize_trajectory(trajectory, tokenizer, group_index=1, trajectory_index=4)

    message = str(caught.value)
    assert "group 1, trajectory 4, messages_and_choices[4]" in message
    assert "allow_training_without_logprobs=True" in message
    assert "model.openai_client()" in message


def test_plain_assistant_dicts_are_context_unless_allowed(tokenizer: Any) -> None:
    messages = [
        SYSTEM,
        USER_1,
        {"role": "assistant", "content": "Hello!"},
        USER_2,
        {"role": "assistant", "content": "Goodbye."},
    ]
    trajectory = art.Trajectory(messages_and_choices=messages)
    assert tokenize_trajectory(trajectory, tokenizer, group_index=0, trajectory_index=0) == []

    [sequence] = tokenize_trajectory(
        trajectory,
        tokenizer,
        group_index=0,
        trajectory_index=0,
        allow_training_without_logprobs=True,
    )

    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert sequence.token_ids == encode(tokenizer, full)
    trained = [t for t, keep in zip(sequence.token_ids, sequence.trained, strict=True) if keep]
    # Each turn up to and including its <|im_end|>; the template's newline after it is context.
    assert tokenizer.decode(trained) == "Hello!<|im_end|>Goodbye.<|im_end|>"
    assert all(math.isnan(lp) for lp in sequence.sampler_logprobs)


def test_allowed_fallback_mixes_with_sampled_choices(tokenizer: Any) -> None:
    trajectory, first, _ = two_turns(tokenizer)
    plain = sampled("Goodbye.", [], tokenizer, ids=False)
    trajectory.messages_and_choices = [SYSTEM, USER_1, first, USER_2, plain]

    [sequence] = tokenize_trajectory(
        trajectory,
        tokenizer,
        group_index=0,
        trajectory_index=0,
        allow_training_without_logprobs=True,
    )

    p1, c1, l1 = (extras(first)[k] for k in ("prompt_token_ids", "token_ids", "token_logprobs"))
    assert sequence.token_ids[: len(p1) + len(c1)] == p1 + c1
    trained_logprobs = [
        lp for lp, t in zip(sequence.sampler_logprobs, sequence.trained, strict=True) if t
    ]
    assert trained_logprobs[: len(l1)] == l1  # the sampled turn keeps its logprobs
    assert all(math.isnan(lp) for lp in trained_logprobs[len(l1) :])
    trained = [t for t, keep in zip(sequence.token_ids, sequence.trained, strict=True) if keep]
    assert tokenizer.decode(trained) == "Hello!<|im_end|>Goodbye.<|im_end|>"


def test_truncate_keeps_the_start_and_counts_what_it_cut() -> None:
    long = TrainingSequence([1, 2, 3, 4, 5], [False, True, True, False, True], [math.nan] * 5, 0, 0)
    late = TrainingSequence([1, 2, 3, 4], [False, False, False, True], [math.nan] * 4, 0, 1)
    short = TrainingSequence([1, 2], [False, True], [math.nan, -0.5], 1, 0)

    kept, cut = truncate([long, late, short], 3)

    assert cut == 2 + 1  # `late` lost its only trained token, so it is dropped
    assert [k.token_ids for k in kept] == [[1, 2, 3], [1, 2]]
    assert [k.trained for k in kept] == [[False, True, True], [False, True]]
    assert [(k.group_index, k.trajectory_index) for k in kept] == [(0, 0), (1, 0)]
    assert kept[1].sampler_logprobs[1] == -0.5
