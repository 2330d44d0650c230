"""An MCP server (stdio) whose tools misbehave on request: slow, huge, or failing."""

from __future__ import annotations

import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("misbehaving", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Return `text` unchanged."""
    return text


@server.tool()
def sleep(seconds: float) -> str:
    """Wait `seconds`, then say so."""
    time.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def big(characters: int) -> str:
    """Return a text of `characters` characters."""
    return "x" * characters


@server.tool()
def fail(reason: str) -> str:
    """Always fail, with `reason`."""
    raise ToolError(reason)


if __name__ == "__main__":
    server.run("stdio")
