"""ART 0.5.23's `art.distributed.rollout` import path: the rollout-executor contract.

`RolloutExecutor` and `LocalRolloutExecutor` are `art.pipeline.executor`'s; the names of
ART's distributed executor (remote workers, a shared trajectory queue) are refused.
"""

from typing import Any

from .._refusals import refused_name
from ..pipeline.executor import LocalRolloutExecutor, RolloutExecutor


def __getattr__(name: str) -> Any:
    return refused_name(__name__, name)


__all__ = ["LocalRolloutExecutor", "RolloutExecutor"]
