"""SFT training data uploaded to `art serve`, for its SFT jobs to read.

The managed W&B Training API reads an SFT job's data from a W&B artifact
(`training_data_url: wandb-artifact:///...`), which `art serve` has no store for. Its
own extension takes the chat JSONL directly: `POST /v1/preview/models/{id}/sft-data`
starts an upload with a first part, `POST .../sft-data/{upload_id}` appends one more (so
a file larger than the server's body limit goes in parts), and the job names it as
`training_data_url: art-serve:///sft-data/{upload_id}`. An upload belongs to one model
(a key that may not use the model cannot read or write it) and is removed once a job
has read it, when a job refuses it, and with its model.
"""

from __future__ import annotations

import re
import shutil
import threading
import uuid
from pathlib import Path

from ..runtime.endpoint.server import ApiError
from .access import Principal

URL_PREFIX = "art-serve:///sft-data/"
_UPLOAD_ID = re.compile(r"^sft-data-[0-9a-f]{32}$")


DEFAULT_QUOTA_BYTES = 1024 * 2**20  # per scoped key: `art serve --upload-quota-mb`


class SFTUploads:
    """The uploads under `<path>/.art-serve/sft-data/<project>/<name>/<key id>/<upload
    id>.jsonl`: a folder per model, as the model's own (`project~name` may be longer than a
    file name), and in it one per key that uploaded, which its quota counts.

    `quota_bytes`: how many bytes of uploads not yet trained a scoped key may hold (None:
    no limit); the admin key has none.
    """

    def __init__(self, path: str, quota_bytes: int | None = DEFAULT_QUOTA_BYTES) -> None:
        self.dir = Path(path) / ".art-serve" / "sft-data"
        self.quota_bytes = quota_bytes
        self._lock = threading.Lock()  # a quota is checked and spent as one

    def create(self, model_id: str, part: bytes, owner: Principal) -> dict[str, object]:
        upload_id = f"sft-data-{uuid.uuid4().hex}"
        target = self._model_dir(model_id) / owner.key_id / f"{upload_id}.jsonl"
        with self._lock:
            self._check_quota(owner, len(part))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(part)
        return self._describe(upload_id, target)

    def append(
        self, model_id: str, upload_id: str, part: bytes, owner: Principal
    ) -> dict[str, object]:
        target = self._existing(model_id, upload_id, "upload_id")
        with self._lock:
            self._check_quota(owner, len(part), target.parent.name)
            with target.open("ab") as file:
                file.write(part)
        return self._describe(upload_id, target)

    def held_bytes(self, key_id: str) -> int:
        """The bytes of uploads not yet trained that key `key_id` made."""
        return sum(path.stat().st_size for path in self.dir.glob(f"*/*/{key_id}/*.jsonl"))

    def _check_quota(self, owner: Principal, adding: int, key_id: str | None = None) -> None:
        """413 where the upload's key would hold more than its quota (the key that made
        the upload, for a part appended to it)."""
        if owner.admin or self.quota_bytes is None:
            return
        held = self.held_bytes(key_id or owner.key_id)
        if held + adding > self.quota_bytes:
            raise ApiError(
                413,
                f"body: this key's SFT uploads not yet trained would hold {held + adding:,} "
                f"bytes, over its quota of {self.quota_bytes:,} (art serve --upload-quota-mb); "
                "train on or delete the uploads it holds, or ask the admin for a larger quota",
                param="body",
                code="upload_quota",
            )

    def delete_all(self, model_id: str) -> None:
        """Remove every upload of the model (deleted with it)."""
        shutil.rmtree(self._model_dir(model_id), ignore_errors=True)

    def resolve(self, model_id: str, url: str) -> Path:
        """The file a job's `training_data_url` names; 400 for a W&B artifact (the managed
        service's) or another scheme, 404 for an upload this model does not have."""
        if url.startswith("wandb-artifact://"):
            raise ApiError(
                400,
                "training_data_url: SFT jobs that read their data from W&B artifacts are a "
                "feature of the managed W&B Training service only; upload the JSONL to art "
                "serve (POST /v1/preview/models/{model_id}/sft-data) and name it as "
                f"{URL_PREFIX}<upload id>. ServerlessBackend does this for you",
                param="training_data_url",
                code="managed_only",
            )
        if not url.startswith(URL_PREFIX):
            raise ApiError(
                400,
                f"training_data_url: {url!r} is not an upload of this server ({URL_PREFIX}<id>)",
                param="training_data_url",
            )
        return self._existing(model_id, url.removeprefix(URL_PREFIX), "training_data_url")

    def _existing(self, model_id: str, upload_id: str, param: str) -> Path:
        found = (
            list(self._model_dir(model_id).glob(f"*/{upload_id}.jsonl"))
            if _UPLOAD_ID.fullmatch(upload_id)
            else []
        )
        target = found[0] if found else None
        if target is None or not target.is_file():
            raise ApiError(
                404,
                f"{param}: no SFT data upload {upload_id!r} for model {model_id!r}",
                param=param,
                code="upload_not_found",
            )
        return target

    def _model_dir(self, model_id: str) -> Path:
        project, _, name = model_id.partition("~")
        return self.dir / project / name

    @staticmethod
    def _describe(upload_id: str, target: Path) -> dict[str, object]:
        return {"id": upload_id, "url": URL_PREFIX + upload_id, "bytes": target.stat().st_size}


__all__ = ["DEFAULT_QUOTA_BYTES", "URL_PREFIX", "SFTUploads"]
