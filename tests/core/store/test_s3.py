"""`art.utils.s3` and `art.utils.s3_checkpoint_utils` against a real S3-compatible server
on 127.0.0.1 (moto's server mode, `s3_server` in conftest.py), with ART's key layout.

The model directories here are written by hand in the layout a LocalBackend writes (no
model is loaded); tests/backends/test_local_backend_s3.py pushes a trained one.
"""

from __future__ import annotations

import asyncio
import io
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import art
from art.core.store.model_store import ModelStore
from art.core.store.s3 import ForbiddenBucketCreationError, S3Error
from art.utils.s3 import (
    S3SyncError,
    archive_and_presign_step_url,
    build_s3_path,
    build_s3_zipped_step_path,
    ensure_bucket_exists,
    pull_model_from_s3,
    push_model_to_s3,
    s3_sync,
)
from art.utils.s3_checkpoint_utils import (
    get_checkpoint_step_not_after_from_s3,
    get_latest_checkpoint_step_from_s3,
    migrate_s3_checkpoints_to_new_structure,
)

PROJECT = "s3-project"
NAME = "agent"


def s3() -> Any:
    import boto3

    return boto3.client("s3")


def keys(bucket: str, prefix: str = "") -> list[str]:
    pages = s3().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def write_model(art_path: Path, steps: tuple[int, ...] = (1, 2)) -> ModelStore:
    """A model directory as LocalBackend leaves it: registration, history, trajectories,
    checkpoints, its writer lock and a checkpoint still being written (both hidden)."""
    store = ModelStore(art_path, PROJECT, NAME)
    store.write_model({"name": NAME, "project": PROJECT, "base_model": "base", "trainable": True})
    store.append_history(1, {"reward": 0.5})
    (store.dir / "trajectories" / "train").mkdir(parents=True)
    (store.dir / "trajectories" / "train" / "0000.parquet").write_bytes(b"parquet bytes")
    for step in steps:
        checkpoint = store.checkpoint_dir(step)
        checkpoint.mkdir(parents=True)
        (checkpoint / "adapter_model.safetensors").write_bytes(os.urandom(2048))
        (checkpoint / "adapter_config.json").write_text(f'{{"step": {step}}}')
    (store.dir / ".lock").write_text("123 host")
    (store.checkpoints_dir / ".0003.abc.tmp").mkdir()
    (store.checkpoints_dir / ".0003.abc.tmp" / "partial").write_text("half")
    return store


def test_s3_paths_are_arts_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        build_s3_path(model_name=NAME, project=PROJECT, s3_bucket="bkt", prefix="/runs/a/")
        == f"s3://bkt/runs/a/{PROJECT}/models/{NAME}"
    )
    assert (
        build_s3_path(model_name=NAME, project=PROJECT, step=7, s3_bucket="bkt")
        == f"s3://bkt/{PROJECT}/models/{NAME}/checkpoints/0007"
    )
    assert (
        build_s3_zipped_step_path(model_name=NAME, project=PROJECT, step=3, s3_bucket="bkt")
        == f"s3://bkt/{PROJECT}/models/{NAME}/zipped-steps/0003.zip"
    )
    monkeypatch.setenv("BACKUP_BUCKET", "from-env")
    assert build_s3_path(model_name=NAME, project=PROJECT).startswith("s3://from-env/")
    monkeypatch.delenv("BACKUP_BUCKET")
    with pytest.raises(art.ConfigError) as refused:
        build_s3_path(model_name=NAME, project=PROJECT)
    assert refused.value.field == "s3_bucket"


