"""The model service spread over a Ray cluster: inference replicas behind the one OpenAI
front, and a data-parallel trainer group. `import art.backends.ray` does not import Ray;
the cluster is joined on the first registration."""

from .backend import RayBackend
from .config import RayConfig

__all__ = ["RayBackend", "RayConfig"]
