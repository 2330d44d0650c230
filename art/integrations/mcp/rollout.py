"""The tool loop of one MCP rollout: the model calls a server's tools until it is done.

Each turn the model sees the conversation and every tool of the given sessions (plus
the built-in `complete_task`). Its tool calls go to the session that owns the tool,
and each result comes back as a `tool` message. The loop ends when the model answers
without a call, calls `complete_task`, or reaches `max_turns`. Calling `complete_task`
is recorded in `metrics['completed']`, never in `metrics['tool_calls']`, so a reward
built on tool use does not pay a rollout that only quits.

A bad call is data, not a crash: an unknown tool, arguments that are not a JSON
object, a tool the server reports as failed, a timeout or a dropped connection each
become a tool message starting with "Error:" that the model can react to, and are
counted in `metrics['tool_errors']`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ...core.data.arguments import check_at_least
from ...core.data.errors import ConfigError
from ...core.data.trajectories import Trajectory
from .session import MCPSession, ToolResult
from .types import GeneratedScenario, MCPTool

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageToolCallUnion

    from ...core.model import Model

COMPLETE_TASK = "complete_task"
COMPLETE_TASK_TOOL = MCPTool(
    name=COMPLETE_TASK,
    description="Call this when the task is done, with a short summary of the result.",
    parameters={
        "type": "object",
        "properties": {"summary": {"type": "string", "description": "What was done and found"}},
        "required": ["summary"],
    },
)
DEFAULT_SYSTEM_PROMPT = (
    "You are an agent that completes the user's task with the tools provided. "
    "Call one tool at a time and read its result. When the task is done, call "
    f"{COMPLETE_TASK} with a short summary."
)

ToolChoice = Literal["auto", "required", "none"] | Mapping[str, Any]


@dataclass(frozen=True)
class MCPRolloutConfig:
    """How an MCP rollout runs. Every field has a default; override what you need."""

    max_turns: int = 8
    """Model turns before the rollout stops (metrics['hit_turn_limit'] records it)."""
    max_tokens: int = 512
    """Tokens the model may sample per turn."""
    temperature: float = 1.0
    """Sampling temperature (1.0 samples as training assumes)."""
    tool_choice: ToolChoice = "auto"
    """Sent with every turn: 'auto', 'required', 'none' or {'type': 'function', ...}."""
    tool_timeout: float = 30.0
    """Seconds a tool call may take before it is recorded as a timeout error."""
    max_result_chars: int = 4000
    """Longer tool results are cut to this many characters, with a note saying so."""
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    """The system message that starts every rollout."""
    complete_task_tool: bool = True
    """Offer the built-in `complete_task` tool that ends the rollout."""
    fresh_sessions: bool = False
    """Give each rollout its own server: the rollout opens a new connection to each given
    stdio session's command (a new server process, so nothing an earlier rollout did is
    seen when the server keeps its state in the process, e.g. `--db :memory:`) and
    closes it when done. The given sessions are templates and need not be open. HTTP
    sessions are refused: a new connection reaches the same server and state. False:
    every rollout uses the given sessions and sees what other rollouts changed."""

    def __post_init__(self) -> None:
        check_at_least(
            max_turns=(self.max_turns, 1),
            max_tokens=(self.max_tokens, 1),
            max_result_chars=(self.max_result_chars, 1),
        )
        if self.tool_timeout <= 0:
            raise ConfigError(
                "tool_timeout", f"must be positive, got {self.tool_timeout}", "Pass seconds > 0"
            )


async def discover_tools(sessions: Sequence[MCPSession]) -> dict[str, tuple[MCPTool, MCPSession]]:
    """Every tool of `sessions`, by name, with the session that serves it."""
    routes: dict[str, tuple[MCPTool, MCPSession]] = {}
    for session in sessions:
        for tool in await session.list_tools():
            if tool.name == COMPLETE_TASK:
                raise ConfigError(
                    f"sessions[{session.name!r}].tools",
                    f"the server defines {COMPLETE_TASK!r}, the name of the built-in tool",
                    "Pass MCPRolloutConfig(complete_task_tool=False) to use the server's own",
                )
            if tool.name in routes:
                raise ConfigError(
                    f"sessions[{session.name!r}].tools",
                    f"tool {tool.name!r} is also served by {routes[tool.name][1].name!r}",
                    "Connect servers whose tool names differ",
                )
            routes[tool.name] = (tool, session)
    return routes


async def mcp_rollout(
    model: Model,
    scenario: str | GeneratedScenario,
    sessions: MCPSession | Sequence[MCPSession],
    config: MCPRolloutConfig | None = None,
) -> Trajectory:
    """Run `model` on `scenario` with the tools of `sessions`; return the trajectory.

    The trajectory holds the conversation (the model's turns as `Choice`s, trainable),
    the tools offered as OpenAI schemas (so a judge sees them), the task in
    `metadata['task']`, and metrics `turns`, `tool_calls` (every call but the built-in
    `complete_task`), `tool_errors`, `tool_results_truncated`, `completed` (whether
    `complete_task` ended the rollout; its history mean is the completion rate) and
    `hit_turn_limit`. Its reward is 0 until a scorer sets it.

    With `config.fresh_sessions` the rollout runs on server processes of its own,
    started from the commands of `sessions` and stopped when it ends.
    """
    config = config or MCPRolloutConfig()
    session_list = [sessions] if isinstance(sessions, MCPSession) else list(sessions)
    if not config.fresh_sessions:
        return await _rollout(model, scenario, session_list, config)
    fresh = [session.fresh_copy() for session in session_list]
    async with AsyncExitStack() as stack:
        for session in fresh:
            await stack.enter_async_context(session)
        return await _rollout(model, scenario, fresh, config)


async def _rollout(
    model: Model,
    scenario: str | GeneratedScenario,
    session_list: list[MCPSession],
    config: MCPRolloutConfig,
) -> Trajectory:
    routes = await discover_tools(session_list)
    if config.complete_task_tool:
        routes_tools = [tool for tool, _ in routes.values()] + [COMPLETE_TASK_TOOL]
    else:
        routes_tools = [tool for tool, _ in routes.values()]
    schemas = [tool.to_tool_schema() for tool in routes_tools]
    task = scenario.task if isinstance(scenario, GeneratedScenario) else scenario
    trajectory = Trajectory(
        messages_and_choices=[
            {"role": "system", "content": config.system_prompt},
            {"role": "user", "content": task},
        ],
        tools=schemas,
        metadata={"task": task},
    )
    if isinstance(scenario, GeneratedScenario):
        trajectory.metadata["difficulty"] = scenario.difficulty
    counts = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "tool_results_truncated": 0}
    completed = answered = False
    client = model.openai_client()
    while counts["turns"] < config.max_turns and not completed:
        completion = await client.chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),
            tools=schemas,  # type: ignore[arg-type]
            tool_choice=config.tool_choice,  # type: ignore[arg-type]
            max_tokens=config.max_tokens,
            temperature=config.temperature,
        )
        counts["turns"] += 1
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        calls = choice.message.tool_calls or []
        if not calls:
            answered = True
            break
        for call in calls:
            outcome = await _run_call(call, routes, config)
            if not outcome.completes:
                # quitting is not tool use: a reward on tool_calls must not pay for it
                counts["tool_calls"] += 1
            if outcome.is_error:
                counts["tool_errors"] += 1
                trajectory.log(f"turn {counts['turns']}: {outcome.text}")
            if outcome.truncated:
                counts["tool_results_truncated"] += 1
            if outcome.completes:
                completed = True
                trajectory.metadata["summary"] = outcome.summary
            trajectory.messages_and_choices.append(
                {"role": "tool", "tool_call_id": call.id, "content": outcome.text}
            )
    trajectory.metrics.update(counts)
    trajectory.metrics["completed"] = completed
    trajectory.metrics["hit_turn_limit"] = not (completed or answered)
    return trajectory.finish()


@dataclass(frozen=True)
class _Outcome:
    text: str
    is_error: bool = False
    truncated: bool = False
    completes: bool = False
    summary: str | None = None


async def _run_call(
    call: ChatCompletionMessageToolCallUnion,
    routes: Mapping[str, tuple[MCPTool, MCPSession]],
    config: MCPRolloutConfig,
) -> _Outcome:
    if call.type != "function":
        return _Outcome(f"Error: unsupported tool call type {call.type!r}", is_error=True)
    function = call.function
    name = function.name
    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError as error:
        return _Outcome(
            f"Error: the arguments of {name!r} are not valid JSON ({error.msg}). "
            "Send a JSON object.",
            is_error=True,
        )
    if not isinstance(arguments, dict):
        return _Outcome(
            f"Error: the arguments of {name!r} must be a JSON object, "
            f"got {type(arguments).__name__}.",
            is_error=True,
        )
    if name == COMPLETE_TASK and config.complete_task_tool:
        summary = arguments.get("summary")
        return _Outcome(
            "Task marked complete.",
            completes=True,
            summary=summary if isinstance(summary, str) else json.dumps(arguments),
        )
    if name not in routes:
        available = ", ".join(sorted(routes)) or "none"
        return _Outcome(
            f"Error: there is no tool {name!r}. Available tools: {available}.", is_error=True
        )
    _, session = routes[name]
    result = await _call(session, name, arguments, config.tool_timeout)
    text = result.text
    truncated = len(text) > config.max_result_chars
    if truncated:
        text = (
            text[: config.max_result_chars]
            + f"\n[truncated: {config.max_result_chars} of {len(result.text)} characters shown]"
        )
    if result.is_error:
        text = text if text.startswith("Error") else f"Error: {text}"
    return _Outcome(text, is_error=result.is_error, truncated=truncated)


async def _call(
    session: MCPSession, name: str, arguments: dict[str, Any], seconds: float
) -> ToolResult:
    """The tool's result; a timeout or a lost connection as an error result."""
    import anyio
    from mcp import MCPError
    from mcp_types import REQUEST_TIMEOUT

    try:
        return await session.call_tool(name, arguments, read_timeout_seconds=seconds)
    except MCPError as error:
        if error.code == REQUEST_TIMEOUT:
            return ToolResult(f"Error: {name!r} timed out after {seconds:g} s.", is_error=True)
        return ToolResult(f"Error: calling {name!r} failed: {error}", is_error=True)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError) as error:
        return ToolResult(
            f"Error: the connection to {session.name!r} is closed ({type(error).__name__}).",
            is_error=True,
        )
