"""ART's `art.utils.old_benchmarking.display_image_grid` import path (`art.analysis.benchmarked_models`)."""

from ...analysis.benchmarked_models import display_image_grid

__all__ = ["display_image_grid"]
