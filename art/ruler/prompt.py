"""What the RULER judge is shown, and the JSON shape its answer must take.

The judge sees the context the trajectories share once, then what each one did after
it under its id, the tools the agent had and the rubric; it answers with an analysis of
what a correct result is, then one `{trajectory_id, reply, explanation, score}` per
trajectory, where `reply` quotes that trajectory's final reply.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from textwrap import dedent
from typing import Any

from ..core.data.types import Message, Tool

DEFAULT_RUBRIC = dedent(
    """\
    - A trajectory that reaches the goal scores clearly higher than one that does not.
    - Between two that reach it, the one that gets there more directly (fewer wasted
      steps, no needless detours or chatter) scores higher.
    - Partial progress towards the goal earns partial credit.
    - Make score gaps match quality gaps: near-equal work gets near-equal scores, much
      better work a much higher score."""
)
"""The rubric RULER grades by unless given another. It names no task: the judge reads the
task from the trajectories' own system and user messages."""

# Keeps a small judge from rambling; a sentence or two is all an explanation needs.
EXPLANATION_MAX_CHARS = 120
# The start of a trajectory's final reply, quoted before it is scored (see `response_format`).
REPLY_MAX_CHARS = 120
# Room to state what a correct result is before any score (see `response_format`).
ANALYSIS_MAX_CHARS = 300

_INSTRUCTIONS = """\
You grade attempts by an AI agent. Every trajectory below was given the same task; \
work out what the task asks from the messages, then compare the trajectories with \
each other and give each a score from 0 to 1 (1 is best).

Grade by this rubric:
{rubric}

Answer with JSON only: {{"analysis": ..., "scores": [{{"trajectory_id": ..., \
"reply": ..., "explanation": ..., "score": ...}}, ...]}}. Start with the analysis: in a \
sentence or two, what a correct result of the task is (work it out yourself where you \
can: compute the answer, read what the tools returned). Then exactly one entry for each \
trajectory id ({ids}), in order: copy that trajectory's final reply word for word into \
"reply" (its start, if it is long), say in "explanation" how it compares with the correct \
result, then score it."""


def trajectory_ids(count: int) -> list[str]:
    """The ids the judge knows the trajectories by: "1" to "N", in the order given."""
    return [str(index) for index in range(1, count + 1)]


def shared_prefix_length(message_lists: Sequence[Sequence[Message]]) -> int:
    """How many leading messages every list has in common.

    Capped so that each trajectory keeps at least its last message: the judge compares
    what the trajectories did, so each one must show something of its own, even when
    two are identical.
    """
    if not message_lists:
        return 0
    shortest = min(len(messages) for messages in message_lists)
    length = 0
    while length < shortest - 1 and all(
        messages[length] == message_lists[0][length] for messages in message_lists
    ):
        length += 1
    return length


def render_message(message: Message) -> str:
    """One message as the judge reads it: its role, then its text and any tool calls."""
    item: dict[str, Any] = dict(message)
    header = str(item.get("role", "?"))
    if item.get("name"):
        header += f" {item['name']}"
    if item.get("tool_call_id"):
        header += f", result of call {item['tool_call_id']}"
    lines = [f"[{header}]"]
    content = item.get("content")
    if isinstance(content, str):
        lines.append(content)
    elif content is not None:
        lines.append(json.dumps(content, ensure_ascii=False))
    for call in item.get("tool_calls") or []:
        function = call.get("function", {})
        lines.append(f"calls {function.get('name')}({function.get('arguments', '')})")
    return "\n".join(lines)


def _render_tools(tools: Sequence[Tool]) -> str:
    lines = []
    for tool in tools:
        function = tool["function"]
        description = function.get("description", "")
        parameters = json.dumps(function.get("parameters", {}), ensure_ascii=False)
        lines.append(f"- {function['name']}: {description} parameters {parameters}".strip())
    return "\n".join(lines)


