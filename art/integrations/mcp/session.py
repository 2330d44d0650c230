"""One connection to an MCP server, shared by every rollout that uses it.

The `mcp` SDK's `Client` multiplexes requests over one connection (JSON-RPC ids), so
many rollouts may call tools on one `MCPSession` at once. Open it with `async with`
in the task that also closes it (the SDK's transports are anyio task groups).

A shared session shares the server's state too: a note one rollout adds is there for
the next. For rollouts that each start from the same state, pass
`MCPRolloutConfig(fresh_sessions=True)`: every rollout then starts its own server
process from the session's stdio command (which must keep its state in that process,
e.g. the notes server's `--db :memory:`) and stops it when it ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ...core.data.errors import ArtError, ConfigError
from .types import MCPResource, MCPTool

if TYPE_CHECKING:
    from mcp import Client, StdioServerParameters

logger = logging.getLogger("art.mcp")


class MCPConnectionError(ArtError):
    """An MCP server could not be started or reached, or a session was used while closed."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool call returned, as text; `is_error` when the server reported a failure."""

    text: str
    is_error: bool


class MCPSession:
    """A connection to one MCP server over stdio or streamable HTTP.

        async with MCPSession.stdio(sys.executable, ["server.py"]) as session:
            tools = await session.list_tools()

    Tool and resource listings are read once and cached; `refresh=True` reads again.
    """

    def __init__(
        self,
        server: str | StdioServerParameters,
        *,
        name: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if timeout <= 0:
            raise ConfigError("timeout", f"must be positive, got {timeout}", "Pass seconds > 0")
        self._server = server
        self.name = name or (server if isinstance(server, str) else Path(server.command).name)
        self.timeout = timeout
        self._client: Client | None = None
        self._runner: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._tools: list[MCPTool] | None = None
        self._resources: list[MCPResource] | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        timeout: float = 30.0,
    ) -> MCPSession:
        """A server started as a subprocess (`command args...`) and spoken to over stdio."""
        from mcp import StdioServerParameters

        parameters = StdioServerParameters(
            command=command,
            args=list(args),
            env=dict(env) if env is not None else None,
            cwd=Path(cwd) if cwd is not None else None,
        )
        return cls(
            parameters, name=name or Path(args[0] if args else command).stem, timeout=timeout
        )

    @classmethod
    def http(cls, url: str, *, name: str | None = None, timeout: float = 30.0) -> MCPSession:
        """A server reached over streamable HTTP at `url` (e.g. `http://127.0.0.1:8000/mcp`)."""
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                "url", f"{url!r} is not an http(s) URL", "Pass e.g. 'http://127.0.0.1:8000/mcp'"
            )
        return cls(url, name=name, timeout=timeout)

    # --- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> MCPSession:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Start (stdio) or reach (HTTP) the server and complete the MCP handshake."""
        if self._runner is not None:
            return
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._runner = asyncio.create_task(self._hold(ready), name=f"mcp-session-{self.name}")
        try:
            self._client = await ready
        except BaseException as error:
            runner, self._runner = self._runner, None
            runner.cancel()
            if isinstance(error, Exception):
                raise MCPConnectionError(
                    f"cannot connect to MCP server {self.name!r}: {type(error).__name__}: "
                    f"{error}. Check the command (stdio) or that the server is listening (HTTP)"
                ) from error
            raise

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        # The SDK's transports are anyio task groups, which must be left in the task that
        # entered them; this task owns the connection so any task may use and close it.
        from mcp import Client

        try:
            async with Client(self._server, read_timeout_seconds=self.timeout) as client:
                ready.set_result(client)
                await self._closing.wait()
        except Exception as error:
            if ready.done():
                raise
            ready.set_exception(error)

    async def close(self) -> None:
        """Close the connection (and stop a stdio server). Safe to call twice, from any task."""
        runner, self._runner = self._runner, None
        self._client = None
        if runner is None:
            return
        self._closing.set()
        try:
            await runner
        except Exception as error:  # the server failed earlier; closing must still finish
            logger.warning("MCP server %r ended with an error: %r", self.name, error)

    def fresh_copy(self) -> MCPSession:
        """An unopened session to a new instance of this server (for `fresh_sessions`)."""
        if isinstance(self._server, str):
            raise ConfigError(
                "fresh_sessions",
                f"session {self.name!r} reaches a running server over HTTP, and a new "
                "connection to it sees the same state",
                "Pass MCPSession.stdio(...) sessions (each rollout starts its own server "
                "process), or reset the HTTP server's state yourself and leave "
                "fresh_sessions=False",
            )
        return MCPSession(self._server, name=self.name, timeout=self.timeout)

    @property
    def connected(self) -> bool:
        return self._client is not None

    def _connected(self) -> Client:
        if self._client is None:
            raise MCPConnectionError(
                f"MCP session {self.name!r} is not open. "
                "Use `async with session:` (or `await session.connect()`) first"
            )
        return self._client

    # --- discovery --------------------------------------------------------------------

    async def list_tools(self, *, refresh: bool = False) -> list[MCPTool]:
        """The server's tools, with their JSON schemas (all pages)."""
        async with self._lock:
            if self._tools is None or refresh:
                client = self._connected()
                pages = await _all_pages(lambda cursor: client.list_tools(cursor=cursor))
                self._tools = [
                    MCPTool(
                        name=tool.name,
                        description=tool.description or "",
                        parameters=dict(tool.input_schema),
                    )
                    for page in pages
                    for tool in page.tools
                ]
            return list(self._tools)

    async def list_resources(self, *, refresh: bool = False) -> list[MCPResource]:
        """The server's resources (all pages); empty when it offers none."""
        async with self._lock:
            if self._resources is None or refresh:
                client = self._connected()
                if client.server_capabilities.resources is None:
                    self._resources = []
                    return []
                pages = await _all_pages(lambda cursor: client.list_resources(cursor=cursor))
                self._resources = [
                    MCPResource(
                        uri=str(resource.uri),
                        name=resource.name,
                        description=resource.description or "",
                        mime_type=resource.mime_type,
                    )
                    for page in pages
                    for resource in page.resources
                ]
            return list(self._resources)

    async def read_resource(self, uri: str) -> str:
        """The text of resource `uri` (binary parts are described, not decoded)."""
        result = await self._connected().read_resource(uri)
        return "\n".join(_content_text(part) for part in result.contents)

    # --- calls ------------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        read_timeout_seconds: float | None = None,
    ) -> ToolResult:
        """Call tool `name`; the server's own failures come back as `is_error` results.

        Raises `mcp.MCPError` for protocol-level failures (a timeout, a closed connection).
        """
        result = await self._connected().call_tool(
            name, dict(arguments or {}), read_timeout_seconds=read_timeout_seconds or self.timeout
        )
        text = "\n".join(_content_text(part) for part in result.content)
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content)
        return ToolResult(text=text, is_error=bool(result.is_error))

    def __repr__(self) -> str:
        state = "open" if self.connected else "closed"
        return f"MCPSession({self.name!r}, {state})"


class _Page(Protocol):
    @property
    def next_cursor(self) -> str | None: ...


PageT = TypeVar("PageT", bound=_Page)


async def _all_pages(list_page: Callable[[str | None], Awaitable[PageT]]) -> list[PageT]:
    """Every page of an MCP list call: `list_page(cursor)`, from no cursor until a page
    gives none."""
    pages = [await list_page(None)]
    while pages[-1].next_cursor is not None:
        pages.append(await list_page(pages[-1].next_cursor))
    return pages


def _content_text(part: Any) -> str:
    """Text of one MCP content block; other kinds (images, blobs) as a short description."""
    text = getattr(part, "text", None)
    if isinstance(text, str):
        return text
    resource = getattr(part, "resource", None)
    if resource is not None:
        return _content_text(resource)
    kind = getattr(part, "type", type(part).__name__)
    mime = getattr(part, "mime_type", None)
    return f"[{kind} content{f' ({mime})' if mime else ''} not shown]"
