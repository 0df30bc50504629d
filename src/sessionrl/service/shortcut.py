"""A direct way in for the busiest routes: steps, and opening and finishing sessions.

The framework's middleware, routing, dependency resolution and parameter validation cost a request more
than the engine spends on it. `Shortcut`, the outermost ASGI layer of the app (around the framework's
whole middleware stack), serves a request to one of the `DIRECT` routes itself when everything about it
is in order: a JSON body within the app's size limit that the route's model accepts, a token that may
write, well-formed `Idempotency-Key` and `If-Match` headers. It then calls the route function itself, so
the answer, the key's scope and the rate limit are the route's; it counts and times the request in the
app's metrics as the metrics layer does, and answers an unexpected failure with the app's own handler
for it, as the framework's error layer does. Anything else (another route, a bad body or header, a body
over the limit or of undeclared length, a missing or unknown token, a request the framework traces)
goes on to the framework unchanged, its body replayed, and is answered there as documented; nothing was
charged to it yet.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.errors import SessionRLError
from sessionrl.service.auth import Principal, identify, throttle
from sessionrl.service.config import Scope as TokenScope
from sessionrl.service.deps import IDEMPOTENCY_KEY_PATTERN, IF_MATCH_PATTERN
from sessionrl.service.problems import ProblemError, error_response
from sessionrl.service.routers import sessions, steps
from sessionrl.session.model import FinalOutput, SessionCreate
from sessionrl.wire import StepRequest

IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
IF_MATCH = re.compile(IF_MATCH_PATTERN)
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
HEADERS = (b"authorization", b"content-type", b"content-length", b"idempotency-key", b"if-match")
"""The request headers the direct routes read (besides those the outer layers read themselves)."""


@dataclass(frozen=True)
class Direct:
    """A POST route the shortcut serves: its path (named groups are the path parameters), the route
    function and its router, the body it takes, and whether it reads `If-Match`."""

    path: re.Pattern[str]
    router: APIRouter
    endpoint: Callable[..., Awaitable[Response]]
    body: TypeAdapter[Any]
    if_match: bool

    @cached_property
    def route(self) -> APIRoute:
        """The framework's route (the metrics label requests with its path template)."""
        return next(r for r in self.router.routes if isinstance(r, APIRoute) and r.endpoint is self.endpoint)


DIRECT = (
    Direct(
        re.compile(r"/v1/sessions/(?P<session_id>[^/]+)/steps"),
        steps.router,
        steps.run_step,
        TypeAdapter(StepRequest),
        if_match=True,
    ),
    Direct(
        re.compile(r"/v1/sessions"),
        sessions.router,
        sessions.create_session,
        TypeAdapter(SessionCreate),
        if_match=False,
    ),
    Direct(
        re.compile(r"/v1/sessions/(?P<session_id>[^/]+)/finish"),
        sessions.router,
        sessions.finish_session,
        TypeAdapter(FinalOutput),
        if_match=True,
    ),
)


class Shortcut:
    """Serve well-formed, authorised requests to the `DIRECT` routes without the framework's router."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = _target(scope)
        state: Any = scope["app"].state if target is not None else None
        headers = None if target is None else _headers(scope, state.config.max_body_bytes)
        if target is None or headers is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        direct, params = target
        messages, body = await _read_body(receive)
        admitted = None
        if body is not None and len(body) <= state.config.max_body_bytes:
            admitted = _admit(direct, state, headers, body)
        if admitted is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"] = direct.route
        request = Request(scope)
        status = 500
        try:
            response = await _serve(direct, params, headers, admitted, request)
        except Exception as exc:  # raised on to the server, as the framework's error layer does
            handler = request.app.exception_handlers.get(Exception)
            if handler is not None:
                await (await handler(request, exc))(scope, receive, send)
            raise
        else:
            status = response.status_code
            await response(scope, receive, send)
        finally:
            state.metrics.answered("POST", direct.route.path, status, time.perf_counter() - started)


async def _serve(
    direct: Direct,
    params: dict[str, str],
    headers: dict[bytes, str],
    admitted: tuple[Principal, Any],
    request: Request,
) -> Response:
    """The route's answer to an admitted request, or the problem document of the error it raised."""
    principal, model = admitted
    arguments: dict[str, Any] = {
        **params,
        "body": model,
        "request": request,
        "principal": principal,
        "idempotency_key": headers.get(b"idempotency-key"),
    }
    if direct.if_match:
        arguments["if_match"] = headers.get(b"if-match")
    try:
        throttle(request.app.state.limiter, principal)
        return await direct.endpoint(**arguments)
    except (ProblemError, SessionRLError) as exc:
        return error_response(exc, request.url.path)


def _target(scope: Scope) -> tuple[Direct, dict[str, str]] | None:
    """The direct route a request is for, and its path parameters; None if the shortcut may not serve it."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    if "fastapi.telemetry" in scope:  # traced: the framework names the span after the route it picks
        return None
    path = scope["path"]
    for direct in DIRECT:
        match = direct.path.fullmatch(path)
        if match is not None:
            return direct, match.groupdict()
    return None


def _headers(scope: Scope, max_bytes: int) -> dict[bytes, str] | None:
    """The headers the route reads, when each is there at most once and the body is declared JSON of at
    most `max_bytes`."""
    found: dict[bytes, str] = {}
    for name, value in scope["headers"]:
        if name in HEADERS:
            if name in found:
                return None
            found[name] = value.decode("latin-1")
    length = found.get(b"content-length", "")
    if not (length.isascii() and length.isdigit()) or int(length) > max_bytes:
        return None
    return found if found.get(b"content-type", "").lower() == "application/json" else None


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


def _parse(body: bytes) -> Any:
    """The body as the framework's `json.loads` reads it, parsed by orjson where the two agree.

    They part on integers past 64 bits, which orjson makes floats: a body with a run of 19 digits is
    left to `json.loads`. What orjson refuses and `json.loads` takes (NaN, a byte-order mark, a lone
    surrogate) raises here, so the framework reads and answers it as before.
    """
    if _LONG_DIGITS.search(body) is None:
        return orjson.loads(body)
    return json.loads(body)


def _admit(
    direct: Direct, state: Any, headers: dict[bytes, str], body: bytes
) -> tuple[Principal, Any] | None:
    """The principal and the validated body when the route would accept them; None sends the request to
    the framework, which answers its problem (bad JSON, token, header or body) as the route documents."""
    try:
        doc = _parse(body)
        principal = identify(state.tokens, headers.get(b"authorization", ""), TokenScope.WRITE)
    except (ValueError, RecursionError, ProblemError):  # RecursionError: JSON nested too deep to parse
        return None
    key, if_match = headers.get(b"idempotency-key"), headers.get(b"if-match")
    if key is not None and IDEMPOTENCY_KEY.fullmatch(key) is None:
        return None
    if direct.if_match and if_match is not None and IF_MATCH.fullmatch(if_match) is None:
        return None
    try:
        return principal, direct.body.validate_python(doc)
    except ValidationError:
        return None
