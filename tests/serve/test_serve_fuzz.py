"""A fixed corpus of malformed requests, across every route of a real `art serve`.

Acceptance: no answer is a 5xx; every answer is a 4xx whose `error.param` names the
offending field (a JSON path, a query parameter, a header); the server still answers; nothing under its `--path` changed; and its log has
one line per rejected request and no traceback.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_server import BASE, KEY, Server

import art
from art.serverless.backend import ServerlessBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service

MODEL = "fuzz~agent"
GOOD_GROUP: dict[str, Any] = {
    "trajectories": [
        {
            "messages_and_choices": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
            ],
            "reward": 1.0,
        }
    ]
}
USER = [{"role": "user", "content": "Hi"}]


def corpus(job_id: str, scoped_key: str, stored: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, httpx request arguments) of each malformed request.

    `scoped_key` may use project `other` only; `stored` is a checkpoint directory of
    fuzz/agent on the server.
    """
    models = "/v1/preview/models"
    jobs = "/v1/preview/training-jobs"
    chat = "/v1/chat/completions"
    cases: list[tuple[str, str, dict[str, Any]]] = []

    def post(path: str, body: Any) -> None:
        cases.append(("POST", path, {"json": body}))

    # Authentication, on every route.
    routes = [
        ("POST", models),
        ("GET", f"{models}/{MODEL}"),
        ("DELETE", f"{models}/{MODEL}"),
        ("POST", f"{models}/{MODEL}/log"),
        ("GET", f"{models}/{MODEL}/checkpoints"),
        ("DELETE", f"{models}/{MODEL}/checkpoints"),
        ("PUT", f"{models}/{MODEL}/checkpoints/9"),
        ("POST", jobs),
        ("GET", jobs),
        ("GET", f"{jobs}/{job_id}"),
        ("GET", f"{jobs}/{job_id}/events"),
        ("POST", "/v1/preview/sft-training-jobs"),
        ("POST", f"{models}/{MODEL}/sft-data"),
        ("POST", f"{models}/{MODEL}/sft-data/sft-data-{'0' * 32}"),
        ("POST", "/v1/keys"),
        ("GET", "/v1/keys"),
        ("DELETE", "/v1/keys/key-x"),
        ("POST", chat),
        ("GET", "/v1/models"),
        ("GET", "/openapi.json"),
        ("GET", "/docs"),
    ]
    for headers in ({}, {"Authorization": KEY}, {"Authorization": "Bearer wrong"}):
        for method, path in routes:
            cases.append((method, path, {"headers": headers}))

    # Body parsing: not JSON, not an object, too big.
    for path in (models, f"{models}/{MODEL}/log", jobs, chat, "/v1/keys"):
        cases.append(("POST", path, {"content": b"{not json"}))
        cases.append(("POST", path, {"content": b"\xff\xfe\x00"}))
        post(path, [1, 2])
        cases.append(("POST", path, {"content": b"x" * (2 * 2**20)}))

    # Model creation, internal_config included.
    for body in (
        {},
        {"project": "fuzz"},
        {"project": "../etc", "name": "x", "base_model": BASE},
        {"project": "fuzz", "name": "a/b", "base_model": BASE},
        {"project": "fuzz", "name": "", "base_model": BASE},
        {"project": 7, "name": "x", "base_model": BASE},
        {"project": "fuzz", "name": "x", "base_model": ""},
        {"project": "fuzz", "name": "x", "base_model": "no-such-org/no-such-model"},
        {"project": "fuzz", "name": "x", "base_model": "/etc"},
        {"project": "fuzz", "name": "x", "base_model": "bad\u0000name"},
        {"project": "fuzz", "name": "x", "base_model": "../../.."},
        {"project": "fuzz", "name": "x", "base_model": "./nowhere"},
        {"project": "fuzz", "name": "x", "trainable": True},
        {"project": "fuzz", "name": "x", "base_model": BASE, "unknown": 1},
        {"project": "fuzz", "name": "x", "base_model": BASE, "entity": "a b"},
        {"project": "fuzz", "name": "x", "base_model": BASE, "return_existing": "maybe"},
        {"project": "fuzz", "name": "x", "base_model": BASE, "internal_config": []},
        {"project": "fuzz", "name": "x", "base_model": BASE, "internal_config": {"nope": 1}},
        {"project": "fuzz", "name": "x", "base_model": BASE, "internal_config": {"engine": "x"}},
        {
            "project": "fuzz",
            "name": "x",
            "base_model": BASE,
            "internal_config": {"engine_args": {"max_num_seqs": -1}},
        },
        {
            "project": "fuzz",
            "name": "x",
            "base_model": BASE,
            "internal_config": {"peft_args": {"r": "big"}},
        },
        {
            "project": "fuzz",
            "name": "x",
            "base_model": BASE,
            "internal_config": {"init_args": {"max_seq_length": 1}},
        },
        {"project": "fuzz", "name": "agent", "base_model": BASE, "return_existing": False},
        {"project": "fuzz", "name": "agent", "base_model": "other/base", "return_existing": True},
    ):
        post(models, body)

    # Model ids in paths.
    for bad in ("nope", "fuzz~missing", "..~..", "fuzz~a%2Fb"):
        cases.append(("GET", f"{models}/{bad}", {}))
        cases.append(("GET", f"{models}/{bad}/checkpoints", {}))
        post(f"{models}/{bad}/log", {"metrics": {"x": 1}})
        cases.append(("DELETE", f"{models}/{bad}", {}))

    # Logging.
    log = f"{models}/{MODEL}/log"
    for body in (
        {},
        {"split": "../x", "metrics": {"x": 1}},
        {"split": 3, "metrics": {"x": 1}},
        {"metrics": {"x": "high"}},
        {"metrics": [1]},
        {"step": -1, "metrics": {"x": 1}},
        {"step": "one", "metrics": {"x": 1}},
        {"model_id": "other~model", "metrics": {"x": 1}},
        {"trajectory_groups": "all"},
        {"trajectory_groups": [{"trajectories": "nope"}]},
        {"trajectory_groups": [{"trajectories": [{"messages_and_choices": "x", "reward": 1}]}]},
        {"trajectory_groups": [{"trajectories": [{"messages_and_choices": [], "reward": None}]}]},
        {"trajectory_groups": [{"trajectories": [{"messages_and_choices": [], "reward": "x"}]}]},
        {
            "trajectory_groups": [
                {
                    "trajectories": [
                        {"messages_and_choices": [{"role": "wizard", "content": "x"}], "reward": 1}
                    ]
                }
            ]
        },
        {"trajectory_groups": [GOOD_GROUP], "extra": True},
    ):
        post(log, body)

    # Checkpoints.
    checkpoints = f"{models}/{MODEL}/checkpoints"
    for query in (
        "limit=0",
        "limit=101",
        "limit=x",
        "order=up",
        "after=zzz",
        "after=fuzz~agent@999",
        "after=other~m@0",
    ):
        cases.append(("GET", f"{checkpoints}?{query}", {}))
    for body in ({}, {"steps": "all"}, {"steps": ["a"]}, {"steps": [1]}, {"steps": [0], "x": 1}):
        cases.append(("DELETE", checkpoints, {"json": body}))

    # Training jobs: the config is checked when the job is created.
    for body in (
        {},
        {"model_id": MODEL},
        {"model_id": MODEL, "trajectory_groups": []},
        {"model_id": "fuzz~missing", "trajectory_groups": [GOOD_GROUP]},
        {"model_id": 5, "trajectory_groups": [GOOD_GROUP]},
        {"model_id": MODEL, "trajectory_groups": [{"trajectories": 1}]},
        {"model_id": MODEL, "trajectory_groups": [GOOD_GROUP], "config": {}},
        {"model_id": MODEL, "trajectory_groups": [GOOD_GROUP], "experimental_config": 3},
    ):
        post(jobs, body)
    for field, value in (
        ("learning_rate", "fast"),
        ("learning_rate", -1),
        ("learning_rate", 0),
        ("epsilon", 0),
        ("epsilon_high", -0.1),
        ("importance_sampling_level", 3),
        ("importance_sampling_level", "bogus"),
        ("ppo", "sometimes"),
        ("scale_rewards", []),
        ("advantage_balance", 3),
        ("kimi_k2_tau", "high"),
        ("mask_prob_ratio", "sometimes"),
        ("precalculate_logprobs", "sometimes"),
        ("truncated_importance_sampling", 0),
        ("max_negative_advantage_importance_sampling_weight", -2.0),
        ("beta", -1),
        ("max_grad_norm", 0),
        ("gradient_accumulation_sequences", 0),
        ("packed_sequence_length", 4),
        ("logprob_calculation_chunk_size", 0),
        ("unknown_knob", 1),
    ):
        post(
            jobs,
            {
                "model_id": MODEL,
                "trajectory_groups": [GOOD_GROUP],
                "experimental_config": {field: value},
            },
        )
    for path in (f"{jobs}/job-missing", f"{jobs}/job-missing/events"):
        cases.append(("GET", path, {}))
    events = f"{jobs}/{job_id}/events"
    for query in ("after=x", "after=-1", "limit=0", "limit=101", "wait=-1", "wait=999", "wait=x"):
        cases.append(("GET", f"{events}?{query}", {}))
    sft_jobs = "/v1/preview/sft-training-jobs"
    missing_upload = f"art-serve:///sft-data/sft-data-{'0' * 32}"
    for body in (
        {"model_id": MODEL, "training_data_url": "x"},
        {"model_id": MODEL},
        {"model_id": MODEL, "training_data_url": "wandb-artifact:///e/p/data:v0"},
        {"model_id": MODEL, "training_data_url": "art-serve:///sft-data/../../model.json"},
        {"model_id": MODEL, "training_data_url": missing_upload},
        {"model_id": "fuzz~missing", "training_data_url": missing_upload},
        {"model_id": MODEL, "training_data_url": missing_upload, "config": {"batch_size": 0}},
        {"model_id": MODEL, "training_data_url": missing_upload, "config": {"epochs": 2}},
    ):
        post(sft_jobs, body)
    for upload in ("nope", "sft-data-..%2F..%2Fmodel", f"sft-data-{'0' * 32}"):
        cases.append(("POST", f"{models}/{MODEL}/sft-data/{upload}", {"content": b"{}\n"}))
    cases.append(("POST", f"{models}/fuzz~missing/sft-data", {"content": b"{}\n"}))
    cases.append(("POST", f"{models}/{MODEL}/sft-data", {"content": b"x" * (2 * 2**20)}))

    # Keys.
    for body in (
        {},
        {"projects": []},
        {"projects": ["../x"]},
        {"models": ["no-slash"]},
        {"models": ["a/../b"]},
        {"projects": "fuzz"},
        {"projects": ["fuzz"], "admin": True},
    ):
        post("/v1/keys", body)
    cases.append(("DELETE", "/v1/keys/key-missing", {}))

    # The OpenAI route.
    for body in (
        {},
        {"model": "wandb-artifact:///local/fuzz/agent"},
        {"model": "wandb-artifact:///local/fuzz/agent", "messages": "Hi"},
        {"model": "wandb-artifact:///local/fuzz/missing", "messages": USER},
        {"model": "wandb-artifact:///other/fuzz/agent", "messages": USER},
        {"model": "wandb-artifact:///local/fuzz/agent:step99", "messages": USER},
        {"model": "agent@x", "messages": USER},
        {"model": 3, "messages": USER},
        {"model": "agent", "messages": [{"role": "wizard", "content": "Hi"}]},
        {"model": "agent", "messages": USER, "max_tokens": -1},
        {"model": "agent", "messages": USER, "temperature": "hot"},
        {"model": "agent", "messages": USER, "n": 0},
        {"model": "agent", "messages": USER, "unknown": 1},
        {"model": "agent", "messages": USER, "tools": "all"},
        {"model": "agent", "messages": USER, "stop": 5},
    ):
        post(chat, body)

    # A key scoped to project `other`, reaching for fuzz/agent.
    scoped = {"Authorization": f"Bearer {scoped_key}"}
    for method, path, body in (
        ("POST", models, {"project": "fuzz", "name": "x", "base_model": BASE}),
        ("POST", models, {"project": "other", "name": "x", "base_model": stored}),
        ("POST", models, {"project": "other", "name": "x", "base_model": "bad\u0000name"}),
        ("GET", f"{models}/{MODEL}", None),
        ("POST", f"{models}/{MODEL}/log", {"metrics": {"x": 1}}),
        ("POST", f"{models}/{MODEL}/sft-data", {"messages": []}),
        ("DELETE", f"{models}/{MODEL}", None),
        ("GET", f"{jobs}/{job_id}", None),
        ("GET", f"{jobs}/{job_id}/events", None),
        ("POST", chat, {"model": "wandb-artifact:///local/fuzz/agent", "messages": USER}),
        ("POST", chat, {"model": "agent", "messages": USER}),
        ("POST", "/v1/keys", {"projects": ["fuzz"]}),
        ("GET", "/v1/keys", None),
    ):
        arguments: dict[str, Any] = {"headers": scoped}
        if body is not None:
            arguments["json"] = body
        cases.append((method, path, arguments))

    # Routes and methods that do not exist.
    cases.append(("GET", "/v1/nothing-here", {}))
    cases.append(("PUT", f"{models}/{MODEL}", {}))
    cases.append(("PATCH", jobs, {}))
    return cases


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("fuzz") / ".art", "--max-body-mb", "1")
    yield running
    running.stop()


