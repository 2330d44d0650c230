"""ART's `art.utils.benchmarking` import path: trajectory tables and comparison charts of
logged runs (`art.analysis`). Import the submodules, as in ART:
`from art.utils.benchmarking.load_trajectories import load_trajectories`."""