async def test_a_pushed_model_is_pulled_whole_into_a_fresh_path(
    s3_bucket: str, tmp_path: Path
) -> None:
    store = write_model(tmp_path / "here")
    await push_model_to_s3(NAME, PROJECT, s3_bucket, prefix="runs", art_path=str(tmp_path / "here"))

    root = f"runs/{PROJECT}/models/{NAME}/"
    assert keys(s3_bucket) == [
        root + ".art-complete/0001.json",  # each checkpoint's completion marker
        root + ".art-complete/0002.json",
        root + ".art-complete/format.json",
        root + "checkpoints/0001/adapter_config.json",
        root + "checkpoints/0001/adapter_model.safetensors",
        root + "checkpoints/0002/adapter_config.json",
        root + "checkpoints/0002/adapter_model.safetensors",
        root + "history.jsonl",
        root + "model.json",
        root + "trajectories/train/0000.parquet",
    ]  # the bucket was created; the lock and the unfinished checkpoint stayed behind
    assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket, "runs") == 2
    assert await get_checkpoint_step_not_after_from_s3(NAME, PROJECT, 1, s3_bucket, "runs") == 1
    assert await get_checkpoint_step_not_after_from_s3(NAME, PROJECT, 0, s3_bucket, "runs") is None
    assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) is None

    fresh = tmp_path / "fresh"
    local = await pull_model_from_s3(
        NAME, PROJECT, s3_bucket=s3_bucket, prefix="runs", art_path=str(fresh)
    )
    assert local == str(fresh / PROJECT / "models" / NAME)
    visible = {
        k: v for k, v in files(store.dir).items() if not k.startswith((".", "checkpoints/."))
    }
    assert files(Path(local)) == visible
    assert ModelStore(fresh, PROJECT, NAME).step() == 2

    one = tmp_path / "one"
    await pull_model_from_s3(
        NAME, PROJECT, step=1, s3_bucket=s3_bucket, prefix="runs", art_path=str(one)
    )
    assert files(one / PROJECT / "models" / NAME) == {
        k: v for k, v in visible.items() if k.startswith("checkpoints/0001/")
    }
    light = tmp_path / "light"
    await pull_model_from_s3(
        NAME, PROJECT, s3_bucket=s3_bucket, prefix="runs", art_path=str(light),
        exclude=["checkpoints", "trajectories"],
    )  # fmt: skip
    assert sorted(files(light / PROJECT / "models" / NAME)) == ["history.jsonl", "model.json"]


async def test_sync_copies_only_what_changed_and_delete_removes_the_rest(
    s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = write_model(tmp_path / "here")
    here = str(tmp_path / "here")
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here)
    capsys.readouterr()
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here, verbose=True)
    assert capsys.readouterr().out == ""  # nothing changed, nothing uploaded

    (store.checkpoint_dir(2) / "adapter_config.json").write_text('{"step": "two"}')
    os.utime(store.checkpoint_dir(2) / "adapter_config.json", (time.time() + 5,) * 2)
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here, verbose=True)
    assert capsys.readouterr().out.count("upload:") == 1

    other = tmp_path / "other"
    await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(other))
    pulled = ModelStore(other, PROJECT, NAME)
    assert (pulled.checkpoint_dir(2) / "adapter_config.json").read_text() == '{"step": "two"}'
    await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(other), verbose=True)
    assert "download:" not in capsys.readouterr().out

    store.delete_checkpoints(keep={2})
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here, delete=True)
    assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) == 2
    assert not [k for k in keys(s3_bucket) if "/checkpoints/0001/" in k]
    await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(other), delete=True)
    assert pulled.checkpoint_steps() == [2]
    assert not [p.name for p in pulled.checkpoints_dir.iterdir() if p.name.startswith(".")]


async def test_a_failed_pull_leaves_every_local_checkpoint_as_it_was(
    s3_bucket: str, tmp_path: Path
) -> None:
    write_model(tmp_path / "here", steps=(1,))
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=str(tmp_path / "here"))
    there = tmp_path / "there"
    await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(there))
    pulled = ModelStore(there, PROJECT, NAME)
    before = files(pulled.dir)

    # Step 1 changes upstream and a step 3 arrives whose second file cannot be written
    # (a key that is also a folder): the pull fails after downloading some of it.
    root = f"{PROJECT}/models/{NAME}/checkpoints"
    s3().put_object(Bucket=s3_bucket, Key=f"{root}/0001/adapter_config.json", Body=b"new")
    s3().put_object(Bucket=s3_bucket, Key=f"{root}/0003/adapter", Body=b"a file")
    s3().put_object(Bucket=s3_bucket, Key=f"{root}/0003/adapter/weights", Body=b"and a folder")
    marker = f"{PROJECT}/models/{NAME}/.art-complete/0003.json"
    s3().put_object(Bucket=s3_bucket, Key=marker, Body=b"{}")  # step 3 is published
    with pytest.raises(S3SyncError) as failed:
        await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=str(there))
    assert failed.value.bucket == s3_bucket
    assert failed.value.key == f"{root}/0003/adapter/weights"
    assert f"s3://{s3_bucket}/{root}/0003/adapter/weights" in str(failed.value)
    assert files(pulled.dir) == before  # nothing half-written, nothing left behind
    assert pulled.checkpoint_steps() == [1]
    assert sorted(p.name for p in pulled.dir.parent.iterdir()) == [NAME]

    with pytest.raises(S3SyncError):  # a single step is staged and renamed whole too
        await pull_model_from_s3(NAME, PROJECT, 3, s3_bucket=s3_bucket, art_path=str(there))
    assert files(pulled.dir) == before


