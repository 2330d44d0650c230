"""Comparison charts of a trajectory table: a metric over training steps, and first-vs-last bars.

A *trained* model is one with several steps in the table; a *comparison* model (a
prompted baseline) has one. Without an explicit `models` list, trained models come first,
each kind sorted by name. With one, rows are selected and renamed by
`filter_rename_model_split` and drawn in the list's order.

Figures are built with matplotlib's object API (`matplotlib.figure.Figure`), not pyplot:
no backend is switched, no figure stays registered, and `figure.savefig(path)` renders
through Agg. A notebook shows the returned figure as its cell's value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from ..core.data.errors import ConfigError
from .tables import BenchmarkModelKey, as_table, filter_rename_model_split, require_columns

if TYPE_CHECKING:
    import pyarrow as pa
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

_TRAINED_COLOR = "#d9782d"  # a bar's trained part; comparison bars are grey
_BASE_COLOR = "#dcd8d0"


def training_progress_chart(
    df: pa.Table,
    metric_name: str,
    models: list[str | BenchmarkModelKey] | None = None,
    title: str | None = None,
    x_label: str | None = None,
    y_label: str | None = None,
    perfect_score: float | None = None,
    legend_loc: str | None = "lower right",
) -> Figure:
    """A line per model of `metric_name`'s mean per step.

    A trained model is a line with a marker at each step; a comparison model is a dashed
    horizontal line across the trained steps (dotted where another comparison model has
    the same score, so both stay visible).

    Args:
        df: a table from `load_trajectories` (or `load_aggregated_trajectories`).
        metric_name: a column name, or a metric key without its `metric_` prefix.
        models: model names or `BenchmarkModelKey`s to draw, in this order (their
            `split`, default "val"); None draws every model in the table.
        title: the title (default `metric_name`).
        x_label: the x axis label (default "Step"; "" for none).
        y_label: the y axis label (default none).
        perfect_score: draw a grey reference line at this value, labelled "Perfect score".
        legend_loc: the legend's `loc` for matplotlib (None: matplotlib's "best").
    """
    table, column, names = _select(df, metric_name, models)
    means = _means(table, column)
    all_steps = sorted({step for series in means.values() for step, _ in series})
    first, last = all_steps[0], all_steps[-1]
    trained = [name for name in names if len(means[name]) > 1]
    compared = [name for name in names if len(means[name]) == 1]
    colors = _colors(trained + compared)

    from matplotlib.ticker import MaxNLocator

    figure, axes = _figure()
    if perfect_score is not None:
        axes.plot([first, last], [perfect_score] * 2, color="dimgray", linewidth=1, label="_ref")
    # Comparison lines first, so the trained curves are drawn over them.
    seen_scores: set[float] = set()
    for name in compared:
        score = means[name][0][1]
        style = ":" if score in seen_scores else "--"
        seen_scores.add(score)
        axes.plot(
            [first, last], [score] * 2, linestyle=style, linewidth=2, color=colors[name], label=name
        )
    for name in trained:
        steps, values = zip(*means[name], strict=True)
        axes.plot(steps, values, marker="o", linewidth=2, color=colors[name], label=name)
    if perfect_score is not None:
        low, high = axes.get_ylim()
        axes.text(
            first,
            perfect_score - (high - low) * 0.02,
            "Perfect score",
            va="top",
            ha="left",
            color="dimgray",
        )
    # The legend lists trained models first, whatever order the lines were drawn in.
    handle = {line.get_label(): line for line in axes.get_lines()}
    ordered = trained + compared
    axes.legend(
        [handle[name] for name in ordered], ordered, loc=cast(Any, legend_loc), frameon=True
    )
    axes.set_title(metric_name if title is None else title)
    axes.set_xlabel("Step" if x_label is None else x_label)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    if y_label is not None:
        axes.set_ylabel(y_label)
    _despine(axes)
    figure.tight_layout(pad=1.0)
    return figure


def percentage_comparison_bar_chart(
    df: pa.Table,
    metric_name: str,
    models: list[str | BenchmarkModelKey] | None = None,
    title: str | None = None,
    y_label: str | None = None,
    perfect_score: float | None = None,
    num_decimals: int = 0,
) -> Figure:
    """A bar per model: `metric_name`'s mean at its first step, and for a trained model
    the change by its last step stacked on top (hatched, labelled "RL +x").

    Values of at most 1.01 are shown as percentages (times 100, with "%"). Each bar is
    labelled with its total. Args as in `training_progress_chart`, plus:

    Args:
        num_decimals: decimals in the labels.
    """
    if num_decimals < 0:
        raise ConfigError("num_decimals", f"{num_decimals} is negative", "Pass 0 or more")
    table, column, names = _select(df, metric_name, models)
    means = _means(table, column)
    bars = [
        (
            name,
            means[name][0][1],
            means[name][-1][1] - means[name][0][1] if len(means[name]) > 1 else 0.0,
        )
        for name in names
    ]
    scale = 100.0 if max(base + change for _, base, change in bars) <= 1.01 else 1.0
    unit = "%" if scale == 100.0 else ""
    top = max(max(base, base + change) for _, base, change in bars) * scale

    figure, axes = _figure()
    for position, (_, base, change) in enumerate(bars):
        base, change = base * scale, change * scale
        color = _TRAINED_COLOR if change else _BASE_COLOR
        axes.bar(position, base, width=0.7, color=color, edgecolor="white")
        if change:
            axes.bar(
                position,
                change,
                width=0.7,
                bottom=base,
                color=_TRAINED_COLOR,
                hatch="///",
                edgecolor="white",
                alpha=0.95,
            )
            axes.text(
                position,
                base + change / 2,
                f"RL {change:+.{num_decimals}f}{unit}",
                ha="center",
                va="center",
                fontweight="bold",
                color="#a04a15",
                bbox={"facecolor": "white", "edgecolor": _TRAINED_COLOR, "boxstyle": "round"},
            )
        total = base + change
        axes.text(
            position,
            max(base, total) + top * 0.02,
            f"{total:.{num_decimals}f}{unit}",
            ha="center",
            va="bottom",
            fontweight="bold",
        )
    if perfect_score is not None:
        score = perfect_score * scale
        axes.plot([-0.5, len(bars) - 0.5], [score] * 2, color="dimgray", linewidth=1, label="_ref")
        axes.text(-0.4, score - top * 0.05, "Perfect score", va="top", ha="left", color="dimgray")
    axes.set_xticks(range(len(bars)), [name for name, _, _ in bars])
    axes.set_yticks([])
    axes.spines["left"].set_visible(False)
    if y_label is not None:
        axes.set_ylabel(y_label)
    axes.set_title(metric_name if title is None else title, pad=15)
    _despine(axes)
    figure.tight_layout(pad=1.0)
    return figure


# --- shared -------------------------------------------------------------------------------


def _select(
    df: object, metric_name: str, models: list[str | BenchmarkModelKey] | None
) -> tuple[pa.Table, str, list[str]]:
    """The rows to draw, the metric's column, and the model names in drawing order."""
    table = as_table(df)
    require_columns(table, ["model", "step"])
    column = metric_name if metric_name in table.column_names else f"metric_{metric_name}"
    if column not in table.column_names:
        metrics = [n for n in table.column_names if n == "reward" or n.startswith("metric_")]
        raise ConfigError(
            "metric_name",
            f"the table has no column {metric_name!r} or {column!r}",
            f"Pick one of: {', '.join(metrics) or '(none)'}",
        )
    if models is not None:
        keys = [m if isinstance(m, BenchmarkModelKey) else BenchmarkModelKey(m) for m in models]
        table = filter_rename_model_split(table, keys)
        names = list(dict.fromkeys(key.display_name for key in keys))
        present = set(table.column("model").to_pylist())
        absent = [str(key) for key in keys if key.display_name not in present]
        if absent:
            raise ConfigError(
                "models",
                f"no rows for {', '.join(map(repr, absent))} in the table",
                "Check each model's name and split (BenchmarkModelKey's split defaults to 'val')",
            )
        return table, column, names
    if table.num_rows == 0:
        raise ConfigError("df", "the table has no rows", "Load a project with logged trajectories")
    step_counts: dict[str, set[int]] = {}
    for name, step in zip(
        table.column("model").to_pylist(), table.column("step").to_pylist(), strict=True
    ):
        step_counts.setdefault(name, set()).add(step)
    trained = sorted(name for name, steps in step_counts.items() if len(steps) > 1)
    compared = sorted(name for name, steps in step_counts.items() if len(steps) == 1)
    return table, column, trained + compared


