"""A sampled sequence's text grown one token at a time is the text of its ids decoded
whole (but for bytes at its end that make no character yet), through each kind of
tokenizer, special tokens and broken bytes included."""

from __future__ import annotations

import random
from typing import Any

import pytest
from helpers import TOKENIZER_KINDS, tokenizer_of_kind

from art.runtime.engines.token_text import TokenText, prefix_lengths

# Multi-byte characters split across tokens.
TEXT = "Grüße aus Zürich 🍕 nach 東京, then a long tail of words. " * 4


@pytest.fixture(scope="module", params=TOKENIZER_KINDS)
def tokenizer(request: pytest.FixtureRequest) -> Any:
    return tokenizer_of_kind(request.param, TEXT)


def grown(tokenizer: Any, ids: list[int]) -> tuple[list[str], TokenText]:
    text = TokenText(tokenizer)
    return [text.add(token) for token in ids], text


def test_the_text_grown_a_token_at_a_time_is_the_whole_decode(tokenizer: Any) -> None:
    rng = random.Random(0)
    special = tokenizer.all_special_ids
    sequences = [tokenizer.encode(TEXT, add_special_tokens=False)]
    # Any ids a sampler may draw: bytes that make no character, special tokens between.
    sequences += [
        [
            rng.choice(special) if rng.random() < 0.1 else rng.randrange(len(tokenizer))
            for _ in range(40)
        ]
        for _ in range(50)
    ]
    for ids in sequences:
        added, text = grown(tokenizer, ids)
        assert text.streams
        whole, joined = tokenizer.decode(ids, skip_special_tokens=True), "".join(added)
        # Bytes at the end that make no character yet are held back: a sampler's next
        # token may complete them (the answer's text is decode's, so nothing is lost).
        assert whole.startswith(joined), ids
        assert set(whole[len(joined) :]) <= {"\ufffd"}, ids
    added, _ = grown(tokenizer, sequences[0])
    assert not any(piece.endswith("\ufffd") for piece in added)  # never half a character


def test_a_tokenizer_that_cleans_up_spaces_decodes_the_whole_ids(tokenizer: Any) -> None:
    """Its decode changes text after the tokens are joined, so the stream's text could
    differ: the whole ids are decoded each time, and the text is still decode's."""
    tokenizer.clean_up_tokenization_spaces = True
    try:
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        added, text = grown(tokenizer, ids)
        assert not text.streams
        assert "".join(added) == tokenizer.decode(ids, skip_special_tokens=True)
        assert list(prefix_lengths(tokenizer, ids)) == [
            len(tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(1, len(ids) + 1)
        ]
    finally:
        tokenizer.clean_up_tokenization_spaces = False


class CountingDecodes:
    """`tokenizer` with its whole decodes counted (its backend, which a stream reads, is
    the same object)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.decodes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.decodes += 1
        return str(self._tokenizer.decode(ids, **kwargs))


def test_prefix_lengths_are_each_prefix_decoded_whole_and_read_each_token_once(
    tokenizer: Any,
) -> None:
    """What `text_offset` (Completions' logprobs) and a response cut at its first tool call
    are computed from: the length of every prefix's decode, unfinished characters counted as
    that decode counts them, from one decode per token that adds no text of its own (a
    prefix's whole decode per token made an answer's offsets O(n^2) in its length)."""
    rng = random.Random(1)
    special = tokenizer.all_special_ids
    text_ids = tokenizer.encode(TEXT, add_special_tokens=False)
    sequences = [text_ids, [*text_ids[:7], special[0], *text_ids[7:30]]]
    sequences += [
        [
            rng.choice(special) if rng.random() < 0.1 else rng.randrange(len(tokenizer))
            for _ in range(40)
        ]
        for _ in range(50)
    ]
    for ids in sequences:
        lengths = list(prefix_lengths(tokenizer, ids))
        assert lengths == [
            len(tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(1, len(ids) + 1)
        ], ids
    # Plain text: a whole decode at most per byte that continues a character (a token can
    # end inside a character only there) and per special token; a decode per token fails.
    for ids, specials in zip(sequences[:2], (0, 1), strict=True):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        continuation_bytes = sum(len(character.encode()) - 1 for character in text)
        assert continuation_bytes + specials < len(ids)
        counting = CountingDecodes(tokenizer)
        list(prefix_lengths(counting, ids))
        assert counting.decodes <= continuation_bytes + specials
