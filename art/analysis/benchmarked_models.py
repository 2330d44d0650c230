"""ART's first benchmarking helpers: per-step metrics as objects, a table, line graphs.

`load_benchmarked_models` turns each (model, split, steps) key into a `BenchmarkedModel`
whose steps hold each metric's mean over the step's groups of its mean within the group
(a trajectory's `reward` counts as the metric "reward" unless it logged one), the mean
within-group population standard deviation of the reward (`reward_std_dev`), and when the
step was recorded (the latest `history.jsonl` row of that step). The newer
`load_aggregated_trajectories` gives the same numbers as a table.
"""

from __future__ import annotations

import copy
import html
import importlib
import logging
import os
import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..core.data.errors import ConfigError
from ..core.data.trajectories import TrajectoryGroup
from ..core.store.atomic import atomic_path
from ..core.store.model_store import ModelStore

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger(__name__)


class BenchmarkedModelKey:
    """A model's `split` at `step_indices` (None: every logged step; negative indices count
    back from the latest, -1 being the latest)."""

    def __init__(self, model: str, split: str, step_indices: list[int] | None = None):
        self.model = model
        self.split = split
        self.step_indices = step_indices

    def __str__(self) -> str:
        steps = ""
        if self.step_indices:
            first, last = self.step_indices[0], self.step_indices[-1]
            steps = f"{first}" if len(self.step_indices) == 1 else f"{first}-{last}"
        return f"{self.model} {self.split} {steps}"


class BenchmarkedModelStep:
    """One step's metrics, and when the step was recorded (None where history has no row)."""

    def __init__(self, index: int, metrics: dict[str, float] | None = None):
        self.index = index
        self.metrics: dict[str, float] = metrics if metrics is not None else {}
        self.recorded_at: datetime | None = None

    def __str__(self) -> str:
        return f"{self.index} {self.metrics}"


class BenchmarkedModel:
    """A key and its loaded steps, in the key's order."""

    def __init__(
        self, model_key: BenchmarkedModelKey, steps: list[BenchmarkedModelStep] | None = None
    ):
        self.model_key = model_key
        self.steps: list[BenchmarkedModelStep] = steps if steps is not None else []

    def __str__(self) -> str:
        return "\n".join([str(self.model_key), *map(str, self.steps)])


def calculate_step_std_dev(trajectory_groups: list[TrajectoryGroup]) -> float:
    """The mean over groups of two or more trajectories of their rewards' population
    standard deviation; 0.0 where no group has two."""
    spreads = [
        statistics.pstdev([t.reward for t in group.trajectories])
        for group in trajectory_groups
        if len(group.trajectories) > 1
    ]
    return sum(spreads) / len(spreads) if spreads else 0.0


def load_benchmarked_models(
    project: str,
    benchmark_keys: list[BenchmarkedModelKey],
    metrics: Sequence[str] = ("reward",),
    api_path: str | os.PathLike[str] = "./.art",
) -> list[BenchmarkedModel]:
    """A `BenchmarkedModel` per key, with `metrics` per step (see the module doc).

    The keys are copied (their `step_indices` resolved in the copies). A step with no
    trajectory file raises `FileNotFoundError`; a metric no trajectory of a step logged
    is left out of that step.
    """
    models = []
    for key in copy.deepcopy(benchmark_keys):
        store = ModelStore(api_path, project, key.model)
        logged = store.logged_steps(key.split)
        if not logged:
            raise FileNotFoundError(
                f"no {key.split!r} trajectories of model {key.model!r} in {store.dir}"
            )
        requested = logged if key.step_indices is None else key.step_indices
        key.step_indices = [logged[-1] + 1 + i if i < 0 else i for i in requested]
        recorded = {
            row["step"]: row["recorded_at"]
            for row in store.read_history()
            if isinstance(row.get("recorded_at"), str)
        }  # later rows of a step overwrite earlier ones: the latest wins
        model = BenchmarkedModel(key)
        for index in key.step_indices:
            if index not in logged:
                raise FileNotFoundError(
                    f"no trajectory file for step {index} in {store.dir / 'trajectories' / key.split}"
                )
            step = BenchmarkedModelStep(
                index, _step_metrics(store.read_trajectories(key.split, index), metrics)
            )
            if index in recorded:
                step.recorded_at = datetime.fromisoformat(recorded[index])
            model.steps.append(step)
        models.append(model)
    return models


def _step_metrics(groups: list[TrajectoryGroup], metrics: Sequence[str]) -> dict[str, float]:
    values: dict[str, float] = {}
    for metric in metrics:
        group_means = []
        for group in groups:
            found = [
                float(t.metrics[metric]) if metric in t.metrics else t.reward
                for t in group.trajectories
                if metric in t.metrics or metric == "reward"
            ]
            if found:
                group_means.append(sum(found) / len(found))
        if group_means:
            values[metric] = sum(group_means) / len(group_means)
    values["reward_std_dev"] = calculate_step_std_dev(groups)
    return values


