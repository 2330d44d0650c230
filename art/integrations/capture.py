"""Zero-code capture of the chat completions an agent makes into a trajectory."""

from ..core.not_built import not_built_function

_MISSING = "automatic trajectory capture from OpenAI-compatible clients is not built yet"

auto_trajectory = not_built_function("auto_trajectory", _MISSING)
capture_auto_trajectory = not_built_function("capture_auto_trajectory", _MISSING)
yield_trajectory = not_built_function("yield_trajectory", _MISSING)
capture_yielded_trajectory = not_built_function("capture_yielded_trajectory", _MISSING)

__all__ = [
    "auto_trajectory",
    "capture_auto_trajectory",
    "capture_yielded_trajectory",
    "yield_trajectory",
]
