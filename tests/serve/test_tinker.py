"""Tinker's API on `art serve`, driven by the real `tinker` SDK (0.38.0) on the default model.

One `art serve` on 127.0.0.1. The SDK is used as its users use it: `ServiceClient`,
training and sampling clients, futures, `RestClient`; only `base_url` and the key differ
from code written for the hosted service.
"""

from __future__ import annotations

import contextlib
import math
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from serve_server import BASE, KEY, Server

from art.core.data.wandb_names import inference_name
from art.runtime import models

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

pytestmark = pytest.mark.model  # starts art serve with the default model

PROMPT = [{"role": "user", "content": "Name a colour."}]
SNIPPET = Path(__file__).resolve().parents[2] / "docs" / "snippets" / "tinker_rl_loop.py"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("tinker") / ".art")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def keys(server: Server) -> dict[str, str]:
    """Tinker keys (`tml-` + an art serve key) of the admin and of tenants A and B."""
    made = {"admin": f"tml-{KEY}"}
    for tenant, project in (("a", "proj-a"), ("b", "proj-b")):
        created = httpx.post(
            f"{server.root}/v1/keys",
            json={"name": tenant, "projects": [project]},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        made[tenant] = f"tml-{created.json()['key']}"
    return made


@contextlib.contextmanager
def client(server: Server, key: str) -> Iterator[Any]:
    """A `ServiceClient` of `key`, closed (its session finished) at the end."""
    with tinker.ServiceClient(base_url=server.root, api_key=key) as service:
        yield service


def rest(server: Server, key: str) -> Any:
    return tinker.RestClient(base_url=server.root, api_key=key)


def datums_for(
    prompt: list[int], sequences: list[Any], advantages: list[float]
) -> list[types.Datum]:
    """Tinker's RL datums: the prompt and completion shifted by one, the sampler's
    logprobs and each completion's advantage on its own tokens."""
    data = []
    for sequence, advantage in zip(sequences, advantages, strict=True):
        tokens = prompt + list(sequence.tokens)
        pad = [0.0] * (len(prompt) - 1)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": pad + list(sequence.logprobs),
                    "advantages": pad + [advantage] * len(sequence.tokens),
                },
            )
        )
    return data


# The dtype the server samples and scores in ('auto': bfloat16 on a CPU with native bf16).
SERVED_DTYPE = models.torch_dtype("auto")


def assert_scored_as_drawn(scored: list[float], drawn: list[float]) -> None:
    """compute_logprobs gives the sampler's logprobs back: within 2e-3 in float32. In
    bfloat16 the engine's decode steps and the trainer's forward each round differently
    (on an AVX512-BF16 EPYC, 2026-11-30: each 0.03-0.07 a token on average from a float32
    forward, 0.03-0.11 from each other, at most 0.41 on one token of 24 samples), so there
    the mean difference is bounded: a token out of place or another model's weights moves
    it by nats."""
    assert len(scored) == len(drawn)
    if SERVED_DTYPE is torch.float32:
        assert scored == pytest.approx(drawn, abs=2e-3)
        return
    differences = [abs(a - b) for a, b in zip(scored, drawn, strict=True)]
    assert sum(differences) / len(differences) < 0.15, (scored, drawn)
    assert max(differences) < 1.0, (scored, drawn)


def completion_logprob(sampler: Any, prompt: list[int], completion: list[int]) -> float:
    values = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + completion)).result()
    assert values[0] is None
    assert len(values) == len(prompt) + len(completion)
    return float(sum(values[len(prompt) :]))


def test_a_group_trains_the_rewarded_sample_up_and_a_saved_state_replays_exactly(
    server: Server, keys: dict[str, str]
) -> None:
    with client(server, keys["admin"]) as service:
        group_then_replay(server, service)


