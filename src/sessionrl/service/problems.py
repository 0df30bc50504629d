"""RFC 9457 problem documents for every error the service answers with, and their OpenAPI entries.

Named errors map to statuses in one table (`STATUS`); a bad transition is a 409, a bad payload a 422,
an unknown session a 404, a failed `If-Match` a 412. Unexpected exceptions become a bare 500 problem
(the details go to the log, not to the caller).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from sessionrl.errors import (
    EventTooLarge,
    InvalidEvent,
    InvalidTransition,
    NotFound,
    SessionRLError,
    StaleState,
)
from sessionrl.gateway.chat import OPENAI_PATHS, error_body, error_type
from sessionrl.orchestrator.lanes import Overloaded
from sessionrl.orchestrator.results import KeyReused
from sessionrl.wire import FieldProblem, Problem

MEDIA_TYPE = "application/problem+json"
log = logging.getLogger("sessionrl.service")

STATUS: tuple[tuple[type[SessionRLError], int, str], ...] = (
    (NotFound, 404, "not_found"),
    (StaleState, 409, "stale_state"),
    (KeyReused, 422, "idempotency_key_reused"),
    (InvalidTransition, 409, "invalid_transition"),
    (EventTooLarge, 413, "too_large"),
    (InvalidEvent, 422, "invalid"),
    (Overloaded, 503, "overloaded"),
)
"""Named errors, most specific first: the HTTP status and code each becomes."""

TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    412: "Precondition Failed",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

HTTP_CODES = {400: "malformed", 404: "not_found", 405: "method_not_allowed", 413: "too_large"}
"""Codes of problems made from framework HTTP errors (unreadable body, unknown path, wrong method, ...)."""


class ProblemError(Exception):
    """Raise in a route or dependency to answer with a problem document."""

    def __init__(
        self, status: int, code: str, detail: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})


def problem_response(
    status: int,
    code: str,
    detail: str | None,
    *,
    instance: str | None = None,
    errors: tuple[FieldProblem, ...] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A problem document as a response; under the gateway's paths, an OpenAI error (its callers are
    OpenAI clients)."""
    if instance is not None and instance.startswith(OPENAI_PATHS):
        error = error_body(detail or TITLES.get(status, "Error"), error_type(status), code)
        return JSONResponse(error, status_code=status, headers=headers)
    body = Problem(
        title=TITLES.get(status, "Error"),
        status=status,
        detail=detail,
        instance=instance,
        code=code,
        errors=errors,
    )
    return JSONResponse(
        body.model_dump(mode="json", exclude_none=True),
        status_code=status,
        media_type=MEDIA_TYPE,
        headers=headers,
    )


def named_error_response(exc: SessionRLError, instance: str | None = None) -> JSONResponse:
    """The problem response of a named sessionrl error (500 for one the table does not know)."""
    for kind, status, code in STATUS:
        if isinstance(exc, kind):
            headers = {"Retry-After": "1"} if status == 503 else None
            return problem_response(status, code, str(exc), instance=instance, headers=headers)
    log.error("unmapped error", exc_info=exc)
    return problem_response(500, "internal", "the service failed unexpectedly", instance=instance)


def error_response(exc: ProblemError | SessionRLError, instance: str | None) -> JSONResponse:
    """The problem response of an error a route raises on purpose (a `ProblemError` or a named error)."""
    if isinstance(exc, ProblemError):
        return problem_response(exc.status, exc.code, exc.detail, instance=instance, headers=exc.headers)
    return named_error_response(exc, instance)


def _validation_errors(exc: RequestValidationError) -> tuple[FieldProblem, ...]:
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error.get("loc", ())) or "request"
        problems.append(FieldProblem(field=field, rule=str(error.get("msg", "invalid"))))
    return tuple(problems)


def malformed_json(exc: RequestValidationError) -> str | None:
    """Where a body that is not JSON stopped parsing (line, column and the parser's reason), or None when
    the body parsed and something else is wrong with it."""
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            loc = error.get("loc", ())
            pos = loc[-1] if loc and isinstance(loc[-1], int) else 0
            doc = exc.body if isinstance(exc.body, str) else ""
            line = doc.count("\n", 0, pos) + 1
            column = pos - (doc.rfind("\n", 0, pos) + 1) + 1
            reason = error.get("ctx", {}).get("error", "JSON decode error")
            return f"malformed JSON body at line {line}, column {column} (character {pos}): {reason}"
    return None


def install(app: FastAPI) -> None:
    """Answer every error of `app` with a problem document."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return error_response(exc, request.url.path)

    async def on_named(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SessionRLError)
        return error_response(exc, request.url.path)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        unreadable = malformed_json(exc)
        if unreadable is not None:
            return problem_response(400, "malformed", unreadable, instance=request.url.path)
        errors = _validation_errors(exc)
        detail = "; ".join(f"{e.field}: {e.rule}" for e in errors[:5])
        return problem_response(422, "invalid", detail, instance=request.url.path, errors=errors)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = HTTP_CODES.get(exc.status_code, "http_error")
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code == 405:
            headers = {"Allow": ", ".join(allowed_methods(request))}
        return problem_response(
            exc.status_code, code, str(exc.detail), instance=request.url.path, headers=headers
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(500, "internal", "the service failed unexpectedly", instance=request.url.path)

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(SessionRLError, on_named)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def allowed_methods(request: Request) -> list[str]:
    """Every method some route accepts at the request's path (the framework names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods
    return sorted(methods)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problem statuses a route may answer with."""
    return {
        status: {
            "description": TITLES.get(status, "Error"),
            "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for status in statuses
    }


def add_problem_schema(openapi: dict[str, Any]) -> dict[str, Any]:
    """Put the `Problem` schema (and what it refers to) into an OpenAPI document's components."""
    schema = Problem.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions = schema.pop("$defs", {})
    components = openapi.setdefault("components", {}).setdefault("schemas", {})
    components.update(definitions)
    components["Problem"] = schema
    return openapi
