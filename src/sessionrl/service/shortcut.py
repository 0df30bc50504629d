"""A direct way in for the write routes, read from the routes' own declarations.

The framework's middleware, routing, dependency resolution and parameter validation cost a request more
than the engine spends on it. `Shortcut`, the outermost ASGI layer of the app (around the framework's
whole middleware stack), serves a request to a route itself when everything about it is in order, and
calls the route function as the framework would.

What it serves comes from the routes, not from a list kept beside them: `plan(route)` reads a route's
declared parameters (path parameters, one JSON body, headers, the request, one `ScopedBearer`
dependency) and validates each with the framework's own field for it, so a route changed in its router
is served as changed. A route that declares anything else (a query parameter, another dependency, an
answer the framework must still encode) is left to the framework, as is every request that is not in
order: a bad body or header, a body over the limit or of undeclared length, a missing or unknown token,
a request the framework traces. Those go on to the framework unchanged, their body replayed, and are
answered there as documented; nothing was charged to them yet.

A served request is counted and timed in the app's metrics as the metrics layer does, and an exception
from the route is answered by the route itself when its class answers its own errors (`error_response`),
else by the app's handler for its class, as the framework's error layers do (an unexpected one is then
raised on to the server).
"""

from __future__ import annotations

import inspect
import json
import re
import time
import typing
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.convertors import Convertor, StringConvertor
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.access import Principal
from sessionrl.access import Scope as TokenScope
from sessionrl.service.auth import ScopedBearer, identify, throttle
from sessionrl.service.problems import ProblemError

_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_ALWAYS_READ = frozenset({b"authorization", b"content-type", b"content-length"})
"""Request headers the shortcut reads for every route: the token and the body's declaration."""


@dataclass(frozen=True)
class Header:
    """A header parameter of a route: its name on the wire (lower case), the function's parameter it
    fills, the framework's field for it, and the value it takes when the header is absent (a request
    without a `required` header is the framework's to refuse)."""

    wire: bytes
    name: str
    field: Any
    required: bool
    default: Any


@dataclass(frozen=True)
class Plan:
    """How the shortcut serves one route: the route, and where each argument of its function comes from."""

    route: APIRoute
    path: dict[str, Any]
    """The framework's field of each path parameter that needs validating, by name (a plain `str`
    parameter takes the matched text as it is, as its validation would)."""
    body: Any
    """The framework's field of the JSON body."""
    headers: tuple[Header, ...]
    principal: str
    """The parameter the `ScopedBearer` dependency fills."""
    scope: TokenScope
    request: str | None
    """The parameter that takes the `Request`, if any."""


def plan(route: APIRoute) -> Plan | None:
    """How to serve `route` directly; None when it declares something the shortcut does not read."""
    d = route.dependant
    if "POST" not in (route.methods or ()) or not _answers_itself(route):
        return None
    extras = (
        d.query_params,
        d.cookie_params,
        d.response_param_name,
        d.background_tasks_param_name,
        d.websocket_param_name,
        d.http_connection_param_name,
        d.security_scopes_param_name,
    )
    if any(extras) or len(d.body_params) != 1 or getattr(d.body_params[0].field_info, "embed", False):
        return None
    bearer = d.dependencies[0] if len(d.dependencies) == 1 else None
    if bearer is None or not isinstance(bearer.call, ScopedBearer) or bearer.name is None:
        return None
    headers = tuple(_header(field) for field in d.header_params)
    if _has_parameters(bearer) or any(h is None for h in headers) or route.dependency_overrides_provider:
        return None
    return Plan(
        route=route,
        path={f.name: f for f in d.path_params if _validated(f)},
        body=d.body_params[0],
        headers=tuple(h for h in headers if h is not None),
        principal=bearer.name,
        scope=bearer.call.scope,
        request=d.request_param_name,
    )


def _validated(field: Any) -> bool:
    """Whether a path parameter's validation can change or refuse the matched text (not a plain `str`)."""
    return field.field_info.annotation is not str or bool(field.field_info.metadata)


def _converts(route: APIRoute) -> dict[str, Convertor[Any]]:
    """The route's path convertors when one of them changes the matched text (none: all are `str`)."""
    changing = any(not isinstance(c, StringConvertor) for c in route.param_convertors.values())
    return dict(route.param_convertors) if changing else {}


def _answers_itself(route: APIRoute) -> bool:
    """Whether the route function returns its own `Response` (which the framework sends as it is)."""
    returns = typing.get_type_hints(route.endpoint).get("return")
    return inspect.isclass(returns) and issubclass(returns, Response)


def _has_parameters(dependency: Any) -> bool:
    """Whether a dependency reads anything of the request but the request itself."""
    parts = (
        dependency.path_params,
        dependency.query_params,
        dependency.header_params,
        dependency.cookie_params,
        dependency.body_params,
        dependency.dependencies,
    )
    return any(parts)


def _header(field: Any) -> Header | None:
    """A header parameter as the framework reads it (underscores become dashes unless an alias is given);
    None for one the shortcut does not fill (one that is not text, or has a default made per request)."""
    info = field.field_info
    if info.default_factory is not None or info.annotation not in (str, str | None):
        return None
    name = field.alias
    if name == field.name and getattr(info, "convert_underscores", True):
        name = name.replace("_", "-")
    required = info.is_required()
    default = None if required else field.get_default()
    return Header(name.lower().encode("latin-1"), field.name, field, required, default)


