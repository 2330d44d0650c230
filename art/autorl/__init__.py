"""AutoRL: training inputs written from a task description, scored by RULER.

inputs = await art.autorl.generate_inputs("Answer questions about ...", 16, generator_model=...)
result = await art.autorl.train("Answer questions about ...", base_model, None, 10,
                                backend=LocalBackend(path), path=path)
"""

from .inputs import GeneratedInputs, InputGenerationError, generate_inputs, normalize
from .loop import AutoRLResult, Evaluation, train

__all__ = [
    "AutoRLResult",
    "Evaluation",
    "GeneratedInputs",
    "InputGenerationError",
    "generate_inputs",
    "normalize",
    "train",
]