async def test_malformed_requests_on_every_route_are_4xx_naming_the_field(
    server: Server,
) -> None:
    # A model with a finished training job, so every route has something real behind it.
    backend = ServerlessBackend(base_url=server.url, api_key=KEY)
    model = art.TrainableModel(name="agent", project="fuzz", base_model=BASE)
    await model.register(backend)
    group = art.TrajectoryGroup.model_validate(GOOD_GROUP)
    group.trajectories.append(group.trajectories[0].model_copy(update={"reward": 0.0}))
    await model.train([group], _config=art.dev.TrainConfig(allow_training_without_logprobs=True))
    await backend.close()
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.root, timeout=300) as http:
        listed = await http.get("/v1/preview/training-jobs", headers=headers)
        job_id = listed.json()["data"][0]["id"]
        key = await http.post("/v1/keys", headers=headers, json={"projects": ["other"]})
        stored = server.path / "fuzz" / "models" / "agent" / "checkpoints" / "0001"
        assert stored.is_dir()
        cases = corpus(job_id, key.json()["key"], str(stored))
        assert len(cases) >= 100
        before = tree_digest(server.path)
        log_before = server.log()

        failures = []
        for method, path, arguments in cases:
            sent = arguments.pop("headers", headers)  # the cases about keys send their own
            response = await http.request(method, path, headers=sent, **arguments)
            try:
                error = response.json().get("error", {})
            except ValueError:  # a body that is not JSON: a failure, shown with the rest
                error = {"text": response.text[:200]}
            param = error.get("param")
            named = isinstance(param, str) and bool(param)
            if not 400 <= response.status_code < 500 or not named:
                failures.append((method, path, arguments, response.status_code, error))
        assert failures == []

        assert (await http.get("/health")).json() == {"status": "ok"}
        answer = await http.post(
            "/v1/chat/completions",
            headers=headers,
            json={"model": model.get_inference_name(), "messages": USER, "max_tokens": 2},
        )
        assert answer.status_code == 200
    assert tree_digest(server.path) == before
    new_log = server.log()[len(log_before) :]
    rejected = [line for line in new_log.splitlines() if "rejected" in line]
    assert len(rejected) == len(cases)
    assert "Traceback" not in new_log
