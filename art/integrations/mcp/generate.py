"""Synthesize training scenarios from a server's tools with any LiteLLM model.

The generator is asked for JSON matching a schema (structured output), in batches,
until `num_scenarios` valid, distinct tasks are in hand: each a non-empty task with an
integer difficulty 1..5. Invalid or duplicate items are dropped and asked for again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...core.data.arguments import check_at_least
from ...core.data.errors import ArtError, ConfigError
from .types import GeneratedScenario, GeneratedScenarioCollection, MCPResource, MCPTool

if TYPE_CHECKING:
    from ...core.model import Model


class ScenarioGenerationError(ArtError):
    """The generator model did not give enough valid scenarios within the attempts allowed."""


def scenario_schema(count: int, max_task_length: int) -> dict[str, Any]:
    """The JSON schema of one generator answer: exactly `count` scenarios."""
    return {
        "type": "object",
        "properties": {
            "scenarios": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "minLength": 10, "maxLength": max_task_length},
                        "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
                    },
                    "required": ["task", "difficulty"],
                    "additionalProperties": False,
                },
                "minItems": count,
                "maxItems": count,
            }
        },
        "required": ["scenarios"],
        "additionalProperties": False,
    }


def _prompt(
    tools: list[MCPTool],
    resources: list[MCPResource],
    count: int,
    custom_instructions: str | None,
    avoid: list[str],
) -> str:
    lines = [
        "You write tasks for testing an AI agent that works through the tools of an MCP server.",
        "",
        "TOOLS:",
        json.dumps([tool.to_dict() for tool in tools], indent=1),
    ]
    if resources:
        lines += ["", "RESOURCES:", json.dumps([r.to_dict() for r in resources], indent=1)]
    lines += [
        "",
        f"Write {count} different tasks a real user might ask for, each solvable with these "
        "tools (do not name the tools in the task). Vary them from simple (one tool call) to "
        "complex (several calls). Rate each task's difficulty from 1 (one call) to 5 "
        "(many steps and analysis).",
        'Answer with JSON: {"scenarios": [{"task": "...", "difficulty": 1}, ...]}.',
    ]
    if avoid:
        lines += ["", "These tasks exist already; write different ones:", *avoid[-20:]]
    if custom_instructions:
        lines += ["", f"Follow these instructions closely: {custom_instructions}"]
    return "\n".join(lines)


def _as_tools(tools: Sequence[MCPTool | Mapping[str, Any]]) -> list[MCPTool]:
    return [tool if isinstance(tool, MCPTool) else MCPTool.from_dict(tool) for tool in tools]


def _as_resources(resources: Sequence[MCPResource | Mapping[str, Any]]) -> list[MCPResource]:
    return [r if isinstance(r, MCPResource) else MCPResource.from_dict(r) for r in resources]


def _valid_items(content: str | None) -> tuple[list[GeneratedScenario], int]:
    """The valid scenarios in one answer, and how many items were invalid."""
    try:
        data = json.loads(content or "")
    except json.JSONDecodeError:
        return [], 1
    items = data.get("scenarios") if isinstance(data, dict) else data
    if not isinstance(items, list):
        return [], 1
    valid: list[GeneratedScenario] = []
    for item in items:
        task = item.get("task") if isinstance(item, dict) else None
        difficulty = item.get("difficulty") if isinstance(item, dict) else None
        if (
            isinstance(task, str)
            and task.strip()
            and isinstance(difficulty, int)
            and not isinstance(difficulty, bool)
            and 1 <= difficulty <= 5
        ):
            valid.append(GeneratedScenario(task=" ".join(task.split()), difficulty=difficulty))
    return valid, len(items) - len(valid)


async def generate_scenarios(
    tools: Sequence[MCPTool | Mapping[str, Any]],
    resources: Sequence[MCPResource | Mapping[str, Any]] = (),
    num_scenarios: int = 24,
    show_preview: bool = True,
    custom_instructions: str | None = None,
    generator_model: str | Model = "openai/gpt-4.1-mini",
    generator_api_key: str | None = None,
    generator_base_url: str | None = None,
    *,
    extra_litellm_params: Mapping[str, Any] | None = None,
    batch_size: int = 8,
    max_attempts: int = 6,
    max_task_length: int = 300,
    max_tokens: int | None = None,
) -> GeneratedScenarioCollection:
    """Ask `generator_model` for exactly `num_scenarios` tasks that `tools` can solve.

    `generator_model` is any LiteLLM model name (with `generator_api_key` and
    `generator_base_url` where needed), or an `art.Model`, whose own endpoint is used
    (the local default model included). Requests ask for at most `batch_size` scenarios
    each, with a JSON schema as `response_format`; duplicates (ignoring case and spacing)
    and invalid items are dropped. Raises `ScenarioGenerationError` when `max_attempts`
    requests do not yield enough.
    """
    tool_list, resource_list = _as_tools(tools), _as_resources(resources)
    if not tool_list and not resource_list:
        raise ConfigError(
            "tools", "no tools or resources given", "Pass `await session.list_tools()`"
        )
    check_at_least(
        num_scenarios=(num_scenarios, 1), batch_size=(batch_size, 1), max_attempts=(max_attempts, 1)
    )
    if isinstance(generator_model, str):
        params: dict[str, Any] = {"model": generator_model}
        if generator_api_key is not None:
            params["api_key"] = generator_api_key
        if generator_base_url is not None:
            params["base_url"] = generator_base_url
    else:
        params = generator_model.litellm_completion_params()
    params |= dict(extra_litellm_params or {})

    import litellm

    scenarios: list[GeneratedScenario] = []
    seen: set[str] = set()
    problems: list[str] = []
    for attempt in range(1, max_attempts + 1):
        count = min(batch_size, num_scenarios - len(scenarios))
        response = await litellm.acompletion(
            messages=[
                {
                    "role": "user",
                    "content": _prompt(
                        tool_list,
                        resource_list,
                        count,
                        custom_instructions,
                        [s.task for s in scenarios],
                    ),
                }
            ],
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "scenario_list",
                    "schema": scenario_schema(count, max_task_length),
                    "strict": True,
                },
            },
            max_tokens=max_tokens or 64 + count * (max_task_length // 3 + 16),
            **params,
        )
        valid, invalid = _valid_items(response.choices[0].message.content)
        duplicates = 0
        for scenario in valid:
            key = scenario.task.casefold()
            if key in seen:
                duplicates += 1
                continue
            seen.add(key)
            scenarios.append(scenario)
        if invalid or duplicates:
            problems.append(f"attempt {attempt}: {invalid} invalid, {duplicates} duplicate")
        if len(scenarios) >= num_scenarios:
            break
    if len(scenarios) < num_scenarios:
        raise ScenarioGenerationError(
            f"{params['model']} gave {len(scenarios)} valid distinct scenarios of the "
            f"{num_scenarios} asked for in {max_attempts} requests "
            f"({'; '.join(problems) or 'answers too short'}). Raise max_attempts, ask for "
            "fewer, or use a stronger generator_model"
        )
    collection = GeneratedScenarioCollection(scenarios[:num_scenarios])
    if show_preview:
        collection.preview(n=min(5, num_scenarios))
    return collection


def preview_scenarios(scenarios: Sequence[Mapping[str, Any]], n: int = 5) -> str:
    """Print (and return) the first `n` of scenarios given as dicts (`task`, and
    `difficulty` where known), as ART's `preview_scenarios` does."""
    lines = []
    for i, scenario in enumerate(scenarios[:n]):
        task = str(scenario["task"])
        shown = task[:120].strip() + ("..." if len(task) > 120 else "")
        lines.append(f"{i + 1}. {shown}  (difficulty {scenario.get('difficulty', 'N/A')}/5)")
    text = "\n".join(lines)
    print(text)
    return text
