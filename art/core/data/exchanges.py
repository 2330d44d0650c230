"""Captured HTTP exchanges: what a rollout asked a model, and what it answered.

ART 0.5.23's trajectory shape (`Trajectory.exchanges`): inside `with art.Trajectory() as
t:` every call a client makes to a model endpoint, in any of four protocols, is kept as
one exchange (the JSON request as sent, the parsed response, when it started and ended),
in a list per protocol:

    t.exchanges.chat_completions  POST /v1/chat/completions   openai ChatCompletion
    t.exchanges.completions       POST /v1/completions        openai Completion
    t.exchanges.responses         POST /v1/responses          openai Response
    t.exchanges.messages          POST /v1/messages           anthropic Message

A response our endpoint sent carries the sampled token ids beside the protocol's own
fields (`prompt_token_ids`, `token_ids`, `token_logprobs`, `policy_version`: on each
choice for Chat Completions and Completions, on the response object for Responses and
Messages); `sampled_tokens` reads them. An exchange without them (a call to another
server: a judge, a hosted model) is context, never trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    SerializationInfo,
    computed_field,
)

if TYPE_CHECKING:
    from anthropic.types import Message as AnthropicMessage


def utc_now() -> datetime:
    return datetime.now(UTC)


class _Exchange(BaseModel):
    model_config = ConfigDict(validate_assignment=True)

    start_time: datetime
    end_time: datetime
    request: dict[str, Any]  # the JSON body as sent

    @computed_field  # type: ignore[prop-decorator]
    @property
    def model(self) -> str | None:
        """The model the request named (else the one the response names)."""
        requested = self.request.get("model")
        if isinstance(requested, str):
            return requested
        answered = getattr(getattr(self, "response", None), "model", None)
        return answered if isinstance(answered, str) else None


class ChatCompletionsExchange(_Exchange):
    response: ChatCompletion


class CompletionsExchange(_Exchange):
    response: Completion


class ResponsesExchange(_Exchange):
    response: Response


def _anthropic_message(value: object) -> AnthropicMessage:
    # Imported when a Messages exchange is made: anthropic's types take a second to import,
    # which every `art.Trajectory` user would otherwise pay.
    from anthropic.types import Message

    return value if isinstance(value, Message) else Message.model_validate(value)


def _dump(message: AnthropicMessage, info: SerializationInfo) -> dict[str, Any]:
    return message.model_dump(mode=info.mode)


if TYPE_CHECKING:
    MessageField: TypeAlias = AnthropicMessage
else:
    MessageField = Annotated[Any, PlainValidator(_anthropic_message), PlainSerializer(_dump)]


class MessagesExchange(_Exchange):
    response: MessageField


Exchange: TypeAlias = (
    ChatCompletionsExchange | CompletionsExchange | ResponsesExchange | MessagesExchange
)


class TrajectoryExchanges(BaseModel):
    """A trajectory's captured exchanges, one list per protocol, each in the order sent."""

    model_config = ConfigDict(extra="forbid")

    chat_completions: list[ChatCompletionsExchange] = Field(default_factory=list)
    completions: list[CompletionsExchange] = Field(default_factory=list)
    responses: list[ResponsesExchange] = Field(default_factory=list)
    messages: list[MessagesExchange] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.chat_completions or self.completions or self.responses or self.messages)

    def all(self) -> list[Exchange]:
        """Every exchange of the four lists, in the order they were sent."""
        every: list[Exchange] = [
            *self.chat_completions,
            *self.completions,
            *self.responses,
            *self.messages,
        ]
        return sorted(every, key=lambda exchange: exchange.start_time)

    def add(self, exchange: Exchange) -> None:
        """Append `exchange` to its protocol's list."""
        if isinstance(exchange, ChatCompletionsExchange):
            self.chat_completions.append(exchange)
        elif isinstance(exchange, CompletionsExchange):
            self.completions.append(exchange)
        elif isinstance(exchange, ResponsesExchange):
            self.responses.append(exchange)
        else:
            self.messages.append(exchange)

    def model_copy(
        self,
        *,
        include_models: str | Iterable[str] | None = None,
        exclude_models: str | Iterable[str] | None = None,
        update: Mapping[str, Any] | None = None,
        deep: bool = False,
    ) -> TrajectoryExchanges:
        """A copy keeping the exchanges of the models selected, as ART's does.

        A selector is a model name or a shell pattern (`"judge-*"`), or several; None
        includes every model, or excludes none.
        """

        def kept(exchange: Exchange) -> bool:
            name = exchange.model or ""
            return (include_models is None or _matches(name, include_models)) and not (
                exclude_models is not None and _matches(name, exclude_models)
            )

        filtered = {
            field: [e for e in getattr(self, field) if kept(e)]
            for field in ("chat_completions", "completions", "responses", "messages")
        }
        return super().model_copy(update={**filtered, **(update or {})}, deep=deep)


def _matches(name: str, selectors: str | Iterable[str]) -> bool:
    patterns = [selectors] if isinstance(selectors, str) else list(selectors)
    return any(name == pattern or fnmatchcase(name, pattern) for pattern in patterns)


@dataclass(frozen=True)
class SampledTokens:
    """What our endpoint sampled for one answer: the exact ids training needs."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    token_logprobs: list[float]
    policy_version: int | None


def sampled_tokens(exchange: Exchange) -> Iterator[SampledTokens]:
    """The sampled answers of `exchange` that carry our endpoint's token ids.

    One per choice for Chat Completions and Completions, one for Responses and Messages;
    none for an exchange with another server (its answers are context).
    """
    response = exchange.response
    holders: list[BaseModel] = (
        list(response.choices) if isinstance(response, ChatCompletion | Completion) else [response]
    )
    for holder in holders:
        extra = holder.model_extra or {}
        prompt, tokens = extra.get("prompt_token_ids"), extra.get("token_ids")
        if isinstance(prompt, list) and isinstance(tokens, list):
            logprobs = extra.get("token_logprobs")
            version = extra.get("policy_version")
            yield SampledTokens(
                prompt_token_ids=prompt,
                token_ids=tokens,
                token_logprobs=logprobs if isinstance(logprobs, list) else [],
                policy_version=version if isinstance(version, int) else None,
            )


__all__ = [
    "ChatCompletionsExchange",
    "CompletionsExchange",
    "Exchange",
    "MessagesExchange",
    "ResponsesExchange",
    "SampledTokens",
    "TrajectoryExchanges",
    "sampled_tokens",
    "utc_now",
]
