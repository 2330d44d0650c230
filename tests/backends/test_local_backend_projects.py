"""Models are (project, name): two projects' `agent`s on one LocalBackend never share anything.

The acceptance script of issue 12: a user mixes two projects that both call their model
`agent`, trains both, and each is served its own adapter. Also here, on the same loaded
backend: registration refuses what the local engine cannot honour, `train(verbose=True)`
reports, and a failed step's `TrainingError` says which step it was making.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

import art
from art.local import LocalBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROBE = [{"role": "user", "content": "Write one short sentence about cats."}]


@pytest.fixture(scope="module")
def backend(shared_backend: LocalBackend) -> LocalBackend:
    return shared_backend


@pytest.fixture(scope="module")
def backend_path(shared_backend: LocalBackend) -> Path:
    return Path(shared_backend.path)


async def probe_logprobs(model: art.Model, name: str) -> list[float]:
    """The greedy answer's token logprobs under the adapter `name` routes to."""
    completion = await model.openai_client().chat.completions.create(
        model=name,
        messages=PROBE,
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    extra = completion.choices[0].model_extra or {}
    return [round(value, 4) for value in extra["token_logprobs"]]


async def train_once(model: art.TrainableModel, rewarded: str) -> None:
    """One step that rewards answers containing `rewarded` (and longer ones a little)."""
    client = model.openai_client()

    async def rollout(word: str) -> art.Trajectory:
        messages = [{"role": "user", "content": f"Repeat the word {word}."}]
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=messages,
            max_tokens=8,  # type: ignore[arg-type]
        )
        choice = completion.choices[0]
        text = (choice.message.content or "").lower()
        reward = float(rewarded in text) + len(text) / 100
        return art.Trajectory(messages_and_choices=[*messages, choice], reward=reward)  # type: ignore[list-item]

    groups = await art.gather_trajectory_groups(
        (art.TrajectoryGroup(rollout(w) for _ in range(4)) for w in (rewarded, "river")),
        pbar_desc=None,
    )
    await model.train(groups, config=art.TrainConfig(learning_rate=5e-3))


async def test_two_projects_with_the_same_model_name_train_and_serve_their_own_adapters(
    backend: LocalBackend, backend_path: Path
) -> None:
    alpha = art.TrainableModel(name="agent", project="alpha", base_model=BASE)
    beta = art.TrainableModel(name="agent", project="beta", base_model=BASE)
    await alpha.register(backend)
    await beta.register(backend)
    assert (alpha.get_inference_name(), beta.get_inference_name()) == ("alpha/agent", "beta/agent")
    assert beta.get_inference_name(0) == "beta/agent@0"

    base = await probe_logprobs(alpha, BASE)
    assert await probe_logprobs(beta, beta.get_inference_name()) == base  # a fresh adapter

    await train_once(alpha, "apple")
    trained_alpha = await probe_logprobs(alpha, alpha.get_inference_name())
    assert trained_alpha != base
    assert await probe_logprobs(beta, beta.get_inference_name()) == base  # beta untouched

    await train_once(beta, "stone")
    assert (await alpha.get_step(), await beta.get_step()) == (1, 1)
    trained_beta = await probe_logprobs(beta, beta.get_inference_name())
    assert trained_beta not in (base, trained_alpha)
    assert await probe_logprobs(alpha, alpha.get_inference_name()) == trained_alpha
    assert await probe_logprobs(alpha, "alpha/agent@1") == trained_alpha
    assert await probe_logprobs(beta, "beta/agent@0") == base

    # Each project's files hold its own run.
    for project in ("alpha", "beta"):
        run = backend_path / project / "models" / "agent"
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0000", "0001"]
        rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
        assert [row["step"] for row in rows] == [0]

    # The bare name is ambiguous now: refused, naming the full names.
    listed = {m.id for m in (await alpha.openai_client().models.list()).data}
    assert {"alpha/agent", "alpha/agent@1", "beta/agent", "beta/agent@0"} <= listed
    assert "agent" not in listed
    with pytest.raises(openai.NotFoundError, match="ambiguous") as raised:
        await alpha.openai_client().chat.completions.create(
            model="agent",
            messages=PROBE,
            max_tokens=2,  # type: ignore[arg-type]
        )
    assert "alpha/agent" in str(raised.value)


async def test_a_unique_name_is_still_served_bare(backend: LocalBackend) -> None:
    solo = art.TrainableModel(name="solo", project="gamma", base_model=BASE)
    await solo.register(backend)
    listed = {m.id for m in (await solo.openai_client().models.list()).data}
    assert {"solo", "solo@0", "gamma/solo", "gamma/solo@0"} <= listed
    assert await probe_logprobs(solo, "solo@0") == await probe_logprobs(solo, "gamma/solo")


