"""Who may call the service and the dashboard: token scopes, principals, and the table of known tokens.

Shared by `sessionrl.service` (the API's bearer dependency) and `sessionrl.ui` (the dashboard's login), so
neither imports the other for it. Tokens are kept by their SHA-256 digest, so a lookup's time does not
depend on how much of a guessed token is right.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    """What a token allows: `read` for GETs, `write` for POSTs."""

    READ = "read"
    WRITE = "write"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a short, non-secret name of the token, and its scopes."""

    name: str
    scopes: frozenset[Scope]


def digest(token: str) -> str:
    """The SHA-256 hex digest of `token`: tokens are kept and looked up by it, never in clear."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenTable:
    """Known tokens by digest."""

    def __init__(self, tokens: Mapping[str, frozenset[Scope]]) -> None:
        self._by_digest = {digest(t): Principal(f"token-{digest(t)[:8]}", s) for t, s in tokens.items()}

    def lookup(self, token: str) -> Principal | None:
        """The principal of `token`, or None."""
        return self._by_digest.get(digest(token))


__all__ = ["Principal", "Scope", "TokenTable", "digest"]
