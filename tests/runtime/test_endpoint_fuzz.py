"""The endpoint's four routes under hostile input: a property-based fuzz, and the classes
of body a fuzz of the SDKs' types never writes.

Hypothesis generates each protocol's requests from the protocol's own request type (the
`openai` and `anthropic` SDKs' `...CreateParams` TypedDicts), aimed at the served model,
streaming or not; half are then broken (a field given a JSON value of another shape, an
unknown field, a required one dropped). Every answer must hold: no 5xx, no dropped
connection, no traceback or server path in the body, a 4xx in its protocol's shape naming
the field, and a 200 that is whole (a stream ends with its protocol's last event).

The endpoint runs over `FakeEngine` (the model is not the point: every request is
answered in milliseconds). Generation is derandomized, so each run sends the same cases;
the count the endpoint's reference page states is checked here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, KeysView, Mapping, ValuesView
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from anthropic.types import message_create_params
from fake_endpoint import FixedRoutes, Words, fake_route, serving_app
from helpers import leaked
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params
from pydantic import BaseModel
from typing_extensions import get_type_hints, is_typeddict

import art
from art.core.capture.exchange_capture import is_terminal_event, sse_events
from art.runtime.endpoint.request import MAX_JSON_DEPTH
from art.runtime.endpoint.server import build_app
from art.runtime.engines.base import Sample
from art.runtime.engines.fake import FakeEngine

KEY = "secret"
HEADERS = {"authorization": f"Bearer {KEY}", "x-api-key": KEY, "anthropic-version": "2023-06-01"}
VOCAB = Words(["<unk>", "<eos>", "user", "assistant", "system", ":", "hi", "hello", "there"])
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }} {% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
SAMPLE = Sample(token_ids=VOCAB.ids("hello", "there"), logprobs=[-0.5, -1.0], finish_reason="stop")
REFERENCE = Path(__file__).parents[2] / "docs" / "reference" / "local-backend.md"
EXAMPLES_PER_STRATEGY = 60
LEAKS = [str(Path(art.__file__).parent), "site-packages"]

# path, the protocol's request type, what the capture pipeline calls it
ROUTES = {
    "chat_completions": (
        "/v1/chat/completions",
        chat_create_params.CompletionCreateParamsNonStreaming,
    ),
    "completions": ("/v1/completions", completion_create_params.CompletionCreateParamsNonStreaming),
    "responses": ("/v1/responses", response_create_params.ResponseCreateParamsNonStreaming),
    "messages": ("/v1/messages", message_create_params.MessageCreateParamsNonStreaming),
}


@pytest.fixture(scope="module")
def root() -> Iterator[str]:
    tokenizer = VOCAB.tokenizer(TEMPLATE)
    eos = frozenset({tokenizer.eos_token_id})
    engine = FakeEngine(tokenizer, lambda request: [SAMPLE] * request.n, stop_token_ids=eos)
    routes = FixedRoutes({"base": fake_route(engine, 4096)}, 4096)
    with serving_app(build_app(routes, api_key=KEY)) as url:
        yield url


def jsonable(value: Any) -> Any:
    """A generated value as JSON holds it: the SDK types' iterables as lists, bytes as text."""
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode("latin-1")
    # The types' `Iterable[...]` fields are drawn as lists, sets, views or iterators; any
    # other object (a field typed `object` draws anything, an IP network say) is its text.
    if isinstance(value, list | tuple | set | frozenset | KeysView | ValuesView | Iterator):
        return [jsonable(item) for item in value]
    return str(value)


def models_in(hint: Any, seen: set[Any]) -> Iterator[type[BaseModel]]:
    """The pydantic models a request type names anywhere in its fields."""
    if hint in seen:
        return
    seen.add(hint)
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        yield hint
    elif is_typeddict(hint):
        for field in get_type_hints(hint).values():
            yield from models_in(field, seen)
    else:
        for argument in get_args(hint):
            yield from models_in(argument, seen)


# A request type may name a response model in a union (Anthropic's content blocks), which
# Hypothesis cannot build without its fields: drawn unvalidated, it is sent as its text.
for _model in {m for _, params in ROUTES.values() for m in models_in(params, set())}:
    st.register_type_strategy(_model, st.builds(_model.model_construct))

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


DRAWN = {protocol: st.from_type(params) for protocol, (_, params) in ROUTES.items()}
USER = [{"role": "user", "content": "hi"}]
# A request of each protocol the served model answers, which the generated fields change.
VALID: dict[str, dict[str, Any]] = {
    "chat_completions": {"messages": USER, "max_tokens": 4},
    "completions": {"prompt": "hi", "max_tokens": 4},
    "responses": {"input": "hi", "max_output_tokens": 4},
    "messages": {"messages": USER, "max_tokens": 4},
}


