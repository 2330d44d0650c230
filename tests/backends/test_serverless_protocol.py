"""`art serve` speaks the W&B Training API as ART's published client sends it, and scopes keys.

The requests in the first test are shaped as ART's client (openpipe-art 0.5.18,
`art/serverless/client.py` and `backend.py`) sends them: the same paths, bodies, query
parameters and cursor handling, so a server that answers them serves ART's client.
Everything runs against a real `python -m art serve` on 127.0.0.1 with the real
default model.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest
from helpers import JsonHandler, sampled_choice, serving, tool_trajectory
from openai import AsyncOpenAI
from openai.types.chat.chat_completion import Choice
from serve_server import BASE, KEY, Server

import art
from art.core.store.model_store import ModelStore
from art.serverless.backend import ServerlessBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service

ADMIN = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("protocol") / ".art")
    yield running
    running.stop()


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, headers=ADMIN, timeout=300) as client:
        yield client


async def sampled_groups(openai: AsyncOpenAI, model: str) -> list[dict[str, Any]]:
    """Two groups of rollouts sampled from `model`, dumped as ART's client sends them."""
    groups = []
    for word in ("apple", "river"):
        trajectories = []
        for reward in range(3):
            messages: list[Any] = [{"role": "user", "content": f"Say {word}."}]
            completion = await openai.chat.completions.create(
                model=model, messages=messages, max_tokens=5, logprobs=True
            )
            trajectories.append(
                art.Trajectory(
                    messages_and_choices=[*messages, completion.choices[0]], reward=float(reward)
                )
            )
        groups.append(art.TrajectoryGroup(trajectories).model_dump(mode="json"))
    return groups


async def events_until_ended(http: httpx.AsyncClient, job_id: str) -> list[dict[str, Any]]:
    """ART's loop: list a cursor page `after` the last event id, until training ends."""
    seen: list[dict[str, Any]] = []
    after: str | None = None
    while not seen or seen[-1]["type"] not in ("training_ended", "training_failed"):
        params: dict[str, Any] = {} if after is None else {"after": after}
        while (
            True
        ):  # openai's AsyncCursorPage: next page after the last id, until has_more is false
            page = (await http.get(f"/preview/training-jobs/{job_id}/events", params=params)).json()
            seen.extend(page["data"])
            if page["data"]:
                after = params["after"] = page["data"][-1]["id"]
            if not page["has_more"]:
                break
    return seen


