"""A request-body size limit as ASGI middleware: larger bodies are answered 413 before a route sees them.

The declared `Content-Length` is checked first; a body sent without one (chunked) is counted as it
arrives, and reading past the limit raises `BodyTooLarge`, which the problem handlers answer with 413.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.service.problems import problem_response


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a streamed body passes the limit."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body exceeds {max_bytes} bytes")


class BodyLimit:
    """Reject request bodies over `max_bytes` with a 413 problem document."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            detail = f"the request body exceeds {self.max_bytes} bytes"
            await problem_response(413, "too_large", detail, instance=scope.get("path"))(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counting_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
