"""Request bodies over the server's limit are refused with 413 before they are read whole."""

from __future__ import annotations

from ..runtime.endpoint.server import ApiError
from .access import ASGIApp, Message, Receive, Scope, Send, log_rejected


class BodyLimit:
    """ASGI middleware: 413 for a body over `max_bytes`, whether declared or streamed.

    A body without a length (chunked) is read here up to the limit before the app sees
    it: an error raised from inside the app's read would reach the client as whatever the
    app makes of it (FastAPI: a 400 "error parsing the body").
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            if declared.isdigit() and int(declared) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server holds it to its length
            return
        messages: list[Message] = []
        received = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: the app sees it
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        queued = iter(messages)

        async def replay() -> Message:
            return next(queued, None) or await receive()

        await self.app(scope, replay, send)

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


__all__ = ["BodyLimit"]
