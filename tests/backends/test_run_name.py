"""ART 0.5.23's `run_name` on a LocalBackend: stored and trained under it, served as `name`.

A run's directory, checkpoints and history are `<path>/<project>/models/<run_name>/`;
its adapter answers `name` (and `project/name`, `name@step`). Two runs of one project
may not share the name they are served under, and one run is served under one name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import art
from art.core.data.errors import ConfigError
from art.local import LocalBackend

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def trainable(project: str, name: str, run_name: str | None = None) -> art.TrainableModel:
    return art.TrainableModel(name=name, run_name=run_name, project=project, base_model=BASE)


async def test_a_run_is_stored_and_trained_under_run_name_and_served_as_name(
    shared_backend: LocalBackend, unique_project: str
) -> None:
    # A serving name no other test uses: a plain name is looked up across projects.
    model = trainable(unique_project, "runalias", "agent-run-2")
    await model.register(shared_backend)
    client = model.openai_client()
    choices = []
    for _ in range(2):
        completion = await client.chat.completions.create(
            model="runalias",  # the plain name reaches the run
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=8,
            logprobs=True,
        )
        choices.append(completion.choices[0])
    group = art.TrajectoryGroup(
        art.Trajectory(messages_and_choices=[{"role": "user", "content": "Say hi."}, c], reward=r)
        for c, r in zip(choices, (0.0, 1.0), strict=True)
    )
    await model.train([group], config=art.TrainConfig(learning_rate=1e-4))

    models = Path(shared_backend.path) / unique_project / "models"
    run_dir = models / "agent-run-2"
    assert sorted(p.name for p in models.iterdir()) == ["agent-run-2"]
    assert (run_dir / "checkpoints" / "0001").is_dir()
    assert await model.get_step() == 1
    assert json.loads((run_dir / "model.json").read_text())["run_name"] == "agent-run-2"
    assert any("loss/train" in json.loads(line) for line in (run_dir / "history.jsonl").open())
    assert model.get_inference_name() == f"{unique_project}/runalias"
    assert model.get_inference_name(1) == f"{unique_project}/runalias@1"
    for name in ("runalias", "runalias@1", model.get_inference_name(1)):
        answer = await client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert (answer.choices[0].model_extra or {})["policy_version"] == 1

    # A second run served under the same name in the project would share its route.
    with pytest.raises(ConfigError) as raised:
        await trainable(unique_project, "runalias", "agent-run-3").register(shared_backend)
    assert raised.value.field == "run_name"
    assert "'agent-run-3'" in str(raised.value)
    assert "'agent-run-2'" in str(raised.value)
    assert not (models / "agent-run-3").exists()
    # The run, served as 'runalias', is not also served under another name.
    with pytest.raises(ConfigError) as raised:
        await trainable(unique_project, "other", "agent-run-2").register(shared_backend)
    assert raised.value.field == "name"
    assert "'runalias'" in str(raised.value)
    # A model whose own name is that run's is that run too.
    with pytest.raises(ConfigError, match="served as 'runalias'"):
        await trainable(unique_project, "agent-run-2").register(shared_backend)
    # The same run under the same names registers again (a second script, a restart).
    again = trainable(unique_project, "runalias", "agent-run-2")
    await again.register(shared_backend)
    assert await again.get_step() == 1
