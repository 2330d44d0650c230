"""Constrained decoding: grammars that keep a row's sampled text inside a JSON schema.

A request's `response_format` (or a forced tool call's `parameters`) compiles, once per
distinct schema, into an llguidance grammar. Each row sampled under it gets its own
matcher; before every sampling step the engine asks the constrained rows' matchers for
the tokens they allow (`allowed_tokens`), masks everything else out of those rows'
logits, and feeds each sampled token back to its matcher. Once the JSON is complete the
matcher allows only the stop token, so the row ends the way an unconstrained one does.

Why llguidance: it computes a mask over SmolLM2's 49k-token vocabulary in well under a
millisecond per token on this CPU (benchmarks/structured_output.py; numbers in
benchmarks/RESULTS.md) with no per-schema precomputation, from a small CPU wheel.
xgrammar's wheel pulls triton, hundreds of MB of GPU toolchain, into a CPU install;
outlines-core builds a vocabulary index per schema before the first token.

JSON is written in one fixed style (`", "` and `": "` as separators, no other
whitespace): the style the model has seen most, and no room to pad with blank lines
until `max_tokens`.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import torch

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict only its stubs define

_JSON_STYLE: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_CACHED_GRAMMARS = 256


class GrammarError(ValueError):
    """A schema that does not compile; the message says why."""


@dataclass(frozen=True, eq=False)
class Grammar:
    """A compiled grammar; `matcher()` starts a fresh match for one sampled row."""

    key: str
    template: llguidance.LLMatcher
    source: str  # llguidance's grammar text: what an engine with its own matcher compiles

    def matcher(self) -> llguidance.LLMatcher:
        return self.template.deep_copy()


class Grammars:
    """Compiles grammars for one tokenizer, each distinct schema once (thread-safe).

    RULER and scenario generation send the same schema with every request, so compiled
    grammars are kept, the least recently used dropped beyond `capacity`.
    """

    def __init__(
        self, tokenizer: Any, stop_token_ids: set[int], capacity: int = _CACHED_GRAMMARS
    ) -> None:
        self._hf_tokenizer = tokenizer
        self._stop_token_ids = sorted(stop_token_ids)
        self._capacity = capacity
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    def json_schema(self, schema: dict[str, Any], *, strict: bool = True) -> Grammar:
        """JSON valid under `schema`. Not `strict`: keywords llguidance lacks are ignored."""
        # Lark text, not llguidance's JSON form: vLLM's guidance backend reads this form.
        style = {**schema, "x-guidance": {**_JSON_STYLE, "lenient": not strict}}
        lark = f"start: %json {json.dumps(style)}"
        key = json.dumps(["json_schema", schema, strict], sort_keys=True)
        return self._compile(key, lambda: llguidance.LLMatcher.grammar_from_lark(lark))

    def json_object(self) -> Grammar:
        """Any JSON object."""
        return self.json_schema({"type": "object"})

    def json_then(self, schema: dict[str, Any], suffix: str) -> Grammar:
        """JSON valid under `schema` (leniently), then the literal `suffix`.

        A forced tool call's arguments: the prompt ends inside the call's JSON, so the
        arguments object is followed by the text that closes the call.
        """
        style = {**schema, "x-guidance": {**_JSON_STYLE, "lenient": True}}
        lark = f"start: value {json.dumps(suffix)}\nvalue: %json {json.dumps(style)}"
        key = json.dumps(["json_then", schema, suffix], sort_keys=True)
        return self._compile(key, lambda: llguidance.LLMatcher.grammar_from_lark(lark))

    def from_source(self, key: str, source: str) -> Grammar:
        """The grammar another process compiled as `Grammar(key, _, source)`: a matcher
        does not cross a process boundary, its source text does."""
        return self._compile(key, lambda: source)

    def allowed_tokens(self, matchers: list[llguidance.LLMatcher], vocab: int) -> torch.Tensor:
        """(len(matchers), vocab) booleans: the tokens each matcher allows next.

        A matcher that allows nothing (it hit a parser limit) allows the stop tokens, so
        its row ends instead of sampling from an empty distribution.
        """
        tokenizer = self._tokenizer
        assert tokenizer is not None, "allowed_tokens before any grammar was compiled"
        bitmask = llguidance.numpy.allocate_token_bitmask(len(matchers), tokenizer.vocab_size)
        # One matcher after another: on a few cores this beat llguidance's thread pool
        # (`fill_next_token_bitmask_par`), whose hand-offs cost more than a mask.
        for i, matcher in enumerate(matchers):
            llguidance.numpy.fill_next_token_bitmask(matcher, bitmask, i)
        # Bit j of 32-bit word w is token 32 * w + j (little-endian words, low bit first).
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little")
        width = min(vocab, tokenizer.vocab_size)
        allowed = torch.zeros((len(matchers), vocab), dtype=torch.bool)
        allowed[:, :width] = torch.from_numpy(bits[:, :width]).view(torch.bool)
        empty = ~allowed.any(dim=1)
        if bool(empty.any()):
            allowed[empty.nonzero()[:, 0][:, None], torch.tensor(self._stop_token_ids)] = True
        return allowed

    def _compile(self, key: str, build: Callable[[], str]) -> Grammar:
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            tokenizer = self._ensure_tokenizer()
        try:
            text = build()
        except (TypeError, ValueError) as error:  # a schema that is not a JSON object
            raise GrammarError(str(error)) from error
        # Compiling drops the GIL; other requests keep being served meanwhile.
        matcher = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        grammar = Grammar(key, matcher, text)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > self._capacity:
                self._cache.popitem(last=False)
        return grammar

    def _ensure_tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:  # ~0.5 s for SmolLM2's vocabulary, so built on first use
            self._tokenizer = llguidance.hf.from_tokenizer(
                self._hf_tokenizer, eos_token=self._stop_token_ids
            )
        return self._tokenizer


__all__ = ["Grammar", "GrammarError", "Grammars"]