async def test_missing_buckets_steps_and_credentials_are_named(
    s3_bucket: str, tmp_path: Path, auth_s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = str(tmp_path / "here")
    with pytest.raises(S3SyncError, match=f"bucket '{s3_bucket}' does not exist") as missing:
        await pull_model_from_s3(NAME, PROJECT, s3_bucket=s3_bucket, art_path=here)
    assert (missing.value.bucket, missing.value.code) == (s3_bucket, "NoSuchBucket")
    with pytest.raises(S3SyncError, match="does not exist"):
        await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket)
    assert not await asyncio.to_thread(
        os.path.exists, here
    )  # ART's CLI would have created the bucket and an empty dir

    write_model(tmp_path / "here", steps=(1,))
    await push_model_to_s3(NAME, PROJECT, s3_bucket, art_path=here)
    with pytest.raises(S3SyncError) as no_step:
        await pull_model_from_s3(
            NAME, PROJECT, 5, s3_bucket=s3_bucket, art_path=str(tmp_path / "x")
        )
    assert no_step.value.key == f"{PROJECT}/models/{NAME}/checkpoints/0005/"
    assert f"s3://{s3_bucket}/{PROJECT}/models/{NAME}/checkpoints/0005/" in str(no_step.value)
    assert not (tmp_path / "x" / PROJECT / "models" / NAME / "checkpoints").exists()

    with pytest.raises(ForbiddenBucketCreationError, match="'no'") as forbidden:
        await ensure_bucket_exists("no")  # a name S3 refuses: too short
    assert forbidden.value.bucket == "no"
    with pytest.raises(art.ConfigError) as profile:
        await s3_sync(here, f"s3://{s3_bucket}/x", profile="no-such-profile")
    assert profile.value.field == "profile"

    # A server that checks signatures, given keys it never issued.
    monkeypatch.setenv("AWS_ENDPOINT_URL", auth_s3_server)
    for call in (
        push_model_to_s3(NAME, PROJECT, "guarded", art_path=here),
        pull_model_from_s3(NAME, PROJECT, s3_bucket="guarded", art_path=here),
        get_latest_checkpoint_step_from_s3(NAME, PROJECT, "guarded"),
        s3_sync(here, "s3://guarded/x"),
    ):
        with pytest.raises(S3Error, match="Check the credentials") as refused:
            await call
        assert refused.value.bucket == "guarded"
        assert "guarded" in str(refused.value)


