"""RULER: one LLM-judge call scores every trajectory of a group relative to the others.

GRPO only uses how rewards differ within a group, so a judge that ranks a group's
rollouts side by side gives usable rewards with no labels. The judge is any model
LiteLLM reaches (`litellm.acompletion`), an `art` model's own endpoint included.
Method after OpenPipe's RULER (https://openpipe.ai/blog/ruler); the prompt is ours.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.data.errors import ConfigError, JudgeError, TrajectoryValidationError
from ..core.data.trajectories import History, Trajectory, TrajectoryGroup
from ..core.data.types import Message, Tool
from ..core.metrics.api_costs import CostUnavailableError, extract_api_cost, load_litellm
from ..core.metrics.metrics_builder import MetricsBuilder
from .answer import TrajectoryScore, parse_scores
from .cache import JudgeCache, cache_key, default_cache_dir
from .prompt import DEFAULT_RUBRIC, judge_messages, response_format, trajectory_ids

logger = logging.getLogger("art.ruler")

# A judge answer that fails the check is asked for once more, told what was wrong with
# it, before giving up.
_ATTEMPTS = 2
_RESERVED = ("messages", "response_format")
# ART's name for the judge's cost: `costs/<context>/judge/ruler` in history.jsonl.
COST_SOURCE = "judge/ruler"


@dataclass(frozen=True)
class Judgement:
    """The scores of one judge call, and what the call cost (zero when it was cached)."""

    scores: list[TrajectoryScore]
    prompt_tokens: int
    completion_tokens: int
    cost: float | None  # US dollars; None where the judge model is unpriced
    cached: bool


async def ruler(
    message_lists: Sequence[Sequence[Message]],
    judge_model: str = "openai/o3",
    extra_litellm_params: Mapping[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    tools: Sequence[Tool] | None = None,
    cache: bool | str | os.PathLike[str] = True,
    debug: bool = False,
) -> list[TrajectoryScore]:
    """Score each message list from 0 to 1, relative to the others, with an LLM judge.

    Args:
        message_lists: one list of chat messages per trajectory, all for the same task.
        judge_model: any LiteLLM model name ("openai/gpt-4.1-mini", "anthropic/...", or
            "openai/<name>" with `api_base` for any OpenAI-compatible endpoint).
        extra_litellm_params: more keyword arguments for `litellm.acompletion`
            (`api_base`/`base_url`, `api_key`, `temperature`, `max_tokens`, ...).
        rubric: how to grade; the default suits most tasks.
        tools: the tools the agent had, shown to the judge.
        cache: reuse stored judge answers for identical requests: True for the default
            directory ($ART_CACHE_DIR/ruler or ~/.cache/art/ruler), a path for another,
            False to always call the judge. `ART_RULER_CACHE=0` turns it off too.
        debug: print the judge's raw answer.

    Returns:
        One `TrajectoryScore` per message list, in the same order (matched by id).

    Raises:
        JudgeError: the judge answered twice with something that is not one valid
            score per trajectory.
    """
    judgement = await judge(
        message_lists,
        judge_model,
        extra_litellm_params,
        rubric,
        tools=tools,
        cache=cache,
        debug=debug,
    )
    return judgement.scores


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str = "openai/o3",
    extra_litellm_params: Mapping[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    cache: bool | str | os.PathLike[str] = True,
    debug: bool = False,
) -> TrajectoryGroup | None:
    """A copy of `group` whose rewards are RULER scores; use it as `after_each=` of a gather.

    Each trajectory keeps its previous reward in `metrics["independent_reward"]`, gets
    the score as `reward` and `metrics["ruler_score"]`, and the judge's explanation in
    its `logs`. The judge call's cost is shared out over the trajectories as
    `ruler_judge_prompt_tokens`, `ruler_judge_completion_tokens` and `ruler_judge_cost`
    (US dollars, where the judge is priced: `art.api_costs`), so that summed over a step
    they give what the judge cost, and their mean in `history.jsonl` is the cost per
    rollout. Inside `model.activate_metrics_context(...)` the cost is also recorded as
    ART's `costs/<context>/judge/ruler`, summed into the model's next history row.

    A trajectory with `additional_histories` (a LangGraph summarizer node, a sub-agent)
    is judged whole: its main conversation, then each history under a divider saying it
    is another LLM call of the same rollout (`whole_trajectory`).

    With `swallow_exceptions=True` any failure (an unusable answer, an unreachable
    judge, a trajectory that cannot be shown) is logged on the `art.ruler` logger and
    the group is dropped (None), which `gather_trajectory_groups(after_each=...)` treats
    as "do not train on it".
    """
    if not isinstance(group, TrajectoryGroup):
        raise TrajectoryValidationError(
            "group",
            f"expected an art.TrajectoryGroup, got {type(group).__name__}",
            "Score finished groups, e.g. as gather_trajectory_groups(after_each=...)",
        )
    trajectories = [trajectory.model_copy(deep=True) for trajectory in group.trajectories]
    try:
        judgement = await judge(
            [whole_trajectory(trajectory) for trajectory in trajectories],
            judge_model,
            extra_litellm_params,
            rubric,
            tools=_tools_of(trajectories),
            cache=cache,
            debug=debug,
        )
    except Exception as error:
        if not swallow_exceptions:
            raise
        logger.warning(
            "RULER dropped a group of %d trajectories: %s: %s",
            len(trajectories),
            type(error).__name__,
            error,
        )
        return None
    share = 1 / max(len(trajectories), 1)
    for trajectory, score in zip(trajectories, judgement.scores, strict=True):
        trajectory.metrics["independent_reward"] = trajectory.reward
        trajectory.metrics["ruler_score"] = score.score
        trajectory.metrics["ruler_judge_prompt_tokens"] = judgement.prompt_tokens * share
        trajectory.metrics["ruler_judge_completion_tokens"] = judgement.completion_tokens * share
        if judgement.cost is not None:
            trajectory.metrics["ruler_judge_cost"] = judgement.cost * share
        trajectory.reward = score.score
        trajectory.log(f"RULER explanation: {score.explanation}")
    return TrajectoryGroup(
        trajectories,
        exceptions=group.exceptions,
        metadata=group.metadata,
        metrics=group.metrics,
        logs=group.logs,
    )


async def judge(
    message_lists: Sequence[Sequence[Message]],
    judge_model: str,
    extra_litellm_params: Mapping[str, Any] | None,
    rubric: str,
    *,
    tools: Sequence[Tool] | None,
    cache: bool | str | os.PathLike[str],
    debug: bool,
) -> Judgement:
    """Ask the judge (or the cache) for one score per message list; see `ruler`."""
    if not message_lists:
        return Judgement([], 0, 0, 0.0, cached=False)
    request = _request(message_lists, judge_model, extra_litellm_params, rubric, tools)
    ids = trajectory_ids(len(message_lists))
    store = _cache_store(cache)
    key = cache_key(request)
    if store is not None and (entry := store.get(key)) is not None:
        if debug:
            print(f"[RULER] cached judge answer ({store.path(key)}):\n{entry['content']}")
        return Judgement(parse_scores(entry["content"], ids), 0, 0, 0.0, cached=True)

    acompletion, response_type = _litellm_names()
    prompt_tokens = completion_tokens = 0
    cost: float | None = 0.0
    failure: JudgeError | None = None
    content: str | None = None
    asked = request
    for attempt in range(1, _ATTEMPTS + 1):
        if failure is not None:
            asked = _asked_again(request, content, failure, ids)
        response = await acompletion(**asked, caching=False)
        if not isinstance(response, response_type):
            raise JudgeError(
                f"{judge_model}: acompletion returned a {type(response).__name__}, not a "
                f"{response_type.__name__}; leave `stream` out of extra_litellm_params"
            )
        usage = getattr(response, "usage", None)
        prompt_tokens += getattr(usage, "prompt_tokens", 0) or 0
        completion_tokens += getattr(usage, "completion_tokens", 0) or 0
        call_cost = _record_cost(judge_model, response)
        cost = None if cost is None or call_cost is None else cost + call_cost
        content = _content(response)
        if debug:
            print(f"[RULER] judge answer (attempt {attempt}):\n{content}")
        try:
            scores = parse_scores(content, ids)
        except JudgeError as error:
            failure = error
            logger.warning("RULER judge answer %d/%d rejected: %s", attempt, _ATTEMPTS, error)
            continue
        if store is not None:
            store.put(
                key,
                {
                    "model": judge_model,
                    "content": content,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "cost": cost,
                },
            )
        return Judgement(scores, prompt_tokens, completion_tokens, cost, cached=False)
    assert failure is not None
    raise JudgeError(f"{judge_model} failed to score the group twice; last: {failure}") from failure


def _request(
    message_lists: Sequence[Sequence[Message]],
    judge_model: str,
    extra_litellm_params: Mapping[str, Any] | None,
    rubric: str,
    tools: Sequence[Tool] | None,
) -> dict[str, Any]:
    if not isinstance(judge_model, str) or not judge_model.strip():
        raise ConfigError(
            "judge_model", f"got {judge_model!r}", "Name a LiteLLM model, e.g. 'openai/gpt-4.1'"
        )
    if not isinstance(rubric, str) or not rubric.strip():
        raise ConfigError("rubric", "is empty", "Leave it out to use DEFAULT_RUBRIC")
    extra = dict(extra_litellm_params or {})
    if extra.get("model", judge_model) != judge_model:
        raise ConfigError(
            "extra_litellm_params['model']",
            f"{extra['model']!r} differs from judge_model {judge_model!r}",
            "Name the judge once, as judge_model",
        )
    extra.pop("model", None)
    for name in _RESERVED:
        if name in extra:
            raise ConfigError(
                f"extra_litellm_params[{name!r}]",
                "is set by RULER itself",
                "Leave it out; change the prompt through `rubric`",
            )
    messages = judge_messages(message_lists, rubric, tools)
    return {
        "model": judge_model,
        "messages": messages,
        "response_format": response_format(len(message_lists)),
        **extra,
    }


def _asked_again(
    request: dict[str, Any], content: str | None, failure: JudgeError, ids: Sequence[str]
) -> dict[str, Any]:
    """`request` with the judge's unusable answer and what was wrong with it appended, so
    that the second answer can mend the first instead of drawing the same one again."""
    retry = (
        f"That answer could not be used: {failure}. Answer again with JSON only, "
        f'{{"scores": [...]}} with exactly one entry for each trajectory id ({", ".join(ids)}), '
        "each a score from 0 to 1."
    )
    messages = [
        *request["messages"],
        {"role": "assistant", "content": content or ""},
        {"role": "user", "content": retry},
    ]
    return {**request, "messages": messages}


def _cache_store(cache: bool | str | os.PathLike[str]) -> JudgeCache | None:
    if cache is False or os.environ.get("ART_RULER_CACHE", "").lower() in ("0", "false", "off"):
        return None
    return JudgeCache(default_cache_dir() if cache is True else Path(cache))


def _content(response: Any) -> str | None:
    choices = getattr(response, "choices", None) or []
    if not choices:
        return None
    content = choices[0].message.content
    return content if isinstance(content, str) else None


def _litellm_names() -> tuple[Callable[..., Awaitable[Any]], type]:
    """The `acompletion` RULER calls and the response type it accepts: ART's import path
    `art.rewards.ruler` holds them where it is loaded (users and tests replace them
    there), LiteLLM's own otherwise. Looked up on each call, never imported from here, so
    `art.ruler` does not depend on the import path that re-exports it."""
    module = sys.modules.get("art.rewards.ruler")
    if module is not None:
        return module.acompletion, module.ModelResponse
    litellm = load_litellm()
    from litellm.types.utils import ModelResponse

    return litellm.acompletion, ModelResponse


def _record_cost(judge_model: str, response: Any) -> float | None:
    """The judge call's cost in US dollars, recorded as `costs/<context>/judge/ruler` in
    the active `MetricsBuilder` if any; None where the judge is unpriced.

    As in ART the provider is the model name's prefix (`openai/...`): a name without one
    is unpriced, and so is a model no price table knows (a judge on our own endpoint).
    """
    provider, slash, _ = judge_model.partition("/")
    if not slash or not provider.strip():
        return None
    try:
        try:
            builder = MetricsBuilder.get_active()
        except LookupError:
            return extract_api_cost(response, provider=provider, model_name=judge_model)
        return builder.add_response_cost(
            COST_SOURCE, response, provider=provider, model_name=judge_model
        )
    except CostUnavailableError:
        return None


def whole_trajectory(trajectory: Trajectory) -> list[Message]:
    """The messages the judge reads for `trajectory`: the main conversation, then each
    additional history after a divider naming it, so the judge sees every LLM call."""
    messages: list[Message] = list(trajectory.messages())
    count = len(trajectory.additional_histories)
    for index, history in enumerate(trajectory.additional_histories, start=1):
        divider = (
            f"--- additional conversation {index} of {count} in this same trajectory: "
            "another LLM call the agent made (a sub-agent, a summarizer, another node) ---"
        )
        messages.append({"role": "system", "content": divider})
        messages.extend(history.messages())
    return messages


def _tools_of(trajectories: Sequence[Trajectory]) -> list[Tool]:
    """Every distinct tool the trajectories had (histories included), in first-seen order."""
    seen: dict[str, Tool] = {}
    for trajectory in trajectories:
        owners: list[Trajectory | History] = [trajectory, *trajectory.additional_histories]
        for owner in owners:
            for tool in owner.tools or []:
                seen.setdefault(json.dumps(tool, sort_keys=True), tool)
    return list(seen.values())
