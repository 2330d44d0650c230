"""`LocalBackend`'s S3 calls (ART's `_experimental_push_to_s3`, `_experimental_pull_from_s3`,
`_experimental_pull_model_checkpoint`, `_experimental_fork_checkpoint(from_s3_bucket=...)`)
with the real default model and a real S3-compatible server on 127.0.0.1 (`s3_server`).

One model trains one step on the session's backend and is pushed; a LocalBackend on a
new, empty path then forks from it and resumes it from S3 alone.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import art
from art.local import LocalBackend
from art.utils.s3 import S3SyncError

pytestmark = pytest.mark.model  # loads the default model or starts a model service

BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROBE = [{"role": "user", "content": "Name a colour."}]
ADAPTER = "checkpoints/0001/adapter_model.safetensors"


async def train_one_step(model: art.TrainableModel) -> None:
    client = model.openai_client()

    async def rollout(index: int) -> art.Trajectory:
        trajectory = art.Trajectory(
            messages_and_choices=[{"role": "user", "content": "Write about rivers."}],
            reward=float(index),
        )
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_tokens=4
        )
        trajectory.messages_and_choices.append(completion.choices[0])
        return trajectory

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(i) for i in range(3))], pbar_desc=None
    )
    await model.train(groups, config=art.TrainConfig(learning_rate=1e-3))


async def greedy(model: art.TrainableModel, name: str) -> list[float]:
    completion = await model.openai_client().chat.completions.create(
        model=name,
        messages=PROBE,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
    )
    return [
        round(value, 4) for value in (completion.choices[0].model_extra or {})["token_logprobs"]
    ]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_pushed_model_is_forked_and_resumed_on_a_fresh_path(
    shared_backend: LocalBackend, unique_project: str, s3_bucket: str, tmp_path: Path
) -> None:
    source = art.TrainableModel(name="source", project=unique_project, base_model=BASE)
    await source.register(shared_backend)
    await train_one_step(source)
    trained = Path(shared_backend.path, unique_project, "models", "source")
    await shared_backend._experimental_push_to_s3(source, s3_bucket=s3_bucket, prefix="runs")
    source_answer = await greedy(source, source.get_inference_name(1))

    # Its own backend: the point is a path that holds nothing but what S3 gives it.
    fresh = LocalBackend(path=tmp_path / "fresh", in_process=True)
    try:
        forked = art.TrainableModel(name="forked", project=unique_project, base_model=BASE)
        await forked.register(fresh)
        with pytest.raises(FileNotFoundError, match=f"s3://{s3_bucket}/runs/{unique_project}"):
            await fresh._experimental_fork_checkpoint(
                forked, "nobody", from_s3_bucket=s3_bucket, prefix="runs"
            )
        with pytest.raises(S3SyncError, match="'art-missing-bucket' does not exist"):
            await fresh._experimental_fork_checkpoint(
                forked, "source", from_s3_bucket="art-missing-bucket"
            )
        assert await forked.get_step() == 0

        await fresh._experimental_fork_checkpoint(
            forked, "source", from_s3_bucket=s3_bucket, prefix="runs", not_after_step=5
        )
        assert await forked.get_step() == 1
        here = tmp_path / "fresh" / unique_project / "models"
        assert (here / "forked" / ADAPTER).read_bytes() == (trained / ADAPTER).read_bytes()
        assert await greedy(forked, forked.get_inference_name(1)) == source_answer
        # Only what the fork needed came down: that checkpoint and the source's record.
        assert sorted(p.name for p in (here / "source").iterdir()) == ["checkpoints", "model.json"]

        # Resume: the whole model pulled from S3, then registered; it serves and trains
        # on from its step.
        resumed = art.TrainableModel(name="source", project=unique_project, base_model=BASE)
        with pytest.warns(DeprecationWarning, match="_experimental_pull_model_checkpoint"):
            await fresh._experimental_pull_from_s3(resumed, s3_bucket=s3_bucket, prefix="runs")
        assert (here / "source" / "history.jsonl").read_bytes() == (
            trained / "history.jsonl"
        ).read_bytes()
        await resumed.register(fresh)
        assert await resumed.get_step() == 1
        assert await greedy(resumed, resumed.get_inference_name()) == source_answer
    finally:
        await fresh.close()

    # One checkpoint, on a path with no model service at all.
    elsewhere = LocalBackend(path=tmp_path / "elsewhere")
    directory = await elsewhere._experimental_pull_model_checkpoint(
        source, s3_bucket=s3_bucket, prefix="runs", local_path=str(tmp_path / "copy")
    )
    assert directory == str(tmp_path / "copy")
    assert (tmp_path / "copy" / "adapter_model.safetensors").read_bytes() == (
        trained / ADAPTER
    ).read_bytes()
    assert elsewhere.service is None
    with pytest.raises(FileNotFoundError, match="no S3 bucket specified"):
        await elsewhere._experimental_pull_model_checkpoint(source, step=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(art.ConfigError) as refused:
            await elsewhere._experimental_pull_from_s3(
                source, s3_bucket=s3_bucket, step=1, only_step=2
            )
    assert refused.value.field == "step"
