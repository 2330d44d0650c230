"""`art serve` between tenants: what one scoped key can do to another's models, and input
that once answered 500 (issue #39's cases, each reproduced before its fix).

One real `art serve` on 127.0.0.1 with the default model; tenant A's key is scoped to
projects `HuggingFaceTB` and `proj-a`, tenant B's to `proj-b`.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from serve_server import BASE, KEY, Server

pytestmark = pytest.mark.model  # starts art serve with the default model

MODELS = "/v1/preview/models"
USER = [{"role": "user", "content": "Say hi."}]
EXAMPLE = {
    "messages": [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi."},
    ]
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("tenancy") / ".art", "--max-body-mb", "1")
    yield running
    running.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def clients(server: Server) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """httpx clients of the admin and of tenants A and B, each with its own key."""
    admin = httpx.AsyncClient(
        base_url=server.root, headers={"Authorization": f"Bearer {KEY}"}, timeout=300
    )
    made = {"admin": admin}
    for tenant, projects in (("a", ["HuggingFaceTB", "proj-a"]), ("b", ["proj-b"])):
        key = (await admin.post("/v1/keys", json={"name": tenant, "projects": projects})).json()
        made[tenant] = httpx.AsyncClient(
            base_url=server.root, headers={"Authorization": f"Bearer {key['key']}"}, timeout=300
        )
    yield made
    for client in made.values():
        await client.aclose()


async def register(client: httpx.AsyncClient, project: str, name: str) -> str:
    created = await client.post(MODELS, json={"project": project, "name": name, "base_model": BASE})
    assert created.status_code == 200, created.text
    return f"{project}~{name}"


async def upload(client: httpx.AsyncClient, model_id: str, data: bytes) -> httpx.Response:
    return await client.post(f"{MODELS}/{model_id}/sft-data", content=data)


def refused(response: httpx.Response, status: int, param: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["param"] == param, error
    return error


def bad_data(response: httpx.Response, url: str) -> dict[str, Any]:
    """A job refused for its data: bad lines are named by the upload's URL (the client
    raises `SFTDataError` with it), an upload with none by the field."""
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["param"] in (url, "training_data_url"), error
    return error


async def finished(client: httpx.AsyncClient, job_id: str) -> str:
    """The job's status once it has ended."""
    status = "running"
    while status not in ("succeeded", "failed"):
        await asyncio.sleep(0.5)
        status = (await client.get(f"/v1/preview/training-jobs/{job_id}")).json()["status"]
    return status


