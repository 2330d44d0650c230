"""RULER: relative scores for the trajectories of a group from an LLM judge.

    group = await ruler_score_group(group, "openai/gpt-4.1-mini")   # rewards replaced

`ruler` scores plain message lists; `ruler_score_group` scores a `TrajectoryGroup` and
is made to be the `after_each=` of `gather_trajectory_groups`. LiteLLM is imported on
the first call, not here.
"""

from .answer import TrajectoryScore
from .judge import ruler, ruler_score_group
from .prompt import DEFAULT_RUBRIC

__all__ = ["DEFAULT_RUBRIC", "TrajectoryScore", "ruler", "ruler_score_group"]