class Shortcut:
    """Serve well-formed, authorised requests to the `routes` that `plan` can serve, without the
    framework's router; pass everything else to `app`.

    `routes` are the app's routes in the order the framework tries them; the first whose path matches a
    POST decides, as in the framework, whether the request is served here.
    """

    def __init__(self, app: ASGIApp, routes: Iterable[BaseRoute]) -> None:
        self.app = app
        self.table = tuple(
            (r.path_regex, _converts(r), plan(r))
            for r in routes
            if isinstance(r, APIRoute) and "POST" in (r.methods or ())
        )
        self.reads = _ALWAYS_READ | {h.wire for _, _, p in self.table if p is not None for h in p.headers}

    @property
    def served(self) -> tuple[APIRoute, ...]:
        """The routes this shortcut serves."""
        return tuple(p.route for _, _, p in self.table if p is not None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self._target(scope)
        state: Any = scope["app"].state if target is not None else None
        headers = None if target is None else self._headers(scope, state.config.max_body_bytes)
        if target is None or headers is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        chosen, params = target
        messages, body = await _read_body(receive)
        admitted = None
        if body is not None and len(body) <= state.config.max_body_bytes:
            admitted = _admit(chosen, state, params, headers, body)
        if admitted is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"] = chosen.route
        request = Request(scope)
        principal, arguments = admitted
        if chosen.request is not None:
            arguments[chosen.request] = request
        status = 500
        try:
            throttle(state.limiter, principal)  # as the `ScopedBearer` does once it knows the caller
            response = await chosen.route.endpoint(**arguments)
        except Exception as exc:
            own = _own_answer(chosen.route, exc)
            kind, handler = (None, None) if own is not None else _handler(request, exc)
            response = own if own is not None else await _answer(handler, request, exc)
            status = response.status_code
            await response(scope, receive, send)
            if kind is Exception:  # answered as the server error layer does, which then raises it on
                raise
        else:
            status = response.status_code
            await response(scope, receive, send)
        finally:
            state.metrics.answered("POST", chosen.route.path, status, time.perf_counter() - started)

    def _target(self, scope: Scope) -> tuple[Plan, dict[str, Any]] | None:
        """The plan of the route a request is for, and its path parameters; None if it is not served here."""
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            return None
        if "fastapi.telemetry" in scope:  # traced: the framework names the span after the route it picks
            return None
        if scope["app"].dependency_overrides:
            return None
        path = scope["path"]
        for regex, converters, chosen in self.table:
            match = regex.match(path)
            if match is not None:
                if chosen is None:
                    return None
                found = match.groupdict()
                if converters:
                    found = {k: converters[k].convert(v) for k, v in found.items()}
                return chosen, found
        return None

    def _headers(self, scope: Scope, max_bytes: int) -> dict[bytes, str] | None:
        """The headers the routes read, when each is there at most once and the body is declared JSON of
        at most `max_bytes`."""
        found: dict[bytes, str] = {}
        for name, value in scope["headers"]:
            if name in self.reads:
                if name in found:
                    return None
                found[name] = value.decode("latin-1")
        length = found.get(b"content-length", "")
        if not (length.isascii() and length.isdigit()) or int(length) > max_bytes:
            return None
        return found if found.get(b"content-type", "").lower() == "application/json" else None


def _admit(
    chosen: Plan, state: Any, params: dict[str, Any], headers: dict[bytes, str], body: bytes
) -> tuple[Principal, dict[str, Any]] | None:
    """The caller and the route function's arguments when the framework would accept the request; None
    sends it to the framework, which answers its problem (bad JSON, token, header or body)."""
    try:
        doc = _parse(body)
        principal = identify(state.tokens, headers.get(b"authorization", ""), chosen.scope)
    except (ValueError, RecursionError, ProblemError):  # RecursionError: JSON nested too deep to parse
        return None
    arguments: dict[str, Any] = {chosen.principal: principal, **params}
    for name, field in chosen.path.items():
        value, errors = field.validate(params[name], {}, loc=("path", name))
        if errors:
            return None
        arguments[name] = value
    for header in chosen.headers:
        raw = headers.get(header.wire)
        if raw is None:
            if header.required:
                return None
            arguments[header.name] = header.default
            continue
        value, errors = header.field.validate(raw, {}, loc=("header", header.field.alias))
        if errors:
            return None
        arguments[header.name] = value
    value, errors = chosen.body.validate(doc, {}, loc=("body",))
    if errors:
        return None
    arguments[chosen.body.name] = value
    return principal, arguments


def _own_answer(route: APIRoute, exc: Exception) -> Response | None:
    """How a route that answers its own errors (a `route_class` with `error_response`, such as the
    gateway's, whose callers read OpenAI errors) answers `exc`; None for the app's handlers to answer."""
    answer = getattr(route, "error_response", None)
    return answer(exc) if callable(answer) else None


def _handler(request: Request, exc: Exception) -> tuple[type, Any]:
    """The app's handler for `exc` and the class it is registered for: the nearest in the exception's
    MRO, as the framework looks it up (raises `exc` on when the app has none)."""
    handlers = request.app.exception_handlers
    for kind in type(exc).__mro__:
        if kind in handlers:
            return kind, handlers[kind]
    raise exc


async def _answer(handler: Any, request: Request, exc: Exception) -> Response:
    """What an exception handler answers (handlers may be plain functions or coroutines)."""
    answer = handler(request, exc)
    response: Response = await answer if inspect.isawaitable(answer) else answer
    return response


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