def judge_messages(
    message_lists: Sequence[Sequence[Message]],
    rubric: str,
    tools: Sequence[Tool] | None = None,
) -> list[dict[str, str]]:
    """The system and user messages that ask the judge to score `message_lists`."""
    ids = trajectory_ids(len(message_lists))
    prefix = shared_prefix_length(message_lists)
    sections: list[str] = []
    if tools:
        sections.append(f"<tools>\n{_render_tools(tools)}\n</tools>")
    if prefix:
        shared = "\n\n".join(render_message(m) for m in message_lists[0][:prefix])
        sections.append(f"<shared_context>\n{shared}\n</shared_context>")
    for trajectory_id, messages in zip(ids, message_lists, strict=True):
        body = "\n\n".join(render_message(m) for m in messages[prefix:])
        sections.append(f'<trajectory id="{trajectory_id}">\n{body}\n</trajectory>')
    instructions = _INSTRUCTIONS.format(rubric=rubric.strip(), ids=", ".join(ids))
    return [
        {"role": "system", "content": instructions},
        {"role": "user", "content": "\n\n".join(sections)},
    ]


def longest_answer_chars(count: int) -> int:
    """The length of the longest answer `response_format(count)` admits, written as JSON
    usually is (`json.dumps`' separators, every string at its `maxLength`, in ASCII).

    A judge decoding under the schema finishes within this many tokens whatever it writes
    (a byte-level tokenizer's token covers at least one ASCII character), so a budget this
    large cannot cut a small judge's answer off inside a string when it repeats itself.
    """
    entry = {
        "trajectory_id": str(count),
        "reply": "x" * REPLY_MAX_CHARS,
        "explanation": "x" * EXPLANATION_MAX_CHARS,
        "score": 0.99,
    }
    longest = {"analysis": "x" * ANALYSIS_MAX_CHARS, "scores": [entry] * count}
    return len(json.dumps(longest))


def response_format(count: int) -> dict[str, Any]:
    """The `response_format` asking for an analysis, then exactly one score per id.

    The analysis comes first so that the judge works out what a correct result is before
    it writes any score: a score decoded first is a guess the explanation then defends
    (Qwen2.5 Coder 1.5B on 8 hand-scored groups of the demo's arithmetic, 35 pairs: 0.54
    pairwise accuracy without it, 0.77 with it; `benchmarks/RESULTS.md`). Each entry then
    quotes its trajectory's final reply before explaining and scoring it: without the
    quote the same judge wrote one explanation and copied it to every trajectory, whatever
    each one said (task rubrics, pairwise accuracy: arithmetic 0.59 without, 0.75 with;
    tool use 0.49 without, 0.59 with). Entry `i` must carry id `i`, so an engine that
    decodes under the schema cannot leave an id out, repeat one or invent one; providers
    that ignore the schema are caught by the check of the answer, which reads `scores`
    alone.
    """
    ids = trajectory_ids(count)

    def entry(id_schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "trajectory_id": id_schema,
                "reply": {"type": "string", "maxLength": REPLY_MAX_CHARS},
                "explanation": {"type": "string", "maxLength": EXPLANATION_MAX_CHARS},
                # Steps of 0.01 also stop a small model decoding digits without end.
                "score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
            },
            "required": ["trajectory_id", "reply", "explanation", "score"],
            "additionalProperties": False,
        }

    schema = {
        "type": "object",
        "properties": {
            "analysis": {"type": "string", "maxLength": ANALYSIS_MAX_CHARS},
            "scores": {
                "type": "array",
                "prefixItems": [entry({"type": "string", "const": i}) for i in ids],
                "items": entry({"type": "string", "enum": ids}),
                "minItems": count,
                "maxItems": count,
            },
        },
        "required": ["analysis", "scores"],
        "additionalProperties": False,
    }
    return {"type": "json_schema", "json_schema": {"name": "ruler_scores", "schema": schema}}
