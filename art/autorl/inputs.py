"""Training inputs written by an LLM from a one-line task description.

The generator is any LiteLLM model, asked for a batch of inputs at a time through
structured output (a JSON schema), so even a small local model answers in the right
shape. Inputs are de-duplicated on normalized text, batches repeat until exactly
`num` are collected, and a generator that keeps answering unusably is reported with
what was wrong with its last answer.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.data.arguments import check_at_least
from ..core.data.errors import ArtError, ConfigError
from ..core.metrics.api_costs import CostUnavailableError, load_litellm
from ..core.metrics.cost_tracking import record_api_cost

# The generator's calls are costed as `costs/<context>/autorl/inputs` (ART's scheme).
COST_SOURCE = "autorl/inputs"
# An input is a user message: a sentence or a short paragraph, never an essay.
INPUT_MAX_CHARS = 200
SYSTEM_PROMPT_MAX_CHARS = 300


class InputGenerationError(ArtError):
    """The generator model did not produce enough usable inputs within its attempts."""


@dataclass
class GeneratedInputs:
    """What `generate_inputs` wrote: the agent's system prompt and two disjoint splits."""

    task_description: str
    system_prompt: str
    train: list[str]
    val: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> GeneratedInputs:
        data = json.loads(text)
        return cls(
            task_description=str(data["task_description"]),
            system_prompt=str(data["system_prompt"]),
            train=[str(item) for item in data["train"]],
            val=[str(item) for item in data["val"]],
        )


def normalize(text: str) -> str:
    """The text inputs are compared by: lower case, punctuation and extra spaces dropped."""
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def inputs_schema(count: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "inputs": {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": INPUT_MAX_CHARS},
                "minItems": count,
                "maxItems": count,
            }
        },
        "required": ["inputs"],
        "additionalProperties": False,
    }


_SYSTEM_PROMPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "system_prompt": {"type": "string", "minLength": 1, "maxLength": SYSTEM_PROMPT_MAX_CHARS}
    },
    "required": ["system_prompt"],
    "additionalProperties": False,
}


def parse_inputs(content: str | None) -> list[str]:
    """The strings of a generator answer, or ValueError saying what is wrong with it."""
    if not content or not content.strip():
        raise ValueError("the answer was empty")
    try:
        data = json.loads(content)
    except json.JSONDecodeError as error:
        raise ValueError(f"the answer was not JSON ({error.msg}): {content[:120]!r}") from None
    items = data.get("inputs") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError(f'the answer was not {{"inputs": [...]}}: {content[:120]!r}')
    texts = [item.strip() for item in items if isinstance(item, str)]
    if len(texts) != len(items):
        raise ValueError(f'"inputs" held something other than strings: {content[:120]!r}')
    return [text for text in texts if text]


