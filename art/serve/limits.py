"""Request bodies over the server's limit are refused with 413 before they are read whole."""

from __future__ import annotations

from ..runtime.endpoint.server import ApiError
from .access import ASGIApp, Message, Receive, Scope, Send, log_rejected


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, whether declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        received = 0
        started = False

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise _TooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except _TooLarge:
            if not started:
                await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = ApiError(
            413,
            f"body: larger than this server's limit of {self.max_bytes} bytes "
            "(art serve --max-body-mb)",
            param="body",
            code="body_too_large",
        )
        log_rejected(scope["method"], scope["path"], error)
        await error.response()(scope, receive, send)


class _TooLarge(Exception):
    pass


__all__ = ["BodyLimit"]
