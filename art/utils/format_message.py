"""`format_message`: a chat message as readable text, for printing a trajectory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def format_message(message: Mapping[str, Any]) -> str:
    """`Role:` then the content (or refusal), then one `name(arguments)` line per tool call."""
    role = str(message["role"]).capitalize()
    content = message.get("content") or message.get("refusal") or ""
    if isinstance(content, list):  # content parts: their text is what was said
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    calls = [
        f"{call['function']['name']}({call['function']['arguments']})"
        for call in message.get("tool_calls") or []
    ]
    body = "\n".join([content, *calls] if content else calls)
    return f"{role}:\n{body}"


__all__ = ["format_message"]
