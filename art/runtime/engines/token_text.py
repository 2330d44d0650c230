"""A sampled sequence's text as its tokens arrive, each token's text read once, where in it
a stop string begins (`StopWatch`), and how long each of its prefixes decodes to
(`prefix_lengths`: Completions' `text_offset`, a response cut at its first tool call).

Decoding a sequence's ids whole after every token costs time that grows with its length
(the default model's tokenizer: 5.7 us at 16 tokens, 81 us at 512, 158 us at 1,024), so a
decode loop or a stream that does so per token spends O(n^2) on a long completion: 256
rows at 512 tokens is ~21 ms a step, three times the H200's whole decode step at 256 rows
of a 1B model (6.7 ms, `benchmarks/RESULTS.md`). `tokenizers`' `DecodeStream` gives each
token's new text in ~0.7 us, holding back the bytes of a character not yet complete; its
text is `tokenizer.decode`'s. Where it could differ (a tokenizer without a Rust backend,
or one whose decode cleans up spaces afterwards), the whole ids are decoded each time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class TokenText:
    """The text of one sampled sequence, grown one token at a time (special tokens
    skipped, as `tokenizer.decode(ids, skip_special_tokens=True)` gives it)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        cleans = getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._stream: tuple[DecodeStream, Tokenizer] | None = None
        if backend is not None and not cleans:
            self._stream = DecodeStream(skip_special_tokens=True), backend
        self._ids: list[int] = []  # only where the whole ids are decoded
        self._decoded = ""

    @property
    def streams(self) -> bool:
        """Whether each token's text is read once (else the whole ids are decoded)."""
        return self._stream is not None

    def add(self, token_id: int) -> str:
        """The text `token_id` adds: "" while it is part of a character not yet complete
        (that text comes with the token that completes it) or a special token."""
        if self._stream is not None:
            stream, backend = self._stream
            return stream.step(backend, token_id) or ""
        self._ids.append(token_id)
        text: str = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""  # half of a multi-byte character: wait for the rest
        new, self._decoded = text[len(self._decoded) :], text
        return new


def prefix_lengths(tokenizer: Any, ids: Sequence[int]) -> Iterator[int]:
    """`len(tokenizer.decode(ids[:k], skip_special_tokens=True))` for k = 1, 2, ...: each
    token's text read once (`TokenText`), a whole decode only after a token that adds no
    text of its own (a special token, or bytes of a character not yet complete, which a
    prefix's decode counts as replacement characters where the stream holds them back), or
    after every token where the tokenizer's text cannot be streamed."""
    text = TokenText(tokenizer)
    grown = 0
    for count, token_id in enumerate(ids, start=1):
        new = text.add(token_id) if text.streams else ""
        if new:
            grown += len(new)  # the stream released all it held: its text is decode's
            yield grown
        else:
            yield len(tokenizer.decode(ids[:count], skip_special_tokens=True))


class StopWatch:
    """Finds the first of `stop` (non-empty strings) in text that arrives in pieces: each
    piece is searched with only the tail a stop string could have begun in, held back
    (`len(longest) - 1` characters). A stop string that began before that tail would
    already be whole in the text, so what `feed` releases never reaches one."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = stop
        self._hold = max(len(s) for s in stop) - 1
        self._held = ""
        self.seen = False  # a stop string was found: nothing more is released

    def feed(self, new: str) -> str:
        """The text now known to lie before any stop string, not released before: all but
        the held-back tail, or the text up to the first stop string once one is seen."""
        if self.seen:
            return ""
        held = self._held + new
        found = [held.find(s) for s in self.stop if s in held]
        if found:
            self.seen, self._held = True, ""
            return held[: min(found)]
        cut = max(len(held) - self._hold, 0)
        self._held = held[cut:]
        return held[:cut]


__all__ = ["StopWatch", "TokenText", "prefix_lengths"]
