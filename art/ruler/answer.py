"""Reading the judge's answer: one score per trajectory id, or a `JudgeError` saying why not."""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Sequence

from pydantic import BaseModel, Field

from ..core.data.errors import JudgeError


class TrajectoryScore(BaseModel):
    """The judge's score for one trajectory."""

    trajectory_id: str = Field(description="The id the trajectory was shown under.")
    explanation: str = Field(description="Why the judge gave this score.")
    score: float = Field(description="From 0 (worst) to 1 (best).")


class Response(BaseModel):
    """A whole judge answer: one `TrajectoryScore` per trajectory (ART's
    `art.rewards.ruler.Response`, for reading a judge's JSON yourself)."""

    scores: list[TrajectoryScore] = Field(description="One score per trajectory.")


def parse_scores(content: str | None, ids: Sequence[str]) -> list[TrajectoryScore]:
    """The scores in the judge's JSON answer, in the order of `ids`, matched by id.

    Raises `JudgeError` for an answer that is not JSON, not `{"scores": [...]}`, or
    whose entries leave an id out, repeat one, name one that does not exist, or carry a
    score outside 0..1.
    """
    if not content or not content.strip():
        raise JudgeError("the judge's answer is empty; expected a JSON object of scores")
    try:
        answer = json.loads(content)
    except json.JSONDecodeError as error:
        raise JudgeError(
            f"the judge's answer is not valid JSON ({error.msg} at character {error.pos}): "
            f"{_excerpt(content)}"
        ) from error
    entries = answer.get("scores") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        raise JudgeError(
            f'the judge\'s answer has no "scores" list: {_excerpt(content)}. '
            "Use a judge model that supports structured output (response_format json_schema)"
        )
    by_id: dict[str, TrajectoryScore] = {}
    duplicates: list[str] = []
    unknown: list[str] = []
    for index, entry in enumerate(entries):
        score = _entry(entry, index)
        if score.trajectory_id not in ids:
            unknown.append(score.trajectory_id)
        elif score.trajectory_id in by_id:
            duplicates.append(score.trajectory_id)
        else:
            by_id[score.trajectory_id] = score
    missing = [i for i in ids if i not in by_id]
    problems = []
    if missing:
        problems.append(f"no score for trajectory id {_ids(missing)}")
    if duplicates:
        problems.append(f"more than one score for id {_ids(duplicates)}")
    if unknown:
        problems.append(f"scores for unknown id {_ids(unknown)}")
    if problems:
        raise JudgeError(
            f"the judge gave {len(entries)} scores for {len(ids)} trajectories "
            f"(ids {_ids(ids)}): {'; '.join(problems)}"
        )
    return [by_id[i] for i in ids]


def _entry(entry: object, index: int) -> TrajectoryScore:
    where = f"scores[{index}]"
    if not isinstance(entry, dict):
        raise JudgeError(f"{where} of the judge's answer is not an object: {entry!r}")
    trajectory_id = entry.get("trajectory_id")
    if isinstance(trajectory_id, int) and not isinstance(trajectory_id, bool):
        trajectory_id = str(trajectory_id)  # an id written as a number is still that id
    if not isinstance(trajectory_id, str):
        raise JudgeError(f"{where}.trajectory_id is missing or not a string: {trajectory_id!r}")
    score = entry.get("score")
    if isinstance(score, bool) or not isinstance(score, numbers.Real):
        raise JudgeError(f"{where}.score (id {trajectory_id!r}) is not a number: {score!r}")
    value = float(score)
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise JudgeError(f"{where}.score (id {trajectory_id!r}) is {value}, outside 0..1")
    explanation = entry.get("explanation", "")
    if not isinstance(explanation, str):
        explanation = json.dumps(explanation)
    return TrajectoryScore(trajectory_id=trajectory_id, explanation=explanation, score=value)


def _ids(ids: Sequence[str]) -> str:
    return ", ".join(repr(i) for i in ids)


def _excerpt(text: str, limit: int = 200) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