async def generate_inputs(
    task_description: str,
    num: int,
    *,
    generator_model: str,
    extra_litellm_params: Mapping[str, Any] | None = None,
    system_prompt: str | None = None,
    num_val: int = 0,
    batch_size: int = 4,
    max_batches: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> GeneratedInputs:
    """Write `num` distinct training inputs (plus `num_val` held out) for a task.

    Args:
        task_description: what the agent should do, in a sentence or two.
        num: how many training inputs to return (exactly).
        generator_model: any LiteLLM model name; `openai/<name>` with `api_base` (or
            `base_url`) and `api_key` in `extra_litellm_params` reaches any
            OpenAI-compatible endpoint, such as a LocalBackend's.
        extra_litellm_params: more keyword arguments for `litellm.acompletion`.
        system_prompt: the agent's system prompt; written by the generator when None.
        num_val: how many more inputs to hold out for validation, disjoint from `train`.
        batch_size: inputs asked for per generator call.
        max_batches: generator calls allowed before giving up (default: enough for
            every input twice over, plus three).
        seed: which inputs go to validation is drawn with this seed.
        progress: show a progress bar of the inputs collected.

    Raises:
        ConfigError: a bad argument, named.
        InputGenerationError: the generator did not give enough usable, distinct inputs
            in `max_batches` calls; the message says what was wrong with its answers.
    """
    if not isinstance(task_description, str) or not task_description.strip():
        raise ConfigError(
            "task_description", "is empty", "Describe the task in a sentence, e.g. 'Answer ...'"
        )
    check_at_least(num=(num, 1), num_val=(num_val, 0), batch_size=(batch_size, 1))
    if not isinstance(generator_model, str) or not generator_model.strip():
        raise ConfigError(
            "generator_model",
            f"got {generator_model!r}",
            "Name a LiteLLM model, e.g. 'openai/gpt-4.1'",
        )
    extra = dict(extra_litellm_params or {})
    for reserved in ("model", "messages", "response_format"):
        if reserved in extra:
            raise ConfigError(
                f"extra_litellm_params[{reserved!r}]",
                "is set by generate_inputs itself",
                "Leave it out; name the model as generator_model",
            )
    extra.setdefault("temperature", 1.0)
    total = num + num_val
    allowed = max_batches if max_batches is not None else 3 + 2 * -(-total // batch_size)

    task = task_description.strip()
    collected: list[str] = []
    seen: set[str] = set()
    problems: list[str] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="writing inputs", unit="input", disable=not progress)
    for _ in range(allowed):
        if len(collected) >= total:
            break
        count = min(batch_size, total - len(collected))
        try:
            content = await _complete(
                generator_model,
                extra,
                _inputs_messages(task, count, collected),
                inputs_schema(count),
            )
            texts = parse_inputs(content)
        except ValueError as error:
            problems.append(str(error))
            continue
        fresh = 0
        for text in texts:
            key = normalize(text)
            if key and key not in seen and len(text) <= INPUT_MAX_CHARS:
                seen.add(key)
                collected.append(text)
                fresh += 1
                bar.update(1)
        if fresh == 0:
            problems.append(f"no new input in {texts[:3]!r}")
    bar.close()
    if len(collected) < total:
        detail = f"; last problem: {problems[-1]}" if problems else ""
        raise InputGenerationError(
            f"{generator_model} gave {len(collected)} of the {total} distinct inputs asked for "
            f"in {allowed} calls{detail}. Use a stronger generator_model, raise max_batches, "
            "or ask for fewer inputs"
        )
    collected = collected[:total]
    rng = random.Random(seed)
    val_indices = set(rng.sample(range(total), num_val))
    if system_prompt is None:
        system_prompt = await _write_system_prompt(task, generator_model, extra, allowed)
    return GeneratedInputs(
        task_description=task,
        system_prompt=system_prompt,
        train=[text for i, text in enumerate(collected) if i not in val_indices],
        val=[text for i, text in enumerate(collected) if i in val_indices],
    )


def _inputs_messages(task: str, count: int, already: list[str]) -> list[dict[str, str]]:
    avoid = ""
    if already:
        listed = "\n".join(f"- {text}" for text in already[-10:])
        avoid = f"\n\nThese exist already; write different ones:\n{listed}"
    return [
        {
            "role": "system",
            "content": "You write realistic, varied test inputs for an AI assistant. "
            'Answer with JSON only: {"inputs": ["...", ...]}.',
        },
        {
            "role": "user",
            "content": f"The assistant's task: {task}\n\nWrite {count} different messages a "
            "user might send it, each one self-contained, varied in topic, length and "
            f"phrasing.{avoid}",
        },
    ]


async def _write_system_prompt(
    task: str, generator_model: str, extra: dict[str, Any], attempts: int
) -> str:
    messages = [
        {
            "role": "system",
            "content": 'You write system prompts for AI assistants. Answer with JSON only: {"system_prompt": "..."}.',
        },
        {
            "role": "user",
            "content": f"Write a short system prompt for an assistant whose task is: {task}",
        },
    ]
    problem = ""
    for _ in range(max(attempts, 1)):
        budget = {"max_tokens": SYSTEM_PROMPT_MAX_CHARS // 2} | extra
        content = await _complete(generator_model, budget, messages, _SYSTEM_PROMPT_SCHEMA)
        try:
            data = json.loads(content or "")
            text = data.get("system_prompt") if isinstance(data, dict) else None
        except json.JSONDecodeError:
            text = None
        if isinstance(text, str) and text.strip():
            return text.strip()
        problem = f"{(content or '')[:120]!r}"
    raise InputGenerationError(
        f"{generator_model} wrote no usable system prompt in {attempts} calls; last answer "
        f"{problem}. Pass system_prompt yourself or use a stronger generator_model"
    )


async def _complete(
    model: str, extra: Mapping[str, Any], messages: list[dict[str, str]], schema: dict[str, Any]
) -> str | None:
    litellm = load_litellm()
    response = await litellm.acompletion(
        model=model,
        messages=messages,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
        **extra,
    )
    _record_cost(model, response)
    content = response.choices[0].message.content
    return content if isinstance(content, str) else None


def _record_cost(model: str, response: Any) -> None:
    """Record the call's cost in the active `MetricsBuilder` (`model.activate_metrics_
    context(...)`), where one is active and the model is priced; as for RULER's judge the
    provider is the name's prefix, and a model without one (or ours) is unpriced."""
    provider, slash, _ = model.partition("/")
    if not slash or not provider.strip():
        return
    try:
        record_api_cost(COST_SOURCE, response, provider=provider, model_name=model)
    except CostUnavailableError:
        return