async def test_arts_published_client_requests_train_serve_and_delete_a_model(
    server: Server, http: httpx.AsyncClient
) -> None:
    created = await http.post(
        "/preview/models",
        json={
            "entity": None,
            "project": "wire",
            "name": "agent",
            "base_model": BASE,
            "return_existing": True,
        },
    )
    assert created.status_code == 200, created.text
    model = created.json()
    assert {k: model[k] for k in ("entity", "project", "name", "base_model", "run_id")} == {
        "entity": "local",
        "project": "wire",
        "name": "agent",
        "base_model": BASE,
        "run_id": None,
    }
    again = await http.post(
        "/preview/models",
        json={"project": "wire", "name": "agent", "base_model": BASE, "return_existing": False},
    )
    assert again.status_code == 409
    assert again.json()["error"]["param"] == "name"

    latest = "wandb-artifact:///local/wire/agent"
    openai = AsyncOpenAI(base_url=server.url, api_key=KEY)
    groups = await sampled_groups(openai, latest)
    logged = await http.post(
        f"/preview/models/{model['id']}/log",
        json={"model_id": model["id"], "trajectory_groups": groups, "split": "train"},
    )
    assert logged.status_code == 200, logged.text

    job = await http.post(
        "/preview/training-jobs",
        json={
            "model_id": model["id"],
            "trajectory_groups": groups,
            "experimental_config": {  # what ART 0.5.18 sends for `model.train(groups)`
                "advantage_balance": 0.0,
                "epsilon": None,
                "epsilon_high": None,
                "importance_sampling_level": "token",
                "kimi_k2_tau": None,
                "learning_rate": 1e-3,
                "mask_prob_ratio": False,
                "max_negative_advantage_importance_sampling_weight": None,
                "ppo": False,
                "precalculate_logprobs": False,
                "scale_rewards": True,
            },
        },
    )
    assert job.status_code == 200, job.text
    events = await events_until_ended(http, job.json()["id"])
    assert [e["type"] for e in events] == ["training_started", "gradient_step", "training_ended"]
    assert events[0]["data"]["num_sequences"] == 6
    assert {k: float(v) for k, v in events[1]["data"].items()}  # ART floats every value

    # ART's get_step: the first checkpoint of a descending page of one.
    newest = (
        await http.get(f"/preview/models/{model['id']}/checkpoints?limit=1&order=desc")
    ).json()
    assert [c["step"] for c in newest["data"]] == [1]
    assert newest["has_more"] is True
    everything = (await http.get(f"/preview/models/{model['id']}/checkpoints")).json()
    assert [c["step"] for c in everything["data"]] == [0, 1]
    second = await http.get(
        f"/preview/models/{model['id']}/checkpoints",
        params={"after": everything["data"][0]["id"]},
    )
    assert [c["step"] for c in second.json()["data"]] == [1]

    for name in (latest, f"{latest}:step1", f"{latest}:step0"):
        answer = await openai.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert answer.choices[0].message.content is not None
    served = {m.id for m in (await openai.models.list()).data}
    assert {latest, f"{latest}:step0", f"{latest}:step1"} <= served

    deleted = await http.request(
        "DELETE", f"/preview/models/{model['id']}/checkpoints", json={"steps": [0, 7]}
    )
    assert deleted.json() == {"deleted_count": 1, "not_found_steps": [7], "deleted_steps": [0]}

    # Deleting the model unloads it: no longer listed or served; registering again starts clean.
    gone = await http.delete(f"/preview/models/{model['id']}")
    assert gone.json() == {"model_id": model["id"], "deleted_checkpoints": 1, "deleted_run": False}
    served = {m.id for m in (await openai.models.list()).data}
    assert not any(name.startswith(latest) for name in served)
    with pytest.raises(Exception, match="404"):
        await openai.chat.completions.create(
            model=latest, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
    assert not (server.path / "wire" / "models" / "agent").exists()
    fresh = await http.post(
        "/preview/models",
        json={"project": "wire", "name": "agent", "base_model": BASE, "return_existing": True},
    )
    assert fresh.status_code == 200
    steps = (await http.get(f"/preview/models/{model['id']}/checkpoints")).json()["data"]
    assert [c["step"] for c in steps] == [0]
    assert f"{latest}:step1" not in {m.id for m in (await openai.models.list()).data}
    await openai.close()


async def test_a_managed_only_feature_is_refused_by_name(http: httpx.AsyncClient) -> None:
    sft = await http.post(
        "/preview/sft-training-jobs",
        json={"model_id": "wire~agent", "training_data_url": "wandb-artifact:///e/p/data"},
    )
    assert sft.status_code == 400
    error = sft.json()["error"]
    assert error["code"] == "managed_only"
    assert "managed W&B Training service" in error["message"]


async def test_the_backend_can_be_awaited_as_arts_docs_write_it(server: Server) -> None:
    backend = await ServerlessBackend(base_url=server.url, api_key=KEY)
    assert isinstance(backend, ServerlessBackend)
    model = art.TrainableModel(name="awaited", project="wire", base_model=BASE)
    await model.register(backend)
    assert model.get_inference_name() == "wandb-artifact:///local/wire/awaited"
    assert model.get_inference_name(0) == "wandb-artifact:///local/wire/awaited:step0"
    assert await model.get_step() == 0
    await backend.delete(model)  # ART's `backend.delete(model)`
    assert not (server.path / "wire" / "models" / "awaited").exists()
    await backend.close()


async def test_training_config_is_checked_when_the_job_is_created(
    server: Server, http: httpx.AsyncClient
) -> None:
    """A bad value is a 400 naming it at job creation, never a job that fails later."""
    await http.post(
        "/preview/models",
        json={"project": "wire", "name": "checked", "base_model": BASE, "return_existing": True},
    )
    group = art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"},
                ],
                reward=float(reward),
            )
            for reward in range(2)
        ]
    ).model_dump(mode="json")
    cases = {
        "learning_rate": "fast",
        "epsilon": -1,
        "importance_sampling_level": "per-word",
        "advantage_balance": 1.5,
        "beta": -2,
        "no_such_knob": 1,
    }
    for field, value in cases.items():
        response = await http.post(
            "/preview/training-jobs",
            json={
                "model_id": "wire~checked",
                "trajectory_groups": [group],
                "experimental_config": {field: value},
            },
        )
        assert response.status_code == 400, (field, response.text)
        assert response.json()["error"]["param"] == f"experimental_config.{field}"
    jobs = (await http.get("/preview/training-jobs", params={"model_id": "wire~checked"})).json()
    assert jobs["data"] == []  # none was started