def group_then_replay(server: Server, service: Any) -> None:
    training = service.create_lora_training_client(base_model=BASE, rank=8).result()
    tokenizer = training.get_tokenizer()
    text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)

    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    result = sampler.sample(types.ModelInput.from_ints(prompt), 8, params).result()
    sequences = result.sequences
    assert len(sequences) == 8
    for sequence in sequences:
        assert 0 < len(sequence.tokens) == len(sequence.logprobs) <= 12
        assert sequence.stop_reason in ("stop", "length")
    # The sampler's logprobs are the checkpoint's own: compute_logprobs agrees with them.
    first = list(sequences[0].tokens)
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(prompt + first)).result()
    assert_scored_as_drawn(scored[len(prompt) :], list(sequences[0].logprobs))

    # One sample rewarded, the others not: advantages centred on the group's mean.
    rewards = [1.0] + [0.0] * 7
    mean = sum(rewards) / len(rewards)
    data = datums_for(prompt, sequences, [r - mean for r in rewards])
    before = completion_logprob(sampler, prompt, first)

    # The base alone (the adapter's B starts at zero, so step 0 scores as the base does).
    base = service.create_sampling_client(base_model=BASE).result()
    assert completion_logprob(base, prompt, first) == pytest.approx(before, abs=1e-4)
    from_base = base.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences
    assert len(from_base) == 2
    assert all(0 < len(s.tokens) <= 12 for s in from_base)

    output = training.forward_backward(data, "importance_sampling").result()
    assert len(output.loss_fn_outputs) == 8
    assert math.isfinite(output.metrics["loss:sum"])
    training.optim_step(types.AdamParams(learning_rate=2e-3)).result()
    stepped = training.save_weights_and_get_sampling_client().result()
    after = completion_logprob(stepped, prompt, first)
    assert after > before + 0.1, (before, after)
    assert completion_logprob(sampler, prompt, first) == pytest.approx(before, abs=1e-5)
    assert completion_logprob(base, prompt, first) == pytest.approx(before, abs=1e-4)
    # The new weights' samples (the unembedding's adapter too) are scored as they were drawn.
    drawn = stepped.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    rescored = stepped.compute_logprobs(
        types.ModelInput.from_ints(prompt + list(drawn.tokens))
    ).result()
    assert_scored_as_drawn(rescored[len(prompt) :], list(drawn.logprobs))

    # save_state, a step, then load_state: the same step again gives the same loss.
    saved = training.save_state("after-one").result().path
    assert saved.startswith("tinker://")
    assert saved.endswith("/weights/after-one")
    second = training.forward_backward(data, "importance_sampling").result()
    training.optim_step(types.AdamParams(learning_rate=2e-3)).result()
    third = training.forward(data, "importance_sampling").result().metrics["loss:sum"]
    with pytest.warns(FutureWarning, match="load_state"):  # deprecated, still served
        training.load_state_with_optimizer(saved).result()
    # Pipelined as the SDK asks: the step submitted before the gradients are waited for.
    again = training.forward_backward(data, "importance_sampling")
    stepped_again = training.optim_step(types.AdamParams(learning_rate=2e-3))
    assert again.result().metrics["loss:sum"] == second.metrics["loss:sum"]
    stepped_again.result()
    assert training.forward(data, "importance_sampling").result().metrics["loss:sum"] == third

    # A new training client from the state starts where the first stood.
    resumed = service.create_training_client_from_state_with_optimizer(saved).result()
    assert (
        resumed.forward(data, "importance_sampling").result().metrics["loss:sum"]
        == (second.metrics["loss:sum"])
    )

    # The checkpoints are listed, and the OpenAI endpoint serves them by name@step.
    run_id = training.model_id
    checkpoints = rest(server, f"tml-{KEY}").list_checkpoints(run_id).result().checkpoints
    assert "weights/after-one" in [c.checkpoint_id for c in checkpoints]
    auth = {"Authorization": f"Bearer {KEY}"}
    served = [m["id"] for m in httpx.get(f"{server.url}/models", headers=auth).json()["data"]]
    latest = inference_name("local", "tinker", run_id.replace(":", "-"), 3)
    assert latest in served, served
    answer = httpx.post(
        f"{server.url}/chat/completions",
        json={"model": latest, "messages": PROMPT, "max_tokens": 2},
        headers=auth,
        timeout=120,
    )
    assert answer.status_code == 200, answer.text


