"""ART's `art.utils.group_aggregate`: per-label reductions over a sequence of token values.

Importing this module does not import torch; calling `group_aggregate` does.
"""

from ..runtime.trainer.group_aggregate import Reduction, group_aggregate

__all__ = ["Reduction", "group_aggregate"]