def generate_comparison_table(
    project: str,
    benchmark_keys: list[BenchmarkedModelKey],
    metrics: Sequence[str] = ("reward",),
    api_path: str | os.PathLike[str] = "./.art",
) -> pa.Table:
    """A row per loaded step: `Model`, `Split`, `Step` (4 digits), then each metric, all as
    text ("N/A" where the step has no value). ART returns a pandas DataFrame:
    `.to_pandas()` gives one where pandas is installed."""
    import pyarrow as pa

    columns = ["Model", "Split", "Step", *metrics]
    rows = [
        {
            "Model": model.model_key.model,
            "Split": model.model_key.split,
            "Step": f"{step.index:04d}",
            **{metric: str(step.metrics.get(metric, "N/A")) for metric in metrics},
        }
        for model in load_benchmarked_models(project, benchmark_keys, metrics, api_path)
        for step in model.steps
    ]
    return pa.Table.from_pylist(rows, schema=pa.schema([(c, pa.string()) for c in columns]))


def generate_line_graphs(
    project: str,
    line_graph_keys: list[BenchmarkedModelKey],
    comparison_keys: list[BenchmarkedModelKey],
    metrics: Sequence[str] = ("reward",),
    x_axis_metric: Literal["step", "time"] = "step",
    api_path: str | os.PathLike[str] = "./.art",
) -> list[str]:
    """Write a PNG per metric to `<api_path>/<project>/benchmarks/` and return their paths.

    Each line-graph key is a line over its steps (or over the time each step was recorded,
    with `x_axis_metric="time"`; a model with a step lacking that time is left out, with a
    warning); each comparison key is a dashed black line at its last step's value.
    """
    if x_axis_metric not in ("step", "time"):
        raise ConfigError(
            "x_axis_metric", f"{x_axis_metric!r} is not an axis", "Pass 'step' or 'time'"
        )
    from matplotlib import dates
    from matplotlib.figure import Figure

    lines = load_benchmarked_models(project, line_graph_keys, metrics, api_path)
    if x_axis_metric == "time":
        for model in [m for m in lines if any(s.recorded_at is None for s in m.steps)]:
            logger.warning(
                "%s has a step with no recorded time; left out of the graphs", model.model_key
            )
            lines.remove(model)
    comparisons = load_benchmarked_models(project, comparison_keys, metrics, api_path)
    out_dir = Path(api_path) / project / "benchmarks"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y-%m-%d_%H:%M:%S.%f")[:-3]
    paths = []
    for metric in metrics:
        figure = Figure()
        axes = figure.add_subplot()
        last_x = 0.0
        for model in lines:
            if x_axis_metric == "time":
                xs = [
                    float(dates.date2num(s.recorded_at))  # type: ignore[no-untyped-call]
                    for s in model.steps
                    if s.recorded_at is not None  # always: models lacking one were removed
                ]
            else:
                xs = [float(s.index) for s in model.steps]
            ys = [s.metrics.get(metric, float("nan")) for s in model.steps]
            axes.plot(xs, ys, label=f"{model.model_key.model} {model.model_key.split}")
            if xs:
                axes.scatter(xs[-1], ys[-1], s=10)
                last_x = xs[-1]
        for model in comparisons:
            value = model.steps[-1].metrics.get(metric)
            if value is None:
                raise ConfigError(
                    "metrics",
                    f"{model.model_key} logged no {metric!r} at its last step",
                    "Compare only metrics every comparison model logged",
                )
            axes.axhline(y=value, color="black", linestyle="--")
            axes.text(
                last_x,
                value,
                f"{model.model_key.model} {model.model_key.split}",
                ha="right",
                va="bottom",
                fontsize=8,
                color="black",
            )
        axes.set_title(metric)
        axes.set_xlabel(x_axis_metric)
        axes.set_ylabel(metric)
        if lines:
            axes.legend()
        axes.grid(axis="y", color="lightgray", linestyle="--", linewidth=0.25)
        path = out_dir / f"{stamp}_{metric}_line_graph.png"
        with atomic_path(path) as tmp:
            figure.savefig(tmp, format="png")
        paths.append(str(path))
    return paths


def image_grid_html(image_paths: list[str], images_per_row: int = 2) -> str:
    """An HTML grid of the images, `images_per_row` to a row."""
    if images_per_row < 1:
        raise ConfigError(
            "images_per_row", f"{images_per_row} is not a row width", "Pass 1 or more"
        )
    images = "".join(
        f"<img src='{html.escape(path, quote=True)}' style='max-width: 100%; height: auto;'>"
        for path in image_paths
    )
    return (
        f"<div style='display: grid; grid-template-columns: repeat({images_per_row}, 1fr); "
        f"gap: 10px;'>{images}</div>"
    )


def display_image_grid(image_paths: list[str], images_per_row: int = 2) -> None:
    """Show the images as a grid in a Jupyter notebook (needs IPython)."""
    page = image_grid_html(image_paths, images_per_row)
    try:
        ipython_display = importlib.import_module("IPython.display")
    except ImportError as error:
        raise ImportError(
            "display_image_grid shows images in a Jupyter notebook, which needs IPython: "
            "pip install ipython (or use image_grid_html(...) for the HTML)"
        ) from error
    ipython_display.display(ipython_display.HTML(page))


__all__ = [
    "BenchmarkedModel",
    "BenchmarkedModelKey",
    "BenchmarkedModelStep",
    "calculate_step_std_dev",
    "display_image_grid",
    "generate_comparison_table",
    "generate_line_graphs",
    "image_grid_html",
    "load_benchmarked_models",
]
