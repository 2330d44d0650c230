"""A checkpoint sent to `art serve` as a zip archive: checked, then installed whole.

`PUT /v1/preview/models/{id}/checkpoints/{step}` (our extension of the API) is how
`ServerlessBackend._experimental_fork_checkpoint(from_s3_bucket=...)` hands the server a
checkpoint the client pulled from S3 with its own credentials, as ART's client uploads
it as a W&B artifact. The archive holds a LoRA adapter's files at its top level
(`adapter_config.json` among them); it becomes the model's checkpoint `step` in one
rename, as a fork's copy does.
"""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from pathlib import Path, PurePosixPath

from ..core.store.atomic import replace_dir_atomic
from ..core.store.model_store import ModelStore
from ..runtime.endpoint.request import ApiError

MAX_UNPACKED_BYTES = 8 * 1024**3
"""What an archive may unpack to (a LoRA adapter is far smaller; a zip bomb is not)."""


def read_archive(archive: bytes, base_model: str) -> zipfile.ZipFile:
    """The archive, once its names, size and adapter config are checked (400s naming
    what is wrong)."""
    try:
        zipped = zipfile.ZipFile(io.BytesIO(archive))
    except zipfile.BadZipFile:
        raise ApiError(
            400, "body: not a zip archive; send the checkpoint's files zipped", param="body"
        ) from None
    files = [info for info in zipped.infolist() if not info.is_dir()]
    for info in files:
        parts = PurePosixPath(info.filename).parts
        if info.filename.startswith("/") or not parts or any(p in ("..", "") for p in parts):
            raise ApiError(
                400, f"body: archive entry {info.filename!r} is not a relative path", param="body"
            )
        if any(part.startswith(".") for part in parts):
            raise ApiError(400, f"body: archive entry {info.filename!r} is hidden", param="body")
    if sum(info.file_size for info in files) > MAX_UNPACKED_BYTES:
        raise ApiError(
            400, f"body: the archive unpacks to more than {MAX_UNPACKED_BYTES} bytes", param="body"
        )
    if "adapter_config.json" not in {info.filename for info in files}:
        raise ApiError(
            400,
            "body: the archive has no adapter_config.json at its top level; zip the files of "
            "the checkpoint directory itself",
            param="body",
        )
    try:
        config = json.loads(zipped.read("adapter_config.json"))
    except ValueError:
        raise ApiError(400, "body: adapter_config.json is not JSON", param="body") from None
    named = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if named and named != base_model:
        raise ApiError(
            400,
            f"body: the adapter was trained on {named!r}, and the model is {base_model!r}: it "
            "would not fit. Upload a checkpoint of a model with the same base_model",
            param="body",
        )
    return zipped


def install(store: ModelStore, step: int, zipped: zipfile.ZipFile) -> None:
    """Make the archive's files the model's checkpoint `step`, in one rename; the
    caller holds the model's writer lock."""
    if step < 1:
        raise ApiError(400, "step: must be 1 or more (step 0 is the base model)", param="step")
    if store.step() >= step:
        raise ApiError(
            409,
            f"step: the model is at step {store.step()} already, not before {step}; upload "
            "into a new model, or a later step",
            param="step",
        )

    def unpack(tmp: Path) -> None:
        for info in zipped.infolist():
            if info.is_dir():
                continue
            target = tmp.joinpath(*PurePosixPath(info.filename).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipped.open(info) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink)

    replace_dir_atomic(store.checkpoint_dir(step), unpack)


__all__ = ["MAX_UNPACKED_BYTES", "install", "read_archive"]
