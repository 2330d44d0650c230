"""Reading the judge's answer: one score per trajectory id, or a `JudgeError` saying why not.

A hosted judge decoding under the schema answers exactly what was asked. A small judge,
or an engine that ignores `response_format`, often does not, in a few ways that still say
plainly what it meant; those are read as meant, and logged on the `art.ruler` logger:

- the JSON inside prose or a Markdown fence ("Here are the scores: ```json {...}```");
- a bare list of entries instead of `{"scores": [...]}`;
- ids written as `"trajectory 2"`, `"#2"` or `2`, or counted from 0 (`"0"`..`"N-1"`);
- the same entry twice (same id, same score);
- scores as text (`"0.8"`, `"8/10"`, `"80%"`), or all of them out of 10 or out of 100.

Anything else that is not one score per id is a `JudgeError` naming what is wrong: an
answer with no JSON at all, a missing or unknown id, one id with two different scores, a
negative score. RULER asks once more, showing the judge its answer and that error.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from ..core.data.errors import JudgeError

logger = logging.getLogger("art.ruler")


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
    """The scores in the judge's answer, in the order of `ids`, matched by id.

    Raises `JudgeError` for an answer that holds no JSON list of scores, or whose entries
    leave an id out, name one that does not exist, give one id two different scores, or
    carry a score that is not a number from 0 to 1 (or all out of 10, or of 100).
    """
    if not content or not content.strip():
        raise JudgeError("the judge's answer is empty; expected a JSON object of scores")
    entries = _entries(content)
    raw = [_entry(entry, index) for index, entry in enumerate(entries)]
    raw = _ids_as_shown(raw, ids)
    by_id: dict[str, tuple[str, float]] = {}
    duplicates: list[str] = []
    unknown: list[str] = []
    for trajectory_id, explanation, score in raw:
        if trajectory_id not in ids:
            unknown.append(trajectory_id)
        elif trajectory_id in by_id:
            if by_id[trajectory_id][1] != score:
                duplicates.append(trajectory_id)
        else:
            by_id[trajectory_id] = (explanation, score)
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
    scale = _scale({i: v for i in ids if not isinstance(v := by_id[i][1], _Fraction)})
    return [
        TrajectoryScore(
            trajectory_id=i,
            explanation=by_id[i][0],
            score=float(v) if isinstance(v := by_id[i][1], _Fraction) else v / scale,
        )
        for i in ids
    ]


def _entries(content: str) -> list[Any]:
    """The list of score entries in `content`: its JSON, or the first JSON in it."""
    answer = _first_json(content)
    if isinstance(answer, list):
        logger.info('RULER read a bare list of scores as {"scores": [...]}')
        return answer
    entries = answer.get("scores") if isinstance(answer, dict) else None
    if not isinstance(entries, list):
        raise JudgeError(
            f'the judge\'s answer has no "scores" list: {_excerpt(content)}. '
            "Use a judge model that supports structured output (response_format json_schema)"
        )
    return entries


def _first_json(content: str) -> Any:
    try:
        return json.loads(content)
    except json.JSONDecodeError as error:
        whole = error
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[{\[]", content):
        try:
            value, _ = decoder.raw_decode(content, match.start())
        except json.JSONDecodeError:
            continue
        if (isinstance(value, dict) and "scores" in value) or (
            isinstance(value, list) and value and all(isinstance(v, dict) for v in value)
        ):
            logger.info(
                "RULER read the JSON inside the judge's answer; the text around it is left out"
            )
            return value
    raise JudgeError(
        f"the judge's answer is not valid JSON ({whole.msg} at character {whole.pos}) and "
        f"holds no JSON list of scores: {_excerpt(content)}"
    ) from whole


def _entry(entry: object, index: int) -> tuple[str, str, float]:
    where = f"scores[{index}]"
    if not isinstance(entry, dict):
        raise JudgeError(f"{where} of the judge's answer is not an object: {entry!r}")
    trajectory_id = entry.get("trajectory_id", entry.get("id"))
    if isinstance(trajectory_id, int) and not isinstance(trajectory_id, bool):
        trajectory_id = str(trajectory_id)  # an id written as a number is still that id
    if not isinstance(trajectory_id, str):
        raise JudgeError(f"{where}.trajectory_id is missing or not a string: {trajectory_id!r}")
    value = _number(entry.get("score"))
    if value is None:
        raise JudgeError(
            f"{where}.score (id {trajectory_id!r}) is not a number: {entry.get('score')!r}"
        )
    if not math.isfinite(value) or value < 0:
        raise JudgeError(f"{where}.score (id {trajectory_id!r}) is {value}, outside 0..1")
    explanation = entry.get("explanation", "")
    if not isinstance(explanation, str):
        explanation = json.dumps(explanation)
    return trajectory_id.strip(), explanation, value


class _Fraction(float):
    """A score the judge wrote as a fraction ("8/10", "80%"): already on 0..1, whatever
    scale its bare numbers are on."""


def _number(score: object) -> float | None:
    """A score as a number: 0.8, "0.8", "8/10" (0.8) or "80%" (0.8); None if it is none."""
    if isinstance(score, bool):
        return None
    if isinstance(score, numbers.Real):
        return float(score)
    if not isinstance(score, str):
        return None
    text = score.strip()
    if match := re.fullmatch(r"(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)", text):
        top, bottom = float(match[1]), float(match[2])
        return _Fraction(top / bottom) if bottom else None
    if match := re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text):
        return _Fraction(float(match[1]) / 100)
    try:
        return float(text)
    except ValueError:
        return None


def _ids_as_shown(
    raw: list[tuple[str, str, float]], ids: Sequence[str]
) -> list[tuple[str, str, float]]:
    """Ids as the trajectories were shown: "trajectory 2" or "#2" is "2", and ids that
    count from 0 (exactly "0".."N-1") are moved up by one."""
    shown = set(ids)

    def plain(trajectory_id: str) -> str:
        if trajectory_id in shown:
            return trajectory_id
        digits = re.fullmatch(r"\D*?(\d+)\D*", trajectory_id)
        return str(int(digits[1])) if digits else trajectory_id

    raw = [(plain(i), explanation, score) for i, explanation, score in raw]
    given = [i for i, _, _ in raw]
    from_zero = [str(n) for n in range(len(ids))]
    counted = ids == [str(n) for n in range(1, len(ids) + 1)]
    if counted and all(i.isdigit() for i in given) and sorted(given, key=int) == from_zero:
        logger.info("RULER read the judge's ids 0..%d as 1..%d", len(ids) - 1, len(ids))
        raw = [(str(int(i) + 1), explanation, score) for i, explanation, score in raw]
    return raw


def _scale(scores: dict[str, float]) -> float:
    """1 for bare scores from 0 to 1; 10 or 100 where every one fits that range instead (a
    judge grading out of 10, as small ones do whatever they are asked); else an error."""
    top = max(scores.values(), default=0.0)
    for scale in (1.0, 10.0, 100.0):
        if top <= scale:
            if scale > 1:
                logger.warning(
                    "RULER's judge scored out of %d (highest %g): its scores are divided by %d",
                    scale,
                    top,
                    scale,
                )
            return scale
    worst = max(scores, key=lambda i: scores[i])
    raise JudgeError(f"the score of id {worst!r} is {top}, outside 0..1 (and 0..10, 0..100)")


def _ids(ids: Sequence[str]) -> str:
    return ", ".join(repr(i) for i in ids)


def _excerpt(text: str, limit: int = 200) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
