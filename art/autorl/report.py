"""What a person reads after an AutoRL run: a table, a plot and an HTML page."""

from __future__ import annotations

import html
import math
from pathlib import Path

from ..core.store.atomic import atomic_path, write_text_atomic
from .loop import AutoRLResult, Evaluation


def summary_table(result: AutoRLResult) -> str:
    """One row per evaluated step: win rate against the base and both mean scores."""
    lines = [
        f"{'step':>4}  {'win rate':>8}  {'score':>6}  {'base':>6}  {'judged':>6}",
        f"{'-' * 4}  {'-' * 8}  {'-' * 6}  {'-' * 6}  {'-' * 6}",
    ]
    for e in result.evaluations:
        lines.append(
            f"{e.step:>4}  {_num(e.win_rate):>8}  {_num(e.score):>6}  "
            f"{_num(e.base_score):>6}  {e.judged:>6}"
        )
    return "\n".join(lines)


def write_plot(evaluations: list[Evaluation], target: Path) -> Path:
    """A PNG of the validation win rate and scores per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [e.step for e in evaluations]
    figure, axes = plt.subplots(figsize=(6, 3.5))
    axes.plot(steps, [e.win_rate for e in evaluations], marker="o", label="win rate vs base")
    axes.plot(steps, [e.score for e in evaluations], marker="s", label="score (RULER)")
    axes.plot(steps, [e.base_score for e in evaluations], linestyle="--", label="base score")
    axes.set_xlabel("step")
    axes.set_ylabel("validation")
    axes.set_ylim(-0.05, 1.05)
    axes.grid(alpha=0.3)
    axes.legend(loc="best")
    figure.tight_layout()
    with atomic_path(target) as tmp:
        figure.savefig(tmp, format="png", dpi=100)
    plt.close(figure)
    return target


def write_html(result: AutoRLResult, target: Path, *, samples: int = 5) -> Path:
    """A page with the task, the summary and answers before (base) and after (last step)."""
    e = html.escape
    inputs = result.inputs
    rows = "".join(
        f"<tr><td>{ev.step}</td><td>{_num(ev.win_rate)}</td><td>{_num(ev.score)}</td>"
        f"<td>{_num(ev.base_score)}</td><td>{ev.judged}</td></tr>"
        for ev in result.evaluations
    )
    last = result.evaluations[-1] if result.evaluations else None
    cards = ""
    for sample in (last.samples if last else [])[:samples]:
        cards += (
            "<div class='sample'>"
            f"<p class='input'><b>Input:</b> {e(str(sample.get('input', '')))}</p>"
            "<div class='pair'>"
            f"<div><h4>Before (base) {_score(sample.get('base_score'))}</h4>"
            f"<pre>{e(str(sample.get('base', '')))}</pre></div>"
            f"<div><h4>After (step {last.step if last else ''}) {_score(sample.get('score'))}</h4>"
            f"<pre>{e(str(sample.get('answer', '')))}</pre></div>"
            "</div>"
            + (
                f"<p class='error'><b>Unjudged:</b> {e(str(sample['error']))}</p>"
                if "error" in sample
                else ""
            )
            + "</div>"
        )
    plot = "<img src='validation.png' alt='validation score per step'>"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>AutoRL report</title>
<style>
body {{ font-family: sans-serif; max-width: 60rem; margin: 2rem auto; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: .2rem .6rem; }}
.pair {{ display: grid; grid-template-columns: 1fr 1fr; gap: 1rem; }}
pre {{ white-space: pre-wrap; background: #f6f6f6; padding: .5rem; }}
.sample {{ border-top: 1px solid #ddd; margin-top: 1rem; }}
</style></head><body>
<h1>AutoRL report</h1>
<p><b>Task:</b> {e(inputs.task_description)}</p>
<p><b>System prompt:</b> {e(inputs.system_prompt)}</p>
<p>{len(inputs.train)} training inputs, {len(inputs.val)} validation inputs;
trained from step {result.start_step} to step {result.step}.</p>
<h2>Validation against the base model</h2>
<table><tr><th>step</th><th>win rate</th><th>score</th><th>base score</th><th>judged</th></tr>
{rows}</table>
{plot}
<h2>Answers before and after</h2>
{cards or "<p>No evaluation yet.</p>"}
</body></html>
"""
    write_text_atomic(target, page)
    return target


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def _score(value: object) -> str:
    return f"({value:.2f})" if isinstance(value, float) else ""
