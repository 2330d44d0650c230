"""SFT training data uploaded to `art serve`, for its SFT jobs to read.

The managed W&B Training API reads an SFT job's data from a W&B artifact
(`training_data_url: wandb-artifact:///...`), which `art serve` has no store for. Its
own extension takes the chat JSONL directly: `POST /v1/preview/models/{id}/sft-data`
starts an upload with a first part, `POST .../sft-data/{upload_id}` appends one more (so
a file larger than the server's body limit goes in parts), and the job names it as
`training_data_url: art-serve:///sft-data/{upload_id}`. An upload belongs to one model
(a key that may not use the model cannot read or write it) and is removed once a job
has read it.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from ..runtime.endpoint.server import ApiError

URL_PREFIX = "art-serve:///sft-data/"
_UPLOAD_ID = re.compile(r"^sft-data-[0-9a-f]{32}$")


class SFTUploads:
    """The uploads under `<path>/.art-serve/sft-data/<model id>/<upload id>.jsonl`."""

    def __init__(self, path: str) -> None:
        self.dir = Path(path) / ".art-serve" / "sft-data"

    def create(self, model_id: str, part: bytes) -> dict[str, object]:
        upload_id = f"sft-data-{uuid.uuid4().hex}"
        target = self._path(model_id, upload_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(part)
        return self._describe(upload_id, target)

    def append(self, model_id: str, upload_id: str, part: bytes) -> dict[str, object]:
        target = self._existing(model_id, upload_id, "upload_id")
        with target.open("ab") as file:
            file.write(part)
        return self._describe(upload_id, target)

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
        target = self._path(model_id, upload_id) if _UPLOAD_ID.match(upload_id) else None
        if target is None or not target.is_file():
            raise ApiError(
                404,
                f"{param}: no SFT data upload {upload_id!r} for model {model_id!r}",
                param=param,
                code="upload_not_found",
            )
        return target

    def _path(self, model_id: str, upload_id: str) -> Path:
        return self.dir / model_id / f"{upload_id}.jsonl"

    @staticmethod
    def _describe(upload_id: str, target: Path) -> dict[str, object]:
        return {"id": upload_id, "url": URL_PREFIX + upload_id, "bytes": target.stat().st_size}


__all__ = ["URL_PREFIX", "SFTUploads"]