def test_custom_loss_and_cross_entropy_through_the_sdk(
    server: Server, keys: dict[str, str]
) -> None:
    with client(server, keys["admin"]) as service:
        custom_loss(service)
        metadata_and_resubmits(server, service)


def custom_loss(service: Any) -> None:
    training = service.create_lora_training_client(
        base_model=BASE, rank=4, train_unembed=False
    ).result()
    tokens = list(range(20, 40))
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    plain = training.forward([datum], "cross_entropy").result()
    logprobs = plain.loss_fn_outputs[0]["logprobs"].tolist()
    assert plain.metrics["loss:sum"] == pytest.approx(-sum(logprobs), rel=1e-5)

    def negative_mean(data: list[Any], values: list[Any]) -> tuple[Any, dict[str, float]]:
        loss = -values[0].mean()
        return loss, {"custom:mean": float(loss.detach())}

    custom = training.forward_backward_custom([datum], negative_mean).result()
    assert custom.metrics["loss:sum"] == pytest.approx(-sum(logprobs) / len(logprobs), rel=1e-4)


def metadata_and_resubmits(server: Server, service: Any) -> None:
    """user_metadata is kept with the run and its checkpoints; a call submitted twice with
    one seq_id (a retry whose first try arrived) runs once."""
    training = service.create_lora_training_client(
        base_model=BASE, rank=4, train_unembed=False, user_metadata={"team": "a"}
    ).result()
    path = training.save_state("tagged", user_metadata={"why": "test"}).result().path
    run = rest(server, f"tml-{KEY}").get_training_run(training.model_id).result()
    assert run.user_metadata == {"team": "a"}
    assert run.last_checkpoint.tinker_path == path
    assert run.last_checkpoint.user_metadata == {"why": "test"}
    body = {"model_id": training.model_id, "adam_params": {"learning_rate": 1e-4}, "seq_id": 99}
    headers = {"X-API-Key": f"tml-{KEY}"}
    first = httpx.post(f"{server.root}/api/v1/optim_step", json=body, headers=headers).json()
    again = httpx.post(f"{server.root}/api/v1/optim_step", json=body, headers=headers).json()
    assert first["request_id"] == again["request_id"]


def test_bad_requests_are_4xx_naming_the_field(server: Server, keys: dict[str, str]) -> None:
    with client(server, keys["admin"]) as service:
        bad_requests(service)
    raw_bad_requests(server, keys)


def bad_requests(service: Any) -> None:
    with pytest.raises(tinker.BadRequestError, match="optimizer_config"):
        service.create_lora_training_client(
            base_model=BASE, rank=4, optimizer=types.DimuonOptimizerConfig()
        ).result()
    training = service.create_lora_training_client(
        base_model=BASE, rank=4, train_unembed=False
    ).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]},
    )
    for loss in ("dro", "gspo", "stable_reinforce"):
        with pytest.raises(tinker.BadRequestError, match=loss):
            training.forward_backward([datum], loss).result()
    with pytest.raises(tinker.BadRequestError, match="advantages"):
        training.forward_backward([datum], "importance_sampling").result()
    with pytest.raises(tinker.BadRequestError, match=r"loss_fn_config\.epsilon"):
        training.forward_backward([datum], "ppo", {"epsilon": 0.1}).result()
    with pytest.raises(tinker.BadRequestError, match="base_model: 'Qwen/Qwen3-8B' is not loaded"):
        service.create_sampling_client(base_model="Qwen/Qwen3-8B").result()
    sampler = training.save_weights_and_get_sampling_client().result()
    with pytest.raises(tinker.BadRequestError, match="top_k"):
        sampler.sample(
            types.ModelInput.from_ints([1, 2]), 1, types.SamplingParams(max_tokens=2, top_k=5)
        ).result()


