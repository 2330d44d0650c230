"""ART's `art.utils.benchmark_rollout` import path (`art.analysis.rollout`)."""

from ..analysis.rollout import benchmark_rollout

__all__ = ["benchmark_rollout"]
