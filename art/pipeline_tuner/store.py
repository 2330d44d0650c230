"""Where the pipeline tuner keeps what it learned: one JSON profile per name.

A model's profiles are `<model dir>/pipeline_tuner/<name>.json` (the model dir is
`<backend path>/<project>/models/<name>/`); a name ending in `.json` or an absolute path is
used as given.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..core.store.atomic import write_text_atomic
from .config import PipelineAutotunerProfile

if TYPE_CHECKING:
    from ..core.model import TrainableModel


class PipelineTunerProfileStore:
    """Reads and writes `PipelineAutotunerProfile`s under `root`."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    @classmethod
    def for_model(cls, model: TrainableModel) -> PipelineTunerProfileStore:
        """The store in the model's own directory (its backend must store on this machine)."""
        return cls(model.state_store().dir / "pipeline_tuner")

    def resolve(self, profile: str | None) -> Path:
        """The file of profile `profile` ("latest" when None)."""
        path = Path(profile or "latest")
        if path.is_absolute() or path.suffix == ".json":
            return path
        return self.root / f"{path}.json"

    def load(self, profile: str | None) -> PipelineAutotunerProfile:
        """The saved profile; FileNotFoundError names the file when there is none."""
        return PipelineAutotunerProfile.model_validate_json(
            self.resolve(profile).read_text(encoding="utf-8")
        )

    def save(self, profile: str, data: PipelineAutotunerProfile) -> Path:
        """Write the profile atomically (a reader never sees half of one); its path."""
        path = self.resolve(profile)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, data.model_dump_json(indent=2))
        return path


__all__ = ["PipelineTunerProfileStore"]