def raw_bad_requests(server: Server, keys: dict[str, str]) -> None:
    """Unknown ids and paths are 404s; garbage bodies 400s, never a 5xx."""
    headers = {"X-API-Key": keys["admin"]}
    for path, body in (
        ("/api/v1/get_info", {"model_id": "nope:train:0"}),
        ("/api/v1/retrieve_future", {"request_id": "r0"}),
        (
            "/api/v1/create_sampling_session",
            {"session_id": "nope", "model_path": "tinker://x/weights/y"},
        ),
    ):
        answer = httpx.post(f"{server.root}{path}", json=body, headers=headers)
        assert answer.status_code == 404, (path, answer.text)
    answer = httpx.post(
        f"{server.root}/api/v1/forward_backward", content=b"\xff\xff\xff", headers=headers
    )
    assert answer.status_code == 400, answer.text
    assert httpx.post(f"{server.root}/api/v1/create_session", json={}).status_code == 401
    # A field the request does not have is named, not ignored.
    answer = httpx.post(
        f"{server.root}/api/v1/create_session", json={"tags": [], "colour": "red"}, headers=headers
    )
    assert answer.status_code == 400
    assert "colour: not a field of a create_session request" in answer.text
    session = httpx.post(
        f"{server.root}/api/v1/create_session", json={"tags": []}, headers=headers
    ).json()["session_id"]
    answer = httpx.post(
        f"{server.root}/api/v1/create_model",
        json={
            "session_id": session,
            "model_seq_id": 0,
            "base_model": BASE,
            "lora_config": {"rank": 0},
        },
        headers=headers,
    )
    assert answer.status_code == 400
    assert "lora_config.rank" in answer.text
    wrong = {"X-API-Key": "tml-not-a-key"}
    assert (
        httpx.post(f"{server.root}/api/v1/create_session", json={}, headers=wrong).status_code
        == 401
    )


def test_a_project_key_cannot_reach_another_projects_runs(
    server: Server, keys: dict[str, str]
) -> None:
    with client(server, keys["a"]) as tenant_a:
        training = tenant_a.create_lora_training_client(
            base_model=BASE, rank=4, train_unembed=False
        ).result()
        path = training.save_state("mine").result().path
        run_id = training.model_id

    rest_b = rest(server, keys["b"])
    listed = rest_b.list_training_runs().result().training_runs
    assert run_id not in [r.training_run_id for r in listed]
    with pytest.raises(tinker.NotFoundError):
        rest_b.get_training_run(run_id).result()
    with client(server, keys["b"]) as tenant_b:
        with pytest.raises(tinker.NotFoundError):
            tenant_b.create_sampling_client(model_path=path).result()
        with pytest.raises(tinker.NotFoundError):
            tenant_b.create_training_client_from_state(path).result()
    headers = {"X-API-Key": keys["b"]}
    for route, body in (
        ("/api/v1/get_info", {"model_id": run_id}),
        ("/api/v1/optim_step", {"model_id": run_id, "adam_params": {}}),
        ("/api/v1/save_weights", {"model_id": run_id, "path": "theirs"}),
        ("/api/v1/weights_info", {"tinker_path": path}),
    ):
        answer = httpx.post(f"{server.root}{route}", json=body, headers=headers)
        assert answer.status_code == 404, (route, answer.text)
    # Tenant A's runs are its project's models on the W&B API too; B's key cannot read them.
    listed = rest(server, keys["a"]).list_training_runs().result().training_runs
    assert run_id in [r.training_run_id for r in listed]
    answer = httpx.get(
        f"{server.root}/v1/preview/models/proj-a~{run_id.replace(':', '-')}",
        headers={"Authorization": f"Bearer {keys['b'].removeprefix('tml-')}"},
    )
    assert answer.status_code == 403


