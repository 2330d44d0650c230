"""The client core: trajectory model, models, gathering, configs, storage and the Backend protocol.

Imports nothing from `art.backends`, `art.ruler`, `art.autorl` or `art.integrations`.
Within it the data model (`trajectories`) imports neither gathering nor capture: an
awaited `TrajectoryGroup` of rollouts runs them through `rollouts`, below both.
"""