def _means(table: pa.Table, column: str) -> dict[str, list[tuple[int, float]]]:
    """Per model, (step, mean of `column`) in step order; steps with no value left out."""
    grouped = table.group_by(["model", "step"], use_threads=False).aggregate([(column, "mean")])
    series: dict[str, list[tuple[int, float]]] = {}
    for row in grouped.sort_by([("model", "ascending"), ("step", "ascending")]).to_pylist():
        value = row[f"{column}_mean"]
        if value is not None:
            series.setdefault(row["model"], []).append((row["step"], float(value)))
    empty = sorted(set(table.column("model").to_pylist()) - set(series))
    if empty:
        raise ConfigError(
            "metric_name",
            f"{', '.join(map(repr, empty))} logged no {column!r} values",
            "Pick a metric every drawn model logged, or leave those models out with models=",
        )
    return series


def _colors(names: list[str]) -> dict[str, Any]:
    import matplotlib

    cycle = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    return {name: cycle[i % len(cycle)] for i, name in enumerate(names)}


def _figure() -> tuple[Figure, Axes]:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4), dpi=300)
    axes = figure.add_subplot()
    axes.grid(False)
    return figure, axes


def _despine(axes: Axes) -> None:
    axes.spines["top"].set_visible(False)
    axes.spines["right"].set_visible(False)


__all__ = ["percentage_comparison_bar_chart", "training_progress_chart"]
