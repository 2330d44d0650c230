"""A sampled sequence's text grown one token at a time is the text of its ids decoded
whole (but for bytes at its end that make no character yet), through each kind of
tokenizer, special tokens and broken bytes included."""

from __future__ import annotations

import random
from typing import Any

import pytest
from helpers import TOKENIZER_KINDS, tokenizer_of_kind

from art.runtime.engines.token_text import TokenText

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
    finally:
        tokenizer.clean_up_tokenization_spaces = False
