"""The client core: trajectory model, models, gathering, configs, storage and the Backend protocol.

Imports nothing from `art.backends`, `art.ruler`, `art.autorl` or `art.integrations`.

Within it the data model (`trajectories`) does not import gathering (`gather`): an
awaited `TrajectoryGroup` of rollouts runs them through the runner wired in here.
"""

from .gather import run_pending_group as _run_pending_group
from .trajectories import run_pending_with as _run_pending_with

_run_pending_with(_run_pending_group)
