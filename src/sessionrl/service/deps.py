"""Route dependencies shared by the routers: the engine, the caller, idempotency keys and `If-Match`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from fastapi import Depends, Header, Request, Response
from pydantic import BaseModel

from sessionrl.access import Principal, Scope
from sessionrl.errors import StaleState
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.service.auth import ScopedBearer
from sessionrl.service.problems import ProblemError


def engine_of(request: Request) -> Orchestrator:
    """The app's engine (opened by the lifespan). A plain call, not a dependency: the step route is the
    busiest one, and every dependency costs it a resolution per request."""
    engine = request.app.state.engine
    assert isinstance(engine, Orchestrator)
    return engine


IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"
"""What an `Idempotency-Key` header may hold: 1 to 200 printable ASCII characters."""
IF_MATCH_PATTERN = r'^(W/)?"?[0-9]{1,18}"?$'
"""What an `If-Match` header may hold: a state_version, as an ETag or bare."""

Reader = Annotated[Principal, Depends(ScopedBearer(Scope.READ))]
Writer = Annotated[Principal, Depends(ScopedBearer(Scope.WRITE))]

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        pattern=IDEMPOTENCY_KEY_PATTERN,
        description="Retrying a request with the same key returns the first result and writes nothing new.",
    ),
]

IfMatch = Annotated[
    str | None,
    Header(
        alias="If-Match",
        pattern=IF_MATCH_PATTERN,
        description='Run only if the session is at this state_version (its ETag, such as "7"); else 412.',
    ),
]


class JSONAnswer(Response):
    """An encoded JSON body as a response. With no extra headers its two header lines are set directly, as
    the framework's `Response` would write them, without its general header handling."""

    media_type = "application/json"

    def __init__(
        self, content: bytes, status_code: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        if headers:
            super().__init__(content, status_code, headers)
            return
        self.status_code = status_code
        self.background = None
        self.body = content
        self.raw_headers = [(b"content-length", b"%d" % len(content)), (b"content-type", b"application/json")]


def json_response(
    model: BaseModel, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A model as a JSON answer, encoded by its own serializer (the route's response model documents it)."""
    return JSONAnswer(model.__pydantic_serializer__.to_json(model), status_code, headers)


def scoped_key(principal: Principal, request: Request, key: str | None) -> str | None:
    """The engine's key for a request: the caller's key, kept apart per token, method and path."""
    if key is None:
        return None
    return f"{principal.name} {request.method} {request.url.path} {key}"


def expected_version(if_match: str | None) -> int | None:
    """The state_version an `If-Match` value names.

    >>> expected_version('"7"'), expected_version('W/"7"'), expected_version(None)
    (7, 7, None)
    """
    if if_match is None:
        return None
    return int(if_match.removeprefix("W/").strip('"'))


class Precondition:
    """Turn a stale-state error into 412 when the caller set a precondition (it stays 409 otherwise).

    A class rather than a generator: the step route enters it on every request.
    """

    def __init__(self, expected: int | None) -> None:
        self.expected = expected

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, StaleState) and self.expected is not None:
            raise ProblemError(412, "precondition_failed", str(exc)) from exc
