"""Checkpoints published on S3 only when complete: a completion marker, written last.

S3 has no rename, so a push cannot make a checkpoint's files appear at once. Instead each
checkpoint `NNNN` pushed here gets a marker object, `<model>/.art-complete/NNNN.json`
(its files and their sizes), uploaded after every file of the checkpoint arrived; a push
that changes or deletes a published checkpoint removes its marker first. Readers (the
step lookups, pulls, forks and resumes of `art.core.store.s3`) take only marked checkpoints
and warn, naming them, when they skip one.

A model whose key holds no `.art-complete/` objects at all was written by ART's
`aws s3 sync` (or by this package before markers): every checkpoint of it counts, as
ART reads them. The first push here into such a model marks the checkpoints already
there (they were readable before it) and writes `.art-complete/format.json` before any
checkpoint file, so from then on an unmarked checkpoint is one whose push did not finish.
ART itself does not read the markers (`.art-complete/` is a hidden folder to it).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

from .s3_client import S3Client, S3SyncError, boto_errors, s3_error
from .s3_sync import Entry, changed, delete_keys, list_local, list_s3, upload

MARKERS = ".art-complete"
"""The folder, under a model's key, of its checkpoints' completion markers."""
_FORMAT = "format.json"


class UnpublishedCheckpointWarning(UserWarning):
    """A checkpoint stored on S3 without its completion marker was left out: its push
    was interrupted, or is still running."""


def _step_of(relative: str) -> int | None:
    parts = relative.split("/")
    if len(parts) >= 3 and parts[0] == "checkpoints" and parts[1].isdigit():
        return int(parts[1])
    return None


def _marker_key(model_key: str, step: int) -> str:
    return f"{model_key}/{MARKERS}/{step:04d}.json"


def marked_steps(s3: S3Client, bucket: str, model_key: str) -> set[int] | None:
    """The steps with a completion marker; None where the model has no markers at all
    (written by ART: every checkpoint counts)."""
    names = list_s3(s3, bucket, f"{model_key}/{MARKERS}")
    if not names:
        return None
    return {int(name[:-5]) for name in names if name.endswith(".json") and name[:-5].isdigit()}


def split_published(
    s3: S3Client, bucket: str, model_key: str, steps: list[int]
) -> tuple[list[int], list[int]]:
    """`steps` as (published, unpublished), both ascending."""
    marked = marked_steps(s3, bucket, model_key)
    if marked is None:
        return sorted(steps), []
    return sorted(s for s in steps if s in marked), sorted(s for s in steps if s not in marked)


def warn_unpublished(uri: str, steps: list[int], *, stacklevel: int = 3) -> None:
    """Say which checkpoints a read left out, and why."""
    if not steps:
        return
    names = ", ".join(str(step) for step in steps)
    warnings.warn(
        f"skipped checkpoint step(s) {names} under {uri}/checkpoints/: no completion marker "
        f"({uri}/{MARKERS}/NNNN.json), so a push of it was interrupted or is still running. "
        "Push the model again to publish it",
        UnpublishedCheckpointWarning,
        stacklevel=stacklevel,
    )


def unpublished_error(uri: str, step: int, bucket: str, model_key: str) -> S3SyncError:
    return S3SyncError(
        f"checkpoint {step} under {uri}/checkpoints/{step:04d}/ is incomplete: it has no "
        f"completion marker ({uri}/{MARKERS}/{step:04d}.json), so its push was interrupted "
        "or is still running. Push the model again, or pull another step",
        bucket=bucket,
        key=_marker_key(model_key, step),
        code="NoSuchKey",
    )


def _put_json(s3: S3Client, bucket: str, key: str, body: object) -> None:
    try:
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(body, sort_keys=True).encode())
    except boto_errors() as error:
        raise s3_error(error, bucket=bucket, key=key, doing="writing") from error


def _publish(s3: S3Client, bucket: str, model_key: str, step: int, files: dict[str, int]) -> None:
    _put_json(s3, bucket, _marker_key(model_key, step), {"step": step, "files": files})


def _manifest(entries: dict[str, Entry], step: int) -> dict[str, int]:
    prefix = f"checkpoints/{step:04d}/"
    return {k[len(prefix) :]: v.size for k, v in entries.items() if k.startswith(prefix)}


def push_published(
    s3: S3Client,
    local: Path,
    bucket: str,
    model_key: str,
    *,
    verbose: bool,
    delete: bool,
    keep: Callable[[str], bool],
) -> int:
    """Upload the model directory `local` to `model_key`, each checkpoint published by its
    marker once all its files are there; returns the number of files uploaded.

    Order: (un)markers for checkpoints that change, their files, their markers; then the
    model's other files (model.json, history, trajectories); then, with `delete`, what
    the bucket holds and `local` does not (a checkpoint's marker before its files).
    """
    files = {k: v for k, v in list_local(local).items() if keep(k)}
    remote = {k: v for k, v in list_s3(s3, bucket, model_key).items() if keep(k)}
    root = f"{model_key}/"
    todo = [k for k, entry in files.items() if changed(entry, remote.get(k))]
    doomed = [k for k in remote if k not in files] if delete else []
    local_steps = {s for s in map(_step_of, files) if s is not None}
    remote_steps = {s for s in map(_step_of, remote) if s is not None}
    touched = {s for s in map(_step_of, [*todo, *doomed]) if s is not None}

    marked = marked_steps(s3, bucket, model_key)
    if marked is None:  # ART's layout so far: what it holds was readable, and stays so
        for step in sorted(remote_steps - touched):
            _publish(s3, bucket, model_key, step, _manifest(remote, step))
        marked = set(remote_steps - touched)
        _put_json(s3, bucket, f"{root}{MARKERS}/{_FORMAT}", {"format": 1})

    for step in sorted(touched | (local_steps - marked)):
        if step in marked:
            delete_keys(s3, bucket, [_marker_key(model_key, step)], verbose)
        for relative in sorted(k for k in todo if _step_of(k) == step):
            upload(s3, local / relative, bucket, root + relative, verbose)
        delete_keys(s3, bucket, [root + k for k in doomed if _step_of(k) == step], verbose)
        if step in local_steps:
            _publish(s3, bucket, model_key, step, _manifest(files, step))
    for relative in sorted(k for k in todo if _step_of(k) is None):
        upload(s3, local / relative, bucket, root + relative, verbose)
    delete_keys(s3, bucket, [root + k for k in doomed if _step_of(k) is None], verbose)
    return len(todo)


def mark_migrated(
    s3: S3Client, bucket: str, model_key: str, step: int, entries: dict[str, Entry]
) -> None:
    """Publish checkpoint `step` just moved to the new layout, where the model uses
    markers (`entries`: its files, relative to the checkpoint)."""
    if marked_steps(s3, bucket, model_key) is not None:
        _publish(s3, bucket, model_key, step, {k: v.size for k, v in entries.items()})


__all__ = [
    "MARKERS",
    "UnpublishedCheckpointWarning",
    "mark_migrated",
    "marked_steps",
    "push_published",
    "split_published",
    "unpublished_error",
    "warn_unpublished",
]