async def test_verbose_training_reports_the_step_and_its_checkpoint(
    backend: LocalBackend, capsys: pytest.CaptureFixture[str]
) -> None:
    model = art.TrainableModel(name="talkative", project="delta", base_model=BASE)
    await model.register(backend)
    await train_once(model, "apple")
    capsys.readouterr()
    client = model.openai_client()
    messages = [{"role": "user", "content": "Say hi."}]
    choices = [
        (
            await client.chat.completions.create(
                model=model.get_inference_name(),
                messages=messages,
                max_tokens=4,  # type: ignore[arg-type]
            )
        ).choices[0]
        for _ in range(2)
    ]
    groups = [
        art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*messages, choice], reward=float(i))  # type: ignore[list-item]
            for i, choice in enumerate(choices)
        )
    ]
    await model.train(groups, verbose=True)
    out = capsys.readouterr().out
    assert "[delta/talkative] training step 2 on 1 groups (2 trajectories)" in out
    assert "saved and serving" in out
    assert "checkpoints/0002" in out


async def test_a_failed_step_names_the_step_it_was_making(backend: LocalBackend) -> None:
    # A memory budget that cannot hold one sequence fails the step in the trainer.
    model = art.TrainableModel(
        name="failing",
        project="delta",
        base_model=BASE,
        _internal_config=art.dev.InternalModelConfig(
            trainer_args=art.dev.TrainerArgs(memory_budget_gb=0.01)
        ),
    )
    await model.register(backend)
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=messages, n=2, max_tokens=4, seed=1
    )
    groups = [
        art.TrajectoryGroup(
            art.Trajectory(messages_and_choices=[*messages, choice], reward=float(i))
            for i, choice in enumerate(completion.choices)
        )
    ]
    with pytest.raises(art.TrainingError) as raised:
        await model.train(groups)
    assert raised.value.step == 1
    assert await model.get_step() == 0


@pytest.mark.parametrize(
    ("internal", "field", "says"),
    [
        (
            art.dev.InternalModelConfig(init_args=art.dev.InitArgs(load_in_4bit=True)),
            "init_args.load_in_4bit",
            "trainer_backend='unsloth'",
        ),
        (
            art.dev.InternalModelConfig(engine_args=art.dev.EngineArgs(gpu_memory_utilization=0.8)),
            "engine_args.gpu_memory_utilization",
            "needs engine='vllm'",
        ),
        (
            art.dev.InternalModelConfig(engine_args=art.dev.EngineArgs(enforce_eager=True)),
            "engine_args.enforce_eager",
            "needs engine='vllm'",
        ),
        (
            art.dev.InternalModelConfig(trainer_gpu_ids=[0], inference_gpu_ids=[1]),
            "trainer_gpu_ids",
            "dedicated mode",
        ),
        (
            art.dev.InternalModelConfig(engine="vllm", trainer_gpu_ids=[0], inference_gpu_ids=[1]),
            "trainer_gpu_ids",
            "this machine has none",
        ),
        (
            art.dev.InternalModelConfig(
                trainer_backend="unsloth", trainer_gpu_ids=[], inference_gpu_ids=[]
            ),
            "trainer_gpu_ids",
            "not built for the Unsloth trainer",
        ),
        (
            art.dev.InternalModelConfig(
                trainer_gpu_ids=[],
                inference_gpu_ids=[],
                trainer_args=art.dev.TrainerArgs(memory_budget_gb=2.0),
            ),
            "trainer_args.memory_budget_gb",
            "dedicated mode on the CPU",
        ),
    ],
)
async def test_settings_the_local_engine_cannot_honour_are_refused_at_register(
    backend: LocalBackend,
    backend_path: Path,
    internal: art.dev.InternalModelConfig,
    field: str,
    says: str,
) -> None:
    model = art.TrainableModel(
        name="refused", project="epsilon", base_model=BASE, _internal_config=internal
    )
    with pytest.raises(art.ConfigError, match=says) as raised:
        await model.register(backend)
    assert raised.value.field == f"_internal_config.{field}"
    assert not (backend_path / "epsilon" / "models" / "refused").exists()


@pytest.mark.asyncio(loop_scope="session")
async def test_the_unsloth_trainer_without_its_environment_is_refused_naming_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art.runtime.trainer import unsloth_trainer

    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    model = art.TrainableModel(
        name="refused",
        project="unsloth",
        base_model=BASE,
        _internal_config=art.dev.InternalModelConfig(trainer_backend="unsloth"),
    )
    try:
        monkeypatch.delenv("ART_UNSLOTH_PYTHON", raising=False)
        monkeypatch.setattr(unsloth_trainer, "_REPO", tmp_path)  # a checkout without the venv
        with pytest.raises(art.ConfigError, match="make venv-unsloth") as raised:
            await model.register(backend)
        assert raised.value.field == "_internal_config.trainer_backend"

        monkeypatch.setenv("ART_UNSLOTH_PYTHON", str(tmp_path / "missing" / "python"))
        with pytest.raises(art.ConfigError, match=r"ART_UNSLOTH_PYTHON .* does not exist"):
            await model.register(backend)
        assert not (tmp_path / ".art" / "unsloth" / "models" / "refused").exists()
    finally:
        await backend.close()


