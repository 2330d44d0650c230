"""A push publishes a checkpoint only when complete (`art.core.store.s3_publish`), against the
session's real S3-compatible server on 127.0.0.1 (moto's server mode, `s3_server`).

The failure is the server's own: an IAM user whose policy refuses one file of the new
checkpoint, with moto's request signing switched on for the test (`/moto-api/reset-auth`)
and off again after it. No model is loaded: the model directories are written by hand
in the layout a LocalBackend writes.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from art.core.store.model_store import ModelStore
from art.local import LocalBackend
from art.utils.s3 import (
    S3SyncError,
    UnpublishedCheckpointWarning,
    ensure_bucket_exists,
    pull_model_from_s3,
    push_model_to_s3,
    s3_sync,
)
from art.utils.s3_checkpoint_utils import (
    get_checkpoint_step_not_after_from_s3,
    get_latest_checkpoint_step_from_s3,
)

PROJECT = "publish-project"
NAME = "agent"


def s3() -> Any:
    """A client with the environment's credentials of the moment (boto3's default
    session would keep the first ones it read)."""
    import boto3

    return boto3.session.Session().client("s3")


def keys(bucket: str) -> list[str]:
    pages = s3().get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def add_checkpoint(store: ModelStore, step: int) -> None:
    checkpoint = store.checkpoint_dir(step)
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_config.json").write_text(json.dumps({"step": step}))
    (checkpoint / "adapter_model.safetensors").write_bytes(os.urandom(4096))
    store.append_history(step, {"reward": float(step)})


def write_model(art_path: Path, steps: tuple[int, ...]) -> ModelStore:
    store = ModelStore(art_path, PROJECT, NAME)
    store.write_model({"name": NAME, "project": PROJECT, "base_model": "base", "trainable": True})
    for step in steps:
        add_checkpoint(store, step)
    return store


def _set_auth(server: str, count: str) -> None:
    """moto's own switch: requests after the next `count` must be signed by a known key."""
    request = urllib.request.Request(
        f"{server}/moto-api/reset-auth",
        data=count.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request) as answer:
        assert answer.status == 200


@pytest.fixture
def refusing_user(s3_server: str, s3_bucket: str) -> Iterator[dict[str, str]]:
    """Credentials of an IAM user that may do anything to the bucket but upload
    checkpoint 2's weights; moto checks signatures and policies while it is in use."""
    import boto3

    iam = boto3.client("iam")
    iam.create_user(UserName=f"pusher-{s3_bucket}")
    refused = f"arn:aws:s3:::{s3_bucket}/{PROJECT}/models/{NAME}/checkpoints/0002/adapter_model.*"
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
            {"Effect": "Deny", "Action": "s3:PutObject", "Resource": refused},
        ],
    }
    iam.put_user_policy(
        UserName=f"pusher-{s3_bucket}", PolicyName="all-but-one", PolicyDocument=json.dumps(policy)
    )
    key = iam.create_access_key(UserName=f"pusher-{s3_bucket}")["AccessKey"]
    _set_auth(s3_server, "0")
    try:
        yield {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
    finally:
        _set_auth(s3_server, "inf")


async def test_an_interrupted_push_leaves_the_previous_checkpoint_the_latest(
    s3_server: str,
    s3_bucket: str,
    refusing_user: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here = str(tmp_path / "here")
    store = write_model(tmp_path / "here", steps=(1,))
    for name, value in refusing_user.items():
        monkeypatch.setenv(name, value)
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here)
    add_checkpoint(store, 2)

    with pytest.raises(S3SyncError, match="access refused") as failed:
        await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here)
    model_key = f"{PROJECT}/models/{NAME}"
    assert failed.value.key == f"{model_key}/checkpoints/0002/adapter_model.safetensors"
    stored = keys(s3_bucket)
    assert f"{model_key}/checkpoints/0002/adapter_config.json" in stored  # half of it is there
    assert f"{model_key}/.art-complete/0001.json" in stored
    assert f"{model_key}/.art-complete/0002.json" not in stored

    # Every reader takes checkpoint 1 and says it left 2 out.
    with pytest.warns(UnpublishedCheckpointWarning, match=r"step\(s\) 2 under s3://"):
        assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) == 1
    with pytest.warns(UnpublishedCheckpointWarning):
        assert await get_checkpoint_step_not_after_from_s3(NAME, PROJECT, 5, s3_bucket) == 1
    fresh = tmp_path / "fresh"
    with pytest.warns(UnpublishedCheckpointWarning, match="interrupted"):
        await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(fresh))
    pulled = ModelStore(fresh, PROJECT, NAME)
    assert pulled.checkpoint_steps() == [1]
    with pytest.raises(S3SyncError, match=r"checkpoint 2 .* is incomplete") as incomplete:
        await pull_model_from_s3(NAME, PROJECT, 2, s3_bucket=s3_bucket, art_path=str(fresh))
    assert incomplete.value.key == f"{model_key}/.art-complete/0002.json"
    assert pulled.checkpoint_steps() == [1]
    resumed = LocalBackend(path=tmp_path / "resumed")
    model = _trainable()
    with pytest.warns(UnpublishedCheckpointWarning):
        directory = await resumed._experimental_pull_model_checkpoint(model, s3_bucket=s3_bucket)
    assert directory == str(tmp_path / "resumed" / model_key / "checkpoints" / "0001")

    # The fix, on the path that failed: the same push, allowed this time, publishes 2.
    _set_auth(s3_server, "inf")
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here)
    assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) == 2
    await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(fresh))
    assert pulled.checkpoint_steps() == [1, 2]
    weights = "adapter_model.safetensors"
    assert (pulled.checkpoint_dir(2) / weights).read_bytes() == (
        store.checkpoint_dir(2) / weights
    ).read_bytes()


