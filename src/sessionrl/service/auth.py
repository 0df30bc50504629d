"""Bearer-token auth and per-token rate limiting, as one route dependency: `Depends(ScopedBearer(...))`.

A request without a known token gets 401 (with `WWW-Authenticate: Bearer`), a token without the scope
403, and a token over its rate 429 with `Retry-After`. Tokens are looked up by their SHA-256 digest
(`sessionrl.access`), so the lookup time does not depend on how much of a guessed token is right.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from fastapi import Request
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.security.base import SecurityBase

from sessionrl.access import Principal, Scope, TokenTable
from sessionrl.service.problems import ProblemError


class RateLimiter:
    """A token bucket per client: `burst` requests at once, refilled at `rate` per second."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def check(self, client: str) -> float:
        """Take one request from `client`'s bucket: 0.0 when allowed, else seconds until one is."""
        now = self._clock()
        tokens, last = self._buckets.get(client, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate)
        if tokens >= 1.0:
            self._buckets[client] = (tokens - 1.0, now)
            return 0.0
        self._buckets[client] = (tokens, now)
        return (1.0 - tokens) / self._rate


class ScopedBearer(SecurityBase):
    """A dependency that admits a known, in-scope, in-rate bearer token and returns its principal.

    It is the security scheme itself (documented in OpenAPI as `HTTPBearer`), so a route pays for one
    dependency, not a scheme plus a checker.
    """

    def __init__(self, scope: Scope) -> None:
        self.model = HTTPBearerModel(description="A token from SESSIONRL_TOKENS or `--tokens`.")
        self.scheme_name = "HTTPBearer"
        self.scope = scope

    async def __call__(self, request: Request) -> Principal:
        principal = identify(request.app.state.tokens, request.headers.get("Authorization", ""), self.scope)
        throttle(request.app.state.limiter, principal)
        return principal


def identify(tokens: TokenTable, authorization: str, scope: Scope) -> Principal:
    """The principal of an `Authorization` header value if it may use `scope`; else a 401 or 403 problem."""
    challenge = {"WWW-Authenticate": 'Bearer realm="sessionrl"'}
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ProblemError(401, "unauthorized", "send Authorization: Bearer <token>", headers=challenge)
    principal = tokens.lookup(token.strip())
    if principal is None:
        raise ProblemError(401, "unauthorized", "unknown token", headers=challenge)
    if scope not in principal.scopes:
        raise ProblemError(403, "forbidden", f"this token lacks the {scope.value!r} scope")
    return principal


def throttle(limiter: RateLimiter, principal: Principal) -> None:
    """Take one request from the principal's rate; a 429 problem with `Retry-After` when it is spent."""
    wait = limiter.check(principal.name)
    if wait > 0:
        retry = str(max(1, math.ceil(wait)))
        detail = f"too many requests; retry in {retry} s"
        raise ProblemError(429, "rate_limited", detail, headers={"Retry-After": retry})
