"""ART's `art.utils.old_benchmarking` import path: per-step metrics of benchmarked models,
a comparison table and line graphs (`art.analysis.benchmarked_models`). Import the
submodules, as in ART."""
