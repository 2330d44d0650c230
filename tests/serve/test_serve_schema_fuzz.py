"""A property-based fuzz of `art serve`, generated from the server's own OpenAPI schema.

Schemathesis turns each operation of `GET /openapi.json` into a Hypothesis strategy of
requests: bodies, path and query parameters that the schema allows (positive) and that it
does not (negative), and, for routes that take a model, the same with a model that exists.
Each request goes with the admin key or a key scoped to another project. Every answer
must hold: no 5xx, no traceback and no server path in the body, and every 4xx names the
field in `error.param`. Generation is derandomized, so each run sends the same cases and
the count the serve guide states is checked here.

`test_serve_fuzz.py` holds the hand-written corpus (bodies no schema describes: bad JSON,
oversized bodies, chunked uploads, keys); this one covers what the schema does describe.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from helpers import leaked
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from serve_server import BASE, KEY, Server

import art

pytestmark = pytest.mark.model  # starts art serve, which may start its model service

EXAMPLES_PER_STRATEGY = 50
GUIDE = Path(__file__).parents[2] / "docs" / "guides" / "serve.md"
SEEDED = {"project": "fuzz", "name": "agent"}
SEEDED_ID = "fuzz~agent"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("schema-fuzz") / ".art", "--max-body-mb", "1")
    yield running
    running.stop()


def strategies(
    operation: schemathesis.APIOperation, components: dict[str, Any]
) -> list[st.SearchStrategy[schemathesis.Case]]:
    """Positive and negative cases, and positive ones aimed at the model that exists."""
    made = [
        operation.as_strategy(mode) for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ]
    if "{model_id}" in operation.path:
        made.append(operation.as_strategy(path_parameters={"model_id": SEEDED_ID}))
    body = str(operation.definition.raw.get("requestBody", {}))
    names = re.findall(r"#/components/schemas/(\w+)", body)
    if any("model_id" in components[name].get("properties", {}) for name in names):
        made.append(operation.as_strategy().map(aimed_at_the_seeded_model))
    return made


def aimed_at_the_seeded_model(case: schemathesis.Case) -> schemathesis.Case:
    if isinstance(case.body, dict):
        case.body["model_id"] = SEEDED_ID
    return case


def problems(response: httpx.Response | schemathesis.Response, leaks: list[str]) -> list[str]:
    """What is wrong with one answer: a 5xx, a leak, or a 4xx that names no field."""
    found = leaked(response.status_code, response.text, leaks)
    if 400 <= response.status_code < 500:
        try:
            param = response.json().get("error", {}).get("param")
        except (ValueError, AttributeError):
            param = None
        if not (isinstance(param, str) and param):
            found.append("a 4xx whose error.param names no field")
    return found


def test_the_schema_driven_fuzz_gets_no_5xx_no_leak_and_named_fields(server: Server) -> None:
    admin = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.root, headers=admin, timeout=300) as http:
        created = http.post("/v1/preview/models", json={**SEEDED, "base_model": BASE})
        assert created.status_code == 200, created.text
        scoped = http.post("/v1/keys", json={"name": "other", "projects": ["other"]})
        keys = [admin, {"Authorization": f"Bearer {scoped.json()['key']}"}]
        raw = http.get("/openapi.json")
        assert raw.status_code == 200
    schema = schemathesis.openapi.from_dict(raw.json())
    leaks = [str(server.path.parent), str(Path(art.__file__).parent)]
    operations = [result.ok() for result in schema.get_all_operations()]
    # The seeded model's DELETE would empty every later operation of it: it goes last.
    operations.sort(key=lambda op: op.method == "delete" and op.path.endswith("{model_id}"))
    assert len(operations) >= 20

    sent = 0
    failures: list[str] = []
    for operation in operations:
        for strategy in strategies(operation, raw.json()["components"]["schemas"]):

            @settings(
                max_examples=EXAMPLES_PER_STRATEGY,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy, headers=st.sampled_from(keys))
            def send(case: schemathesis.Case, headers: dict[str, str]) -> None:
                nonlocal sent
                sent += 1
                response = case.call(base_url=server.root, headers=headers, timeout=300)
                for problem in problems(response, leaks):
                    failures.append(
                        f"{case.method} {case.formatted_path} {problem}: {case.body!r}"[:400]
                    )

            try:
                send()
            except Unsatisfiable:  # a negative strategy of a route with nothing to get wrong
                continue
    assert failures == []

    with httpx.Client(base_url=server.root, headers=admin) as http:
        assert http.get("/health").json() == {"status": "ok"}
    assert "Traceback" not in server.log()
    stated = re.search(r"schema-driven fuzz sends (\d+) generated requests", GUIDE.read_text())
    assert stated is not None, "docs/guides/serve.md states how many cases the fuzz sends"
    assert int(stated.group(1)) == sent, f"the fuzz sent {sent}; the serve guide says otherwise"
