"""ART's `art.rewards` import path: RULER (see `art.ruler`).

As in ART, `art.rewards.ruler` is the `ruler` function once this package is imported,
while `import art.rewards.ruler` / `from art.rewards.ruler import acompletion` reach the
module (`sys.modules["art.rewards.ruler"]`), whose `acompletion` and `ModelResponse`
RULER calls through: patching them there changes what RULER calls.
"""

from .ruler import DEFAULT_RUBRIC, TrajectoryScore, ruler, ruler_score_group

__all__ = ["DEFAULT_RUBRIC", "TrajectoryScore", "ruler", "ruler_score_group"]