async def test_internal_config_at_model_creation_is_checked_by_json_path(
    http: httpx.AsyncClient,
) -> None:
    cases = [
        ({"engine_args": {"max_num_seqs": -1}}, "internal_config.engine_args.max_num_seqs"),
        ({"engine_args": {"nope": 1}}, "internal_config.engine_args.nope"),
        ({"no_such_field": True}, "internal_config.no_such_field"),
        ({"trainer_gpu_ids": [0], "inference_gpu_ids": [0]}, "internal_config"),
    ]
    for internal, param in cases:
        response = await http.post(
            "/preview/models",
            json={
                "project": "wire",
                "name": "cfg",
                "base_model": BASE,
                "internal_config": internal,
            },
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param


# --- access --------------------------------------------------------------------------------


async def scoped_key(http: httpx.AsyncClient, **scope: list[str]) -> dict[str, Any]:
    created = await http.post("/keys", json={"name": "team", **scope})
    assert created.status_code == 200, created.text
    key: dict[str, Any] = created.json()
    return key


async def test_a_scoped_key_touches_only_its_models(
    server: Server, http: httpx.AsyncClient
) -> None:
    team = await scoped_key(http, projects=["team-a"])
    assert "sha256" not in team
    assert team["key"].startswith("art-")
    assert KEY not in (server.path / ".art-serve" / "keys.json").read_text()
    assert team["key"] not in (server.path / ".art-serve" / "keys.json").read_text()

    # The admin registers another team's model; the scoped key registers its own.
    theirs = art.TrainableModel(name="beta", project="team-b", base_model=BASE)
    await theirs.register(ServerlessBackend(base_url=server.url, api_key=KEY))
    mine = art.TrainableModel(name="alpha", project="team-a", base_model=BASE)
    await mine.register(ServerlessBackend(base_url=server.url, api_key=team["key"]))
    with pytest.raises(art.BackendError, match="403"):
        await art.TrainableModel(name="x", project="team-b", base_model=BASE).register(
            ServerlessBackend(base_url=server.url, api_key=team["key"])
        )
    # Nor may it start its own model from another's checkpoint on the server's disk.
    stolen = server.path / "team-b" / "models" / "beta" / "checkpoints" / "0000"
    assert stolen.is_dir()
    with pytest.raises(art.BackendError, match="403"):
        await art.TrainableModel(name="copy", project="team-a", base_model=str(stolen)).register(
            ServerlessBackend(base_url=server.url, api_key=team["key"])
        )

    as_team = {"Authorization": f"Bearer {team['key']}"}
    async with httpx.AsyncClient(base_url=server.url, headers=as_team, timeout=300) as scoped:
        other = "team-b~beta"
        refused = [
            await scoped.get(f"/preview/models/{other}"),
            await scoped.get(f"/preview/models/{other}/checkpoints"),
            await scoped.post(f"/preview/models/{other}/log", json={"metrics": {"x": 1}}),
            await scoped.request(
                "DELETE", f"/preview/models/{other}/checkpoints", json={"steps": [0]}
            ),
            await scoped.post(
                "/preview/training-jobs",
                json={"model_id": other, "trajectory_groups": [{"trajectories": []}]},
            ),
            await scoped.delete(f"/preview/models/{other}"),
            await scoped.post("/keys", json={"projects": ["team-b"]}),
            await scoped.get("/keys"),
        ]
        assert [r.status_code for r in refused] == [403] * len(refused)
        # At the OpenAI route another tenant's model is as unknown as a missing one: a
        # 403 there would tell this key which names exist (#39).
        for name in ("beta", "no-such-model"):
            hidden = await scoped.post(
                "/chat/completions",
                json={
                    "model": f"wandb-artifact:///local/team-b/{name}",
                    "messages": [{"role": "user", "content": "Hi"}],
                },
            )
            assert hidden.status_code == 404, hidden.text
        # The name alone finds only the models this key may use.
        unknown = await scoped.post(
            "/chat/completions",
            json={"model": "beta", "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert unknown.status_code == 404
        # Nor does the model service's own name for it (`project/name`) reach it.
        by_service_name = await scoped.post(
            "/chat/completions",
            json={"model": "team-b/beta", "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert by_service_name.status_code in (403, 404), by_service_name.text
        listed = {m["id"] for m in (await scoped.get("/models")).json()["data"]}
        assert "wandb-artifact:///local/team-a/alpha" in listed
        assert not any("team-b" in name for name in listed)
        assert BASE in listed  # base models serve every key

        own = await scoped.post(
            "/chat/completions",
            json={
                "model": mine.get_inference_name(),
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 3,
            },
        )
        assert own.status_code == 200, own.text
        assert (server.path / "team-b" / "models" / "beta" / "model.json").is_file()

        revoked = await http.delete(f"/keys/{team['id']}")
        assert revoked.status_code == 200
        assert (await scoped.get("/preview/models/team-a~alpha")).status_code == 401


async def test_the_schema_and_docs_need_a_key_sent_as_bearer(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.root, timeout=60) as http:
        for path in ("/openapi.json", "/docs"):
            assert (await http.get(path)).status_code == 401
            assert (await http.get(path, headers=ADMIN)).status_code == 200
        without_scheme = await http.get("/v1/models", headers={"Authorization": KEY})
        assert without_scheme.status_code == 401
        assert without_scheme.json()["error"]["param"] == "Authorization"
        basic = await http.get("/v1/models", headers={"Authorization": f"Basic {KEY}"})
        assert basic.status_code == 401
        assert (await http.get("/health")).status_code == 200


# --- a server without our extensions ----------------------------------------------------------


class _PlainTrainingApi(JsonHandler):
    """A stand-in for a server that speaks the W&B Training API without our extensions.

    It answers model creation with the documented fields only and a log with `null`, as
    the managed service's API reference describes them; a training job is `{id}`, and its
    events are ART 0.5.18's client's `TrainingJobEvent`s (`id`, `type`, `data`) in a cursor
    page, each job adding a checkpoint.
    """

    def do_POST(self) -> None:
        body = self.read_json()
        if self.path.endswith("/preview/training-jobs"):
            _PlainTrainingApi.checkpoints.append(max(_PlainTrainingApi.checkpoints) + 1)
            self.send_json({"id": f"job-{len(_PlainTrainingApi.checkpoints)}"})
        elif self.path.endswith("/preview/models"):
            self.send_json(
                {
                    "id": "3fa85f64-5717-4562-b3fc-2c963f66afa6",
                    "entity": "someone",
                    "project": body["project"],
                    "name": body["name"],
                    "base_model": body["base_model"],
                    "run_id": None,
                }
            )
        else:
            self._send_null()

    def do_GET(self) -> None:
        """A job's events, or the checkpoints, with no metrics: the service's list."""
        if "/preview/training-jobs/" in self.path:
            events = [
                ("training_started", {}),
                ("gradient_step", {"loss": 0.25, "grad_norm": 1.5}),
                ("training_ended", {}),
            ]
            data = [{"id": f"e{i}", "type": t, "data": d} for i, (t, d) in enumerate(events)]
            self.send_json({"data": data, "has_more": False})
            return
        steps = [s for s in _PlainTrainingApi.checkpoints if s not in _PlainTrainingApi.deleted]
        if "order=desc" in self.path:
            steps.reverse()
        data = [{"id": f"ckpt-{s}", "step": s} for s in steps]
        self.send_json({"data": data, "has_more": False})

    def do_DELETE(self) -> None:
        _PlainTrainingApi.deleted.extend(self.read_json()["steps"])
        self._send_null()

    def _send_null(self) -> None:
        payload = b"null"
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    deleted: ClassVar[list[int]] = []
    checkpoints: ClassVar[list[int]] = [1, 2, 3]


async def test_the_client_refuses_extensions_a_server_does_not_acknowledge(
    tmp_path: Path,
) -> None:
    """Against a server without our extensions, nothing we send is silently dropped: what
    it does not store is refused, or (a log's step and metrics) kept on the client's side
    as ART's client keeps them."""
    with serving(_PlainTrainingApi) as url:
        backend = ServerlessBackend(base_url=url, api_key="k", path=tmp_path)
        plain = art.TrainableModel(name="agent", project="p", base_model=BASE)
        await plain.register(backend)  # the documented fields are enough
        assert plain.entity == "someone"
        assert plain.get_inference_name(3) == "wandb-artifact:///someone/p/agent:step3"

        tuned = art.TrainableModel(
            name="tuned",
            project="p",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(
                engine_args=art.dev.EngineArgs(max_num_seqs=4)
            ),
        )
        with pytest.raises(art.ConfigError) as refused:
            await tuned.register(backend)
        assert refused.value.field == "_internal_config"

        # From step 0, before any metric: ART's note, the latest kept, nothing refused.
        _PlainTrainingApi.deleted.clear()
        _PlainTrainingApi.checkpoints[:] = [1, 2, 3]
        assert await plain.delete_checkpoints("val/score") == [1, 2]
        _PlainTrainingApi.deleted.clear()

        await plain.log(metrics={"score": 1.0}, step=2)
        await plain.log(metrics={"score": 0.5}, step=3)
        group = art.TrajectoryGroup([tool_trajectory(1.0), tool_trajectory(0.0)])
        await plain.log([group], step=3)
        run = ModelStore(tmp_path, "p", "agent")
        rows = run.read_history()
        assert [(row["step"], row.get("val/score")) for row in rows] == [
            (2, 1.0),
            (3, 0.5),
            (3, None),
        ]
        assert rows[2]["val/reward"] == 0.5
        assert len(run.read_trajectories("val", 3)[0].trajectories) == 2
        # The metric the server does not keep ranks the checkpoints from the kept history.
        assert await plain.delete_checkpoints("val/score") == [1]

        # Training: ART's call and ours, each followed to its end through the job's events.
        def sampled(text: str, reward: float) -> art.Trajectory:
            choice = sampled_choice(text).model_dump() | {
                "prompt_token_ids": [5, 6],
                "token_ids": [7, 8],
            }
            return art.Trajectory(
                messages_and_choices=[
                    {"role": "user", "content": "Hi"},
                    Choice.model_validate(choice),
                ],
                reward=reward,
            )

        group = art.TrajectoryGroup([sampled("a b", 1.0), sampled("c d", 0.0)])
        result = await backend.train(plain, [group], learning_rate=1e-5)
        assert (result.step, result.metrics["loss/train"]) == (4, 0.25)  # under ART's name
        assert result.artifact_name == "someone/p/agent:step4"
        await plain.train([group])  # its row (at the step sampled from) is kept here
        assert await plain.get_step() == 5
        trained = [row for row in run.read_history() if "loss/grad_norm" in row]
        assert [(row["step"], row["loss/train"]) for row in trained] == [(4, 0.25)]
        await backend.close()