CUSTOM_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} says\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant says\n{% endif %}"
)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_custom_chat_template_renders_prompts_and_training(tmp_path: Path) -> None:
    """ART's `chat_template_path` (and `chat_template`): the endpoint renders the prompt
    with it, training tokenizes with it, and a bad setting is refused by name."""
    template = tmp_path / "template.jinja"
    template.write_text(CUSTOM_TEMPLATE)
    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        for internal, field in [
            (
                art.dev.InternalModelConfig(chat_template_path=str(tmp_path / "missing.jinja")),
                "_internal_config.chat_template_path",
            ),
        ]:
            refused = art.TrainableModel(
                name="refused", project="templates", base_model=BASE, _internal_config=internal
            )
            with pytest.raises(art.ConfigError) as raised:
                await refused.register(backend)
            assert raised.value.field == field
        with pytest.raises(ValueError, match="give one, not both"):
            art.dev.InternalModelConfig(chat_template="x", chat_template_path=str(template))

        model = art.TrainableModel(
            name="templated",
            project="templates",
            base_model=BASE,
            _internal_config=art.dev.InternalModelConfig(chat_template_path=str(template)),
        )
        await model.register(backend)
        choices = []
        for reward in (0.0, 1.0):
            completion = await model.openai_client().chat.completions.create(
                model=model.get_inference_name(),
                messages=[{"role": "user", "content": "Name a colour."}],
                max_tokens=6,
            )
            choices.append((completion.choices[0], reward))
        from transformers import AutoTokenizer

        from art.runtime import models

        tokenizer = AutoTokenizer.from_pretrained(models.resolve(BASE).weights)
        prompt = tokenizer.decode((choices[0][0].model_extra or {})["prompt_token_ids"])
        assert (
            prompt
            == "<|im_start|>user says\nName a colour.<|im_end|>\n<|im_start|>assistant says\n"
        )

        group = art.TrajectoryGroup(
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": "Name a colour."}, choice],
                reward=reward,
            )
            for choice, reward in choices
        )
        await model.train([group], config=art.TrainConfig(learning_rate=1e-5))
        rows = tmp_path / ".art" / "templates" / "models" / "templated" / "history.jsonl"
        row = json.loads(rows.read_text().splitlines()[-1])
        assert row["data/step_loss_bearing_tokens"] > 0
        # The service's copy of the template is what training tokenizes with.
        service = backend.service  # in process: the ModelService itself
        assert service is not None
        assert service._models["templates/templated"].base.rendering.template == CUSTOM_TEMPLATE
    finally:
        await backend.close()


# Reads each message's content as a list of parts, and a variable of its own.
PARTS_TEMPLATE = (
    "{{ greeting }}\n{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% for part in m.content %}{{ part.text }}{% endfor %}<|im_end|>{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("mode", ["lora", "merged"])
async def test_arts_template_keys_and_rollout_weights_mode_reach_the_endpoint(
    tmp_path: Path, mode: str
) -> None:
    """`chat_template_kwargs`, `chat_template_content_format` ("auto": this template
    reads parts) and `rollout_weights_mode` as ART's configs give them: the prompt the
    endpoint samples from shows the first two, the engine's sampling copy the third."""
    from transformers import AutoTokenizer

    from art.runtime import models

    backend = LocalBackend(path=tmp_path / ".art", in_process=True)
    try:
        model = art.TrainableModel(
            name="keyed",
            project="templates",
            base_model=BASE,
            _internal_config={  # ART's spelling: a dict of its keys
                "chat_template": PARTS_TEMPLATE,
                "chat_template_kwargs": {"greeting": "Ahoy"},
                "rollout_weights_mode": mode,
            },
        )
        await model.register(backend)
        tokenizer = AutoTokenizer.from_pretrained(models.resolve(BASE).weights)
        client = model.openai_client()

        async def prompt_and_answer(content: Any, **extra: Any) -> tuple[str, str | None]:
            completion = await client.chat.completions.create(
                model=model.get_inference_name(),
                messages=[{"role": "user", "content": content}],
                max_tokens=6,
                temperature=0,
                **extra,
            )
            ids = (completion.choices[0].model_extra or {})["prompt_token_ids"]
            return tokenizer.decode(ids), completion.choices[0].message.content

        expected = "Ahoy\n<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
        as_string, answer = await prompt_and_answer("Name a colour.")
        assert as_string == expected  # a string content reached the template as one part
        as_parts, again = await prompt_and_answer([{"type": "text", "text": "Name a colour."}])
        assert (as_parts, again) == (expected, answer)
        hailed, _ = await prompt_and_answer(
            "Name a colour.", extra_body={"chat_template_kwargs": {"greeting": "Hi"}}
        )
        assert hailed == expected.replace("Ahoy", "Hi")  # the request's own kwargs win

        service = backend.service
        assert service is not None
        engine = service._models["templates/keyed"].base.engine
        assert engine is not None
        assert (getattr(engine, "merged", None) is not None) == (mode == "merged")
    finally:
        await backend.close()