@pytest.fixture(scope="module")
def auth_s3_server() -> Iterator[str]:
    """moto's server in its own process with request signing checked (no keys issued, so
    every key is refused); the session's `s3_server` takes any credentials."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"moto's server exited with {server.returncode}") from None
                time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait()


async def test_a_zipped_step_downloads_from_its_presigned_url(
    s3_bucket: str, tmp_path: Path
) -> None:
    store = write_model(tmp_path, steps=(1,))
    url = await archive_and_presign_step_url(NAME, PROJECT, 1, s3_bucket, art_path=str(tmp_path))
    assert keys(s3_bucket, f"{PROJECT}/models/{NAME}/zipped-steps/") == [
        f"{PROJECT}/models/{NAME}/zipped-steps/0001.zip"
    ]
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    assert "Signature" in query
    assert 3500 < int(query["Expires"][0]) - time.time() <= 3600  # valid for an hour
    # No credentials here: the URL carries the signature.
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read())
    archive = zipfile.ZipFile(io.BytesIO(body))
    assert {name: archive.read(name) for name in archive.namelist()} == files(
        store.checkpoint_dir(1)
    )

    elsewhere = await archive_and_presign_step_url(
        "other", PROJECT, 4, s3_bucket, checkpoint_path=str(store.checkpoint_dir(1))
    )
    assert f"/{PROJECT}/models/other/zipped-steps/0004.zip" in elsewhere
    with pytest.raises(ValueError, match="does not exist"):
        await archive_and_presign_step_url(NAME, PROJECT, 9, s3_bucket, art_path=str(tmp_path))
    with pytest.raises(art.ConfigError) as refused:
        await archive_and_presign_step_url(
            NAME, PROJECT, 1, s3_bucket, art_path=str(tmp_path), delete=True
        )
    assert refused.value.field == "delete"


async def test_s3_sync_copies_files_folders_and_between_buckets(
    s3_bucket: str, tmp_path: Path
) -> None:
    store = write_model(tmp_path / "here", steps=(1,))
    await ensure_bucket_exists(s3_bucket)
    await ensure_bucket_exists(s3_bucket)  # an existing bucket is left as it is
    await s3_sync(str(store.model_json), f"s3://{s3_bucket}/one/model.json")
    await s3_sync(str(store.dir), f"s3://{s3_bucket}/all", exclude=["trajectories"])
    assert "all/.lock" in keys(s3_bucket, "all/")  # s3_sync is `aws s3 sync`: everything
    assert not keys(s3_bucket, "all/trajectories/")
    await s3_sync(f"s3://{s3_bucket}/all", f"s3://{s3_bucket}/copy", delete=True)
    assert [k.removeprefix("copy/") for k in keys(s3_bucket, "copy/")] == [
        k.removeprefix("all/") for k in keys(s3_bucket, "all/")
    ]
    back = tmp_path / "back"
    await s3_sync(f"s3://{s3_bucket}/copy", str(back))
    assert files(back) == {
        k: v for k, v in files(store.dir).items() if not k.startswith("trajectories/")
    }

    with pytest.raises(art.ConfigError) as local:
        await s3_sync(str(store.dir), str(back))
    assert local.value.field == "source"
    with pytest.raises(art.ConfigError) as one_file:
        await s3_sync(str(store.model_json), f"s3://{s3_bucket}/one/model.json", delete=True)
    assert one_file.value.field == "delete"
    with pytest.raises(art.ConfigError) as excluded:
        await s3_sync(str(store.dir), f"s3://{s3_bucket}/all", exclude=["models"])  # type: ignore[list-item]
    assert excluded.value.field == "exclude"


async def test_checkpoints_in_arts_old_layout_are_migrated(
    s3_bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await ensure_bucket_exists(s3_bucket)
    root = f"{PROJECT}/models/{NAME}"
    for key in (
        "0001/adapter_model.safetensors",
        "0001/adapter_config.json",
        "0002/a",
        "checkpoints/0002/a",
    ):
        s3().put_object(Bucket=s3_bucket, Key=f"{root}/{key}", Body=key.encode())
    await migrate_s3_checkpoints_to_new_structure(NAME, PROJECT, s3_bucket, dry_run=True)
    assert "Would migrate" in capsys.readouterr().out
    assert len(keys(s3_bucket)) == 4

    await migrate_s3_checkpoints_to_new_structure(NAME, PROJECT, s3_bucket)
    assert keys(s3_bucket) == [
        f"{root}/0002/a",  # already in the new place: left alone
        f"{root}/checkpoints/0001/adapter_config.json",
        f"{root}/checkpoints/0001/adapter_model.safetensors",
        f"{root}/checkpoints/0002/a",
    ]
    body = s3().get_object(Bucket=s3_bucket, Key=f"{root}/checkpoints/0001/adapter_config.json")
    assert body["Body"].read() == b"0001/adapter_config.json"
    assert await get_latest_checkpoint_step_from_s3(NAME, PROJECT, s3_bucket) == 2


def test_importing_the_s3_modules_does_not_import_boto3() -> None:
    code = "import sys, art.utils.s3, art.utils.s3_checkpoint_utils; print('boto3' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_s3_errors_cross_processes_as_themselves() -> None:
    import pickle

    error = S3SyncError("listing failed", bucket="b", key="k", code="403")
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.bucket, copy.key, copy.code) == (
        S3SyncError, "listing failed", "b", "k", "403"
    )  # fmt: skip
    assert isinstance(copy, RuntimeError)
    assert isinstance(copy, art.ArtError)