@st.composite
def requests(draw: st.DrawFn, protocol: str, broken: bool) -> dict[str, Any]:
    """A request of `protocol` to the served model: a valid one with up to three of its
    fields (the conversation included) drawn from the SDK's request type; with `broken`,
    then one field given another JSON value, an unknown field added, or one dropped."""
    params = ROUTES[protocol][1]
    drawn = jsonable(draw(DRAWN[protocol]))
    changed = draw(st.sets(st.sampled_from(sorted(drawn)), max_size=3)) if drawn else set()
    body = VALID[protocol] | {key: drawn[key] for key in changed if key not in ("model", "stream")}
    body |= {"model": "base", "stream": draw(st.booleans())}
    if broken:
        fields = sorted(params.__annotations__)
        how = draw(st.sampled_from(["retyped", "unknown", "dropped"]))
        if how == "retyped":
            body[draw(st.sampled_from(fields))] = draw(JSON)
        elif how == "unknown":
            unknown = st.text(min_size=1, max_size=12).filter(lambda key: key not in fields)
            body[draw(unknown)] = draw(JSON)
        else:
            body.pop(draw(st.sampled_from(sorted(body))))
    return body


def problems(protocol: str, body: dict[str, Any], answer: httpx.Response) -> list[str]:
    """What is wrong with one answer (see the module docstring)."""
    text = answer.text
    found = leaked(answer.status_code, text, LEAKS)
    if answer.status_code == 400:
        found += shape_problems(protocol, text, body)
    elif answer.status_code == 200 and body.get("stream") is True:
        events = sse_events(answer.content)
        if not events or not is_terminal_event(protocol, events[-1]):  # type: ignore[arg-type]
            found.append(f"a stream that does not end with its last event: {text[-300:]}")
    elif answer.status_code == 200:
        json.loads(text)
    return found


def shape_problems(protocol: str, text: str, body: dict[str, Any] | None = None) -> list[str]:
    """A 400 not in its protocol's error shape, or one that names no field."""
    try:
        error = json.loads(text)
    except ValueError:
        return [f"a 400 whose body is not JSON: {text[:200]}"]
    if protocol == "messages":  # Anthropic's: {"type": "error", "error": {type, message}}
        inner = error.get("error") if error.get("type") == "error" else None
        message = inner.get("message") if isinstance(inner, dict) else None
        if not isinstance(message, str):
            return [f"a 400 not in Anthropic's shape: {text[:200]}"]
        # Its shape has no `param`: the message begins with the field (or its path).
        fields = {"body", *ROUTES[protocol][1].__annotations__, *(body or {})}
        if not any(re.match(rf"{re.escape(field)}[\[.: ]", message) for field in fields):
            return [f"a 400 whose message does not begin with a field: {text[:200]}"]
        return []
    inner = error.get("error")
    if not isinstance(inner, dict) or not isinstance(inner.get("message"), str):
        return [f"a 400 not in OpenAI's shape: {text[:200]}"]
    if not (isinstance(inner.get("param"), str) and inner["param"]):
        return [f"a 400 whose error.param names no field: {text[:200]}"]
    return []


def fuzz(http: httpx.Client, protocol: str, broken: bool, failures: list[str]) -> int:
    """Send `EXAMPLES_PER_STRATEGY` generated requests of `protocol` (broken or not);
    each problem found is added to `failures`. Returns the count sent."""
    path = ROUTES[protocol][0]
    sent = 0

    @settings(
        max_examples=EXAMPLES_PER_STRATEGY,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(requests(protocol, broken))
    def case(body: dict[str, Any]) -> None:
        nonlocal sent
        sent += 1
        try:
            answer = http.post(path, content=json.dumps(body).encode())
        except httpx.TransportError as error:  # a dropped connection
            failures.append(f"{path} {body!r:.300}: {type(error).__name__}")
            return
        failures.extend(f"{path} {body!r:.300}: {p}" for p in problems(protocol, body, answer))

    case()
    return sent


# The SDKs' request types are large unions: Hypothesis warns each time it spells one out.
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
def test_the_fuzz_of_the_four_protocols_gets_no_5xx_no_drop_and_named_fields(root: str) -> None:
    failures: list[str] = []
    with httpx.Client(base_url=root, headers=HEADERS, timeout=60) as http:
        sent = sum(
            fuzz(http, protocol, broken, failures)
            for protocol in ROUTES
            for broken in (False, True)
        )
    assert failures == [], "\n".join(failures[:10])
    stated = re.search(
        r"fuzz of the four routes sends\s+(\d+) generated requests", REFERENCE.read_text()
    )
    assert stated is not None, f"{REFERENCE} states no request count for the fuzz"
    assert sent == int(stated.group(1)) == len(ROUTES) * 2 * EXAMPLES_PER_STRATEGY


NESTED = "[" * (MAX_JSON_DEPTH + 10) + "]" * (MAX_JSON_DEPTH + 10)
HOSTILE = {
    "not UTF-8": (b'\xff\xfe{"model": "base"}', "body"),
    "nested past the JSON reader's limit": (
        b'{"model": "base", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "body",
    ),
    "nested past the endpoint's limit": (f'{{"model": "base", "x": {NESTED}}}'.encode(), "body"),
    "a lone surrogate in text": (b'{"model": "base", "user": "a\\ud800"}', "user"),
    "a lone surrogate in a key": (b'{"model": "base", "metadata": {"\\udc00": "x"}}', "metadata"),
}


@pytest.mark.parametrize("protocol", sorted(ROUTES))
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_body_is_a_400_naming_where(root: str, protocol: str, case: str) -> None:
    raw, where = HOSTILE[case]
    answer = httpx.post(root + ROUTES[protocol][0], content=raw, headers=HEADERS, timeout=30)
    assert answer.status_code == 400, answer.text[:300]
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    assert shape_problems(protocol, answer.text, body) == []
    assert where in answer.text