async def test_a_bucket_in_arts_layout_reads_whole_until_a_push_here_marks_it(
    s3_bucket: str, tmp_path: Path
) -> None:
    # Written as ART writes it (`aws s3 sync` of the model directory): no markers.
    store = write_model(tmp_path / "art", steps=(1, 2))
    uri = f"s3://{s3_bucket}/{PROJECT}/models/{NAME}"
    await ensure_bucket_exists(s3_bucket)
    await s3_sync(str(store.dir), uri)
    assert not [k for k in keys(s3_bucket) if "/.art-complete/" in k]
    assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) == 2
    await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(tmp_path / "a"))
    assert ModelStore(tmp_path / "a", PROJECT, NAME).checkpoint_steps() == [1, 2]

    # A push from here into it keeps what was readable readable, and adds step 3.
    here = write_model(tmp_path / "here", steps=(3,))
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=str(tmp_path / "here"))
    markers = sorted(k.rsplit("/", 1)[1] for k in keys(s3_bucket) if "/.art-complete/" in k)
    assert markers == ["0001.json", "0002.json", "0003.json", "format.json"]
    assert await get_checkpoint_step_not_after_from_s3(NAME, PROJECT, 2, s3_bucket) == 2

    # From now on a checkpoint that arrives without its marker (ART's sync, cut off) is
    # left out, and said to be.
    add_checkpoint(here, 4)
    weights = here.checkpoint_dir(4) / "adapter_config.json"
    s3().upload_file(str(weights), s3_bucket, f"{PROJECT}/models/{NAME}/checkpoints/0004/x.json")
    with pytest.warns(UnpublishedCheckpointWarning, match=r"step\(s\) 4 "):
        assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) == 3
    b = tmp_path / "b"
    with pytest.warns(UnpublishedCheckpointWarning):
        await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(b))
    assert ModelStore(b, PROJECT, NAME).checkpoint_steps() == [1, 2, 3]

    # A checkpoint deleted here and pushed with delete=True is unpublished, then removed.
    here.delete_checkpoints(keep={4})
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=str(tmp_path / "here"), delete=True)
    assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) == 4
    left = [k.split(f"{NAME}/", 1)[1] for k in keys(s3_bucket)]
    assert [k for k in left if k.startswith((".art-complete/", "checkpoints/"))] == [
        ".art-complete/0004.json",
        ".art-complete/format.json",
        "checkpoints/0004/adapter_config.json",
        "checkpoints/0004/adapter_model.safetensors",
    ]


def _trainable() -> Any:
    import art

    return art.TrainableModel(name=NAME, project=PROJECT, base_model="base")
