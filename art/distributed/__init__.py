"""ART 0.5.23's `art.distributed` import path.

Of ART's multi-node runtime only `art.distributed.rollout`'s rollout-executor contract is
built (what `PipelineTrainer(rollout_executor=...)` takes); its other modules are refused
on import with the reason (`art._refusals`).
"""

from typing import Any as _Any  # ART's module exposes `Any`; it is no API (refused)

from .._refusals import refused_name


def __getattr__(name: str) -> _Any:
    return refused_name(__name__, name)


__all__: list[str] = []