def test_the_guides_loop_trains_two_steps(server: Server, keys: dict[str, str]) -> None:
    """docs/guides/tinker.md's loop, run where a user would run it."""
    loop = runpy.run_path(str(SNIPPET), run_name="docs_snippet")
    rewards = loop["main"](server.root, keys["admin"], steps=2, group_size=2)
    assert len(rewards) == 2
    assert all(math.isfinite(r) for r in rewards)
    listed = rest(server, keys["admin"]).list_training_runs().result().training_runs
    final = [
        r
        for r in listed
        if r.last_checkpoint and r.last_checkpoint.checkpoint_id == "weights/final"
    ]
    assert final, [r.last_checkpoint for r in listed]


def test_saved_weights_outlive_a_restart_of_the_server(tmp_path: Path) -> None:
    """A run's `tinker://` paths, its listing and its weights are on disk: after a restart
    a new session samples and trains from them."""
    first = Server(tmp_path / ".art")
    try:
        with client(first, f"tml-{KEY}") as service:
            # The base's first model has no LoRA on the LM head, so its engine samples
            # from a merged copy: a later one on the head (tied to the embeddings) is refused.
            training = service.create_lora_training_client(
                base_model=BASE, rank=4, train_unembed=False
            ).result()
            with pytest.raises(tinker.RequestFailedError, match="train_unembed=False"):
                service.create_lora_training_client(base_model=BASE, rank=4).result()
            path = training.save_weights_for_sampler("kept").result().path
            state = training.save_state("kept").result().path
            run_id = training.model_id
    finally:
        first.stop()
    second = Server(tmp_path / ".art")
    try:
        listed = rest(second, f"tml-{KEY}").list_checkpoints(run_id).result().checkpoints
        assert {c.tinker_path for c in listed} == {path, state}
        with client(second, f"tml-{KEY}") as service:
            sampler = service.create_sampling_client(model_path=path).result()
            sequences = (
                sampler.sample(
                    types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=3)
                )
                .result()
                .sequences
            )
            assert len(sequences[0].tokens) > 0
            resumed = service.create_training_client_from_state_with_optimizer(state).result()
            assert resumed.get_info().model_data.model_name == BASE
    finally:
        second.stop()


async def test_the_async_api_then_a_finished_session_refuses_training(
    server: Server, keys: dict[str, str]
) -> None:
    service = tinker.ServiceClient(base_url=server.root, api_key=keys["admin"])
    training = await service.create_lora_training_client_async(
        base_model=BASE, rank=4, train_unembed=False
    )
    tokens = list(range(30, 42))
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    submitted = await training.forward_backward_async([datum], "cross_entropy")
    assert math.isfinite((await submitted.result_async()).metrics["loss:sum"])
    await (await training.optim_step_async(types.AdamParams(learning_rate=1e-3))).result_async()
    sampler = await training.save_weights_and_get_sampling_client_async()
    prompt = types.ModelInput.from_ints([1, 2, 3])
    result = await sampler.sample_async(prompt, 2, types.SamplingParams(max_tokens=3))
    assert len(result.sequences) == 2
    scored = await sampler.compute_logprobs_async(prompt)
    assert scored[0] is None
    assert len(scored) == 3
    session_id = training.model_id.partition(":")[0]
    await service.close("success")

    # Closed by its client: the session's runs take no more training calls.
    async with httpx.AsyncClient(base_url=server.root, headers={"X-API-Key": keys["admin"]}) as raw:
        for route, body in (
            ("/api/v1/optim_step", {"model_id": training.model_id, "adam_params": {}}),
            (
                "/api/v1/create_model",
                {"session_id": session_id, "model_seq_id": 9, "base_model": BASE},
            ),
        ):
            answer = await raw.post(route, json=body)
            assert answer.status_code == 400, answer.text
            assert "finished (success)" in answer.text
