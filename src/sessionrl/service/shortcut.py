"""A direct way in for the busiest route, `POST /v1/sessions/{session_id}/steps`.

The framework's routing, dependency resolution and parameter validation cost a step more than the engine
spends on it. `StepShortcut`, an ASGI middleware just outside the framework's router (inside the metrics
and body-limit layers), serves a step request itself when everything about it is in order: a JSON body
that is a valid step, a token that may write, well-formed `Idempotency-Key` and `If-Match` headers. It
then calls the route function itself (`steps.run_step`), so the answer, the step metrics, the key's scope
and the rate limit are the route's. Anything else (another route, a bad body or header, a missing or
unknown token, a body of undeclared length, a request the framework traces) goes on to the framework
unchanged, its body replayed, and is answered there as documented; nothing was charged to it yet.
"""

from __future__ import annotations

import json
import re
from collections import deque
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.errors import SessionRLError
from sessionrl.service.auth import Principal, identify, throttle
from sessionrl.service.config import Scope as TokenScope
from sessionrl.service.deps import IDEMPOTENCY_KEY_PATTERN, IF_MATCH_PATTERN
from sessionrl.service.problems import ProblemError, error_response
from sessionrl.service.routers import steps
from sessionrl.service.schemas import StepRequest

STEP_PATH = re.compile(r"/v1/sessions/([^/]+)/steps")
STEP_BODY: TypeAdapter[Any] = TypeAdapter(StepRequest)
IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
IF_MATCH = re.compile(IF_MATCH_PATTERN)
HEADERS = (b"authorization", b"content-type", b"content-length", b"idempotency-key", b"if-match")
"""The request headers the step route reads (besides those the outer layers read themselves)."""


class StepShortcut:
    """Serve well-formed, authorised step requests without the framework's router (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.route = next(
            r for r in steps.router.routes if isinstance(r, APIRoute) and r.endpoint is steps.run_step
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session_id = _step_target(scope)
        headers = _step_headers(scope) if session_id is not None else None
        if session_id is None or headers is None:
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        admitted = None if body is None else _admit(scope["app"].state, headers, body)
        if admitted is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        principal, step = admitted
        scope["route"] = self.route
        request = Request(scope)
        try:
            throttle(request.app.state.limiter, principal)
            response = await steps.run_step(
                session_id,
                step,
                request,
                principal,
                headers.get(b"idempotency-key"),
                headers.get(b"if-match"),
            )
        except (ProblemError, SessionRLError) as exc:
            response = error_response(exc, request.url.path)
        await response(scope, receive, send)


def _step_target(scope: Scope) -> str | None:
    """The session id of a step request this shortcut may serve, else None."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    if "fastapi.telemetry" in scope:  # traced: the framework names the span after the route it picks
        return None
    match = STEP_PATH.fullmatch(scope["path"])
    return match.group(1) if match is not None else None


def _step_headers(scope: Scope) -> dict[bytes, str] | None:
    """The headers the route reads, when each is there at most once and the body is declared JSON."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in HEADERS:
            if name in found:
                return None
            found[name] = value.decode("latin-1")
    if b"content-length" not in found or found.get(b"content-type", "").lower() != "application/json":
        return None
    return found


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """Every message of the request body, and the body (None if the client went away first)."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that gives back the messages already read, then reads on."""
    pending = deque(messages)

    async def again() -> Message:
        return pending.popleft() if pending else await receive()

    return again


def _admit(state: Any, headers: dict[bytes, str], body: bytes) -> tuple[Principal, Any] | None:
    """The principal and the validated step when the route would accept them; None sends the request to
    the framework, which answers its problem (bad JSON, token, header or body) as the route documents."""
    try:
        doc = json.loads(body)
        principal = identify(state.tokens, headers.get(b"authorization", ""), TokenScope.WRITE)
    except (ValueError, ProblemError):
        return None
    key, if_match = headers.get(b"idempotency-key"), headers.get(b"if-match")
    if key is not None and IDEMPOTENCY_KEY.fullmatch(key) is None:
        return None
    if if_match is not None and IF_MATCH.fullmatch(if_match) is None:
        return None
    try:
        return principal, STEP_BODY.validate_python(doc)
    except ValidationError:
        return None