async def greedy(client: httpx.AsyncClient, model: str) -> str:
    answer = await client.post(
        "/v1/chat/completions",
        json={"model": model, "messages": USER, "max_tokens": 6, "temperature": 0},
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


async def test_a_tenant_cannot_take_over_the_base_models_name(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    """Case 1: a key scoped to project `HuggingFaceTB` registering `SmolLM2-135M-Instruct`
    would have answered every tenant's requests for the base with its own adapter."""
    a, b = clients["a"], clients["b"]
    await register(b, "proj-b", "agent")  # the base is loaded with its first model
    base_before = await greedy(b, BASE)
    taken = await a.post(
        MODELS,
        json={"project": "HuggingFaceTB", "name": "SmolLM2-135M-Instruct", "base_model": BASE},
    )
    error = refused(taken, 400, "name")
    assert "base model" in error["message"]
    assert await greedy(b, BASE) == base_before
    # A model whose bare name is a base's keeps its full name; the base keeps its own.
    listed = (await b.get("/v1/models")).json()["data"]
    assert [m["id"] for m in listed].count(BASE) == 1


async def test_a_deleted_model_stays_deleted_when_logs_race_its_delete(
    server: Server, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Case 2: logs that lost the race to a DELETE recreated history.jsonl and Parquet files,
    and the name registered again showed the deleted metrics."""
    a = clients["a"]
    model_id = await register(a, "proj-a", "racer")
    group = {
        "trajectories": [
            {"messages_and_choices": [*USER, {"role": "assistant", "content": "Hi"}], "reward": 1}
        ]
    }
    body = {"metrics": {"score": 1.0}, "trajectory_groups": [group]}
    answers = await asyncio.gather(
        a.delete(f"{MODELS}/{model_id}"),
        *(a.post(f"{MODELS}/{model_id}/log", json=body) for _ in range(6)),
    )
    assert answers[0].status_code == 200, answers[0].text
    assert {r.status_code for r in answers[1:]} <= {200, 404}
    assert not (server.path / "proj-a" / "models" / "racer").exists()
    await register(a, "proj-a", "racer")
    listed = (await a.get(f"{MODELS}/{model_id}/checkpoints")).json()["data"]
    assert all("score" not in row["metrics"] for row in listed)
    assert not (server.path / "proj-a" / "models" / "racer" / "history.jsonl").exists()


async def test_a_metric_beyond_a_float_is_refused_and_a_history_holding_one_lists(
    server: Server, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Case 3: one log of a 401-digit integer made every later checkpoint listing a 500."""
    a = clients["a"]
    model_id = await register(a, "proj-a", "metrics")
    log = f"{MODELS}/{model_id}/log"
    huge = '{"metrics": {"big": 1' + "0" * 400 + "}}"
    headers = {"Content-Type": "application/json"}
    refused(await a.post(log, content=huge, headers=headers), 400, "metrics['big']")
    refused(await a.post(log, json={"metrics": {"x": 1}, "step": 10**300}), 400, "step")
    # A history written before the check (by hand here) still lists, without the value.
    history = server.path / "proj-a" / "models" / "metrics" / "history.jsonl"
    history.write_text('{"step": 0, "big": 1' + "0" * 400 + ', "ok": 2}\n')
    listed = await a.get(f"{MODELS}/{model_id}/checkpoints")
    assert listed.status_code == 200, listed.text
    assert (await a.post(log, json={"metrics": {"fine": 1e300}})).status_code == 200


async def test_sft_uploads_are_checked_at_the_job_and_removed_with_their_model(
    server: Server, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Cases 4 and 5: bad bytes, gzip, deep nesting and 5000-digit numbers in an upload
    were 500s; an empty upload trained a step of nothing; a batch size of 10**30 was
    accepted; uploads outlived their model; a 128-character project and name failed
    with a file name too long."""
    a = clients["a"]
    model_id = await register(a, "proj-a", "sft")
    jobs = "/v1/preview/sft-training-jobs"
    uploads = server.path / ".art-serve" / "sft-data"

    def uploaded() -> list[Path]:
        return sorted(path for path in uploads.rglob("*.jsonl"))

    line = json.dumps(EXAMPLE).encode() + b"\n"
    for data in (
        b"\xff\xfe" + line,
        gzip.compress(line),
        b"[" * 100_000 + b"\n",
        b'{"messages": ' + b"1" * 5000 + b"}\n",
        b"",
    ):
        url = (await upload(a, model_id, data)).json()["url"]
        job = await a.post(jobs, json={"model_id": model_id, "training_data_url": url})
        bad_data(job, url)
        assert uploaded() == []  # a refused upload can never train: it is removed

    # 100k bad lines: the error lists the first 50 and counts the rest.
    url = (await upload(a, model_id, b"{}\n" * 100_000)).json()["url"]
    job = await a.post(jobs, json={"model_id": model_id, "training_data_url": url})
    error = bad_data(job, url)
    assert len(job.content) < 100_000
    assert (len(error["problems"]), error["problems_total"]) == (50, 100_000)

    url = (await upload(a, model_id, line)).json()["url"]
    big_batch = {"model_id": model_id, "training_data_url": url, "config": {"batch_size": 10**30}}
    refused(await a.post(jobs, json=big_batch), 400, "config.batch_size")
    assert len(uploaded()) == 1
    assert (await a.delete(f"{MODELS}/{model_id}")).status_code == 200
    assert uploaded() == []  # gone with its model

    long_id = await register(a, "proj-a", "n" * 128)
    assert (await upload(a, long_id, line)).status_code == 200
    admin = clients["admin"]
    longest = await register(admin, "p" * 128, "n" * 128)
    assert (await upload(admin, longest, line)).status_code == 200


async def test_cursors_steps_and_bodies_that_were_500s_are_4xx(
    server: Server, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Case 5: `²` is a digit to `str.isdigit` but not to `int`; 5000 digits pass
    `isdigit` and fail `int`; a chunked body over the limit slipped past the body limit
    inside an ExceptionGroup."""
    a = clients["a"]
    model_id = await register(a, "proj-a", "cursors")
    checkpoints = f"{MODELS}/{model_id}/checkpoints"
    for after in ("²", "1" * 5000, f"{model_id}@²", f"{model_id}@{'1' * 5000}"):
        refused(await a.get(checkpoints, params={"after": after}), 400, "after")
    for model in ("cursors@²", "cursors@" + "1" * 5000):
        answer = await a.post("/v1/chat/completions", json={"model": model, "messages": USER})
        refused(answer, 404, "model")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b" " * 2**20  # 3 MiB in all, over this server's 1 MiB, with no length

    answer = await a.post(f"{MODELS}/{model_id}/log", content=chunks())
    refused(answer, 413, "body")


async def test_a_tenant_learns_nothing_of_anothers_models_or_the_servers_files(
    server: Server, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Case 6: a 403 for B's model where a missing one was a 404; `base_model` paths
    answered differently as they existed or not; a fork's 404 printed the server's
    `--path`; a project `"proj-a\\n"` was taken by the `$` of a regex."""
    a, b = clients["a"], clients["b"]
    await register(b, "proj-b", "secret")
    answers = []
    for name in ("secret", "missing"):
        model = f"wandb-artifact:///local/proj-b/{name}"
        answer = await a.post("/v1/chat/completions", json={"model": model, "messages": USER})
        answers.append((answer.status_code, answer.json()["error"]["param"]))
    assert answers == [(404, "model"), (404, "model")]

    messages = set()
    for path in ("/etc", "/nonexistent", "~/.ssh", "../..", str(server.path)):
        body = {"project": "proj-a", "name": "probe", "base_model": path}
        messages.add(refused(await a.post(MODELS, json=body), 403, "base_model")["message"])
    assert len(messages) == 1

    target = await register(a, "proj-a", "fork-into")
    empty = {"project": "proj-a", "name": "empty", "trainable": False}  # no checkpoints
    assert (await a.post(MODELS, json=empty)).status_code == 200
    forked = await a.post(f"{MODELS}/{target}/fork", json={"from_model": "empty"})
    refused(forked, 404, "from_model")
    assert str(server.path) not in forked.text

    newline = await clients["admin"].post("/v1/keys", json={"projects": ["proj-a\n"]})
    refused(newline, 400, "projects[0]")


async def test_deleting_checkpoints_while_a_job_trains_is_a_409(
    clients: dict[str, httpx.AsyncClient],
) -> None:
    """Case 7: the DELETE waited for the job's end where every other conflicting call
    answers 409 at once."""
    a = clients["a"]
    model_id = await register(a, "proj-a", "busy")
    url = (await upload(a, model_id, (json.dumps(EXAMPLE) + "\n").encode() * 8)).json()["url"]
    job = await a.post(
        "/v1/preview/sft-training-jobs",
        json={"model_id": model_id, "training_data_url": url, "config": {"batch_size": 1}},
    )
    assert job.status_code == 200, job.text
    deleted = await a.request("DELETE", f"{MODELS}/{model_id}/checkpoints", json={"steps": [0]})
    refused(deleted, 409, "model_id")
    assert await finished(a, job.json()["id"]) == "succeeded"


def test_a_keys_uploads_not_yet_trained_are_bounded_by_its_quota(tmp_path: Path) -> None:
    """Case 4: 240 MiB went up in four 60 MiB parts with no quota. Here 1,048 bytes
    (`--upload-quota-mb 0.001`) on a server of plain (logging-only) models: no weights."""
    server = Server(tmp_path / ".art", "--upload-quota-mb", "0.001")
    try:
        admin = httpx.Client(base_url=server.root, headers={"Authorization": f"Bearer {KEY}"})
        key = admin.post("/v1/keys", json={"projects": ["q"]}).json()["key"]
        tenant = httpx.Client(base_url=server.root, headers={"Authorization": f"Bearer {key}"})
        for name in ("one", "two"):
            created = tenant.post(MODELS, json={"project": "q", "name": name, "trainable": False})
            assert created.status_code == 200, created.text
        first = tenant.post(f"{MODELS}/q~one/sft-data", content=b"x" * 600)
        assert first.status_code == 200, first.text
        # Over the quota whether as a new upload, on another model, or as a part appended.
        refused(tenant.post(f"{MODELS}/q~two/sft-data", content=b"x" * 600), 413, "body")
        upload_id = first.json()["id"]
        appended = tenant.post(f"{MODELS}/q~one/sft-data/{upload_id}", content=b"x" * 600)
        error = refused(appended, 413, "body")
        assert "--upload-quota-mb" in error["message"]
        assert tenant.post(f"{MODELS}/q~two/sft-data", content=b"x" * 400).status_code == 200
        # The admin key has no quota; a deleted model's uploads free the key's.
        assert admin.post(f"{MODELS}/q~one/sft-data", content=b"x" * 2000).status_code == 200
        assert tenant.delete(f"{MODELS}/q~one").status_code == 200
        assert tenant.post(f"{MODELS}/q~two/sft-data", content=b"x" * 600).status_code == 200
    finally:
        server.stop()


# --- what one tenant can see or change of another's, route by route ---------------------

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "serve.md"
LISTINGS = {"GET /v1/models", "GET /v1/preview/training-jobs?model_id="}  # 200: own only
TABLE_START, TABLE_END = "<!-- tenancy table: start -->", "<!-- tenancy table: end -->"


async def tenant_resources(client: httpx.AsyncClient, project: str) -> dict[str, str]:
    """A tenant's model with a finished SFT job and an upload not yet trained."""
    model_id = await register(client, project, "owned")
    line = (json.dumps(EXAMPLE) + "\n").encode()
    url = (await upload(client, model_id, line)).json()["url"]
    job = await client.post(
        "/v1/preview/sft-training-jobs", json={"model_id": model_id, "training_data_url": url}
    )
    assert job.status_code == 200, job.text
    job_id = job.json()["id"]
    assert await finished(client, job_id) == "succeeded"
    upload_id = (await upload(client, model_id, line)).json()["id"]
    return {"project": project, "model_id": model_id, "job_id": job_id, "upload_id": upload_id}


def cross_tenant_requests(
    mine: dict[str, str], theirs: dict[str, str]
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(route, method, path, arguments): each route of art serve aimed at the other
    tenant's model, job or upload, or at its project."""
    model, job, project = theirs["model_id"], theirs["job_id"], theirs["project"]
    example = (json.dumps(EXAMPLE) + "\n").encode()
    upload_url = f"art-serve:///sft-data/{theirs['upload_id']}"
    group = {
        "trajectories": [
            {"messages_and_choices": [*USER, {"role": "assistant", "content": "Hi"}], "reward": r}
            for r in (0.0, 1.0)
        ]
    }
    return [
        (
            "POST /v1/preview/models",
            "POST",
            MODELS,
            {"json": {"project": project, "name": "planted", "base_model": BASE}},
        ),
        ("GET /v1/preview/models/{id}", "GET", f"{MODELS}/{model}", {}),
        ("DELETE /v1/preview/models/{id}", "DELETE", f"{MODELS}/{model}", {}),
        (
            "POST /v1/preview/models/{id}/log",
            "POST",
            f"{MODELS}/{model}/log",
            {"json": {"metrics": {"x": 1}}},
        ),
        ("GET /v1/preview/models/{id}/checkpoints", "GET", f"{MODELS}/{model}/checkpoints", {}),
        (
            "DELETE /v1/preview/models/{id}/checkpoints",
            "DELETE",
            f"{MODELS}/{model}/checkpoints",
            {"json": {"steps": [0]}},
        ),
        (
            "POST /v1/preview/models/{id}/fork (into theirs)",
            "POST",
            f"{MODELS}/{model}/fork",
            {"json": {"from_model": "owned", "from_project": mine["project"]}},
        ),
        (
            "POST /v1/preview/models/{id}/fork (from theirs)",
            "POST",
            f"{MODELS}/{mine['model_id']}/fork",
            {"json": {"from_model": "owned", "from_project": project}},
        ),
        (
            "PUT /v1/preview/models/{id}/checkpoints/{step}",
            "PUT",
            f"{MODELS}/{model}/checkpoints/9",
            {"content": b"not a zip"},
        ),
        (
            "POST /v1/preview/training-jobs",
            "POST",
            "/v1/preview/training-jobs",
            {
                "json": {
                    "model_id": model,
                    "trajectory_groups": [group],
                    "experimental_config": {"allow_training_without_logprobs": True},
                }
            },
        ),
        (
            "GET /v1/preview/training-jobs?model_id=",
            "GET",
            f"/v1/preview/training-jobs?model_id={model}",
            {},
        ),
        ("GET /v1/preview/training-jobs/{id}", "GET", f"/v1/preview/training-jobs/{job}", {}),
        (
            "GET /v1/preview/training-jobs/{id}/events",
            "GET",
            f"/v1/preview/training-jobs/{job}/events",
            {},
        ),
        (
            "POST /v1/preview/models/{id}/sft-data",
            "POST",
            f"{MODELS}/{model}/sft-data",
            {"content": example},
        ),
        (
            "POST /v1/preview/models/{id}/sft-data/{upload}",
            "POST",
            f"{MODELS}/{model}/sft-data/{theirs['upload_id']}",
            {"content": example},
        ),
        (
            "POST /v1/preview/sft-training-jobs (their model)",
            "POST",
            "/v1/preview/sft-training-jobs",
            {"json": {"model_id": model, "training_data_url": upload_url}},
        ),
        (
            "POST /v1/preview/sft-training-jobs (their upload)",
            "POST",
            "/v1/preview/sft-training-jobs",
            {"json": {"model_id": mine["model_id"], "training_data_url": upload_url}},
        ),
        (
            "POST /v1/chat/completions",
            "POST",
            "/v1/chat/completions",
            {"json": {"model": f"wandb-artifact:///local/{project}/owned", "messages": USER}},
        ),
        (
            "POST /v1/chat/completions (name@step)",
            "POST",
            "/v1/chat/completions",
            {"json": {"model": f"{project}/owned@0", "messages": USER}},
        ),
        ("GET /v1/models", "GET", "/v1/models", {}),
        ("POST /v1/keys", "POST", "/v1/keys", {"json": {"projects": [project]}}),
        ("GET /v1/keys", "GET", "/v1/keys", {}),
        ("DELETE /v1/keys/{id}", "DELETE", "/v1/keys/key-000000000000", {}),
    ]


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix != ".lock"
    }


async def test_each_route_between_two_tenants_is_the_table_in_the_serve_guide(
    server: Server, clients: dict[str, httpx.AsyncClient]
) -> None:
    """Every route, aimed by each tenant at the other's model, job, upload or project:
    refused (403, or 404 as for what does not exist; a listing answers 200 with the
    caller's own only), nothing of the other's changed on disk, none of its names in the
    answer that the request did not send. The table this makes is the one in docs/guides/serve.md."""
    tenants = {"A": clients["a"], "B": clients["b"]}
    owned = {
        "A": await tenant_resources(clients["a"], "proj-a"),
        "B": await tenant_resources(clients["b"], "proj-b"),
    }
    answers: dict[str, dict[str, int]] = {}
    failures = []
    for actor, victim in (("A", "B"), ("B", "A")):
        theirs = owned[victim]
        victim_dir = server.path / theirs["project"]
        before = tree(victim_dir)
        for route, method, path, arguments in cross_tenant_requests(owned[actor], theirs):
            response = await tenants[actor].request(method, path, **arguments)
            answers.setdefault(route, {})[actor] = response.status_code
            sent = json.dumps(arguments.get("json", "")) + path
            if response.status_code not in (403, 404) and route not in LISTINGS:
                failures.append(f"{actor} on {victim}: {route}: {response.status_code}")
            leaked = [
                name
                for name in (theirs["project"], theirs["job_id"], theirs["upload_id"])
                if name in response.text and name not in sent
            ]
            if leaked:
                failures.append(f"{actor} on {victim}: {route}: answer names {leaked}")
        if tree(victim_dir) != before:
            failures.append(f"{actor} changed {victim}'s files")
    assert failures == []

    lines = [
        "| route, aimed at the other tenant's model, job, upload or project | A on B's | B on A's |",
        "|---|---:|---:|",
        *(f"| `{route}` | {row['A']} | {row['B']} |" for route, row in answers.items()),
    ]
    table = "\n".join(lines)
    guide = GUIDE.read_text()
    shown = "\n".join(  # indented in the guide's list
        line.strip()
        for line in guide.split(TABLE_START)[1].split(TABLE_END)[0].strip().splitlines()
    )
    assert shown == table, f"docs/guides/serve.md shows another table; this run's:\n{table}"
