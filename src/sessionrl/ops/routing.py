"""Routing: which policy version serves a session, decided once per session and recorded in its metadata.

A session pinned to a version (`metadata["pin_version"]`) gets that version while it is registered and not
retired. Otherwise a canary serves the sessions whose key (the user, else the session id) hashes below its
share, and production serves the rest (`routing_key`). The hash covers the policy, the canary's version
and the key, so a user stays on one arm for the whole canary, and each new canary draws its own users.

The decision is written to the session as `metadata["route"]` (`policy`, `version`, `arm`, `key`) with the
tag `<policy>@v<version>`, so every session says which version served it and the analysis finds each arm's
sessions in the store.

>>> round(bucket("orders", 2, "user-7"), 6) == round(bucket("orders", 2, "user-7"), 6)
True
>>> choose(production=1, canary=2, share=0.0, key="u", policy="p").arm
'production'
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sessionrl.errors import NotFound
from sessionrl.ops.registry import PolicyRegistry, PolicyVersion, Stage
from sessionrl.session.model import Session

ROUTE_KEY = "route"
"""Session metadata key of the recorded routing decision."""
PIN_KEY = "pin_version"
"""Session metadata key that pins a session to a version."""


class Arm:
    """The arms a route can take."""

    PRODUCTION = "production"
    CANARY = "canary"
    PIN = "pin"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Route:
    """One routing decision: which version of which policy serves a session, and why."""

    policy: str
    version: int | None
    arm: str
    key: str

    def metadata(self) -> dict[str, Any]:
        """The decision as stored under `metadata["route"]`."""
        return {"policy": self.policy, "version": self.version, "arm": self.arm, "key": self.key}


def version_tag(policy: str, version: int) -> str:
    """The tag a session served by this version carries (queries find a version's sessions by it).

    >>> version_tag("orders", 2)
    'orders@v2'
    """
    return f"{policy}@v{version}"


def bucket(policy: str, version: int, key: str) -> float:
    """Where `key` falls in [0, 1) for the canary `version` of `policy` (uniform, stable across processes)."""
    digest = hashlib.sha256(f"{policy}\x00{version}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def choose(*, production: int | None, canary: int | None, share: float, key: str, policy: str) -> Route:
    """The route of one session given the versions serving now (see the module doc; no pin)."""
    if canary is not None and bucket(policy, canary, key) < share:
        return Route(policy, canary, Arm.CANARY, key)
    if production is not None:
        return Route(policy, production, Arm.PRODUCTION, key)
    return Route(policy, None, Arm.NONE, key)


def routing_key(session: Session) -> str:
    """What keeps a session's route sticky: its user (`user_id`, or `metadata["user"]`, which an agent
    behind the gateway sets with the OpenAI request's `metadata`), else its id."""
    user = session.metadata.get("user")
    return session.user_id or (user if isinstance(user, str) and user else session.session_id)


def recorded_route(session: Session) -> Route | None:
    """The route written in a session's metadata, if any."""
    raw = session.metadata.get(ROUTE_KEY)
    if not isinstance(raw, dict) or not isinstance(raw.get("policy"), str):
        return None
    version = raw.get("version")
    return Route(
        raw["policy"], version if isinstance(version, int) else None, str(raw.get("arm")), str(raw.get("key"))
    )


class Router:
    """Routes sessions of one policy with the registry's current production and canary versions."""

    def __init__(self, registry: PolicyRegistry, policy: str) -> None:
        self.registry = registry
        self.policy = policy

    def route(self, key: str, *, pin: int | None = None) -> Route:
        """The route of a new session with this key (and pin, if any)."""
        versions = {v.version: v for v in self.registry.versions(self.policy)}
        if pin is not None and pin in versions and versions[pin].stage is not Stage.RETIRED:
            return Route(self.policy, pin, Arm.PIN, key)
        production = _one(versions.values(), Stage.PRODUCTION)
        canary = _one(versions.values(), Stage.CANARY)
        return choose(
            production=production.version if production else None,
            canary=canary.version if canary else None,
            share=canary.share if canary else 0.0,
            key=key,
            policy=self.policy,
        )

    def route_session(self, session: Session) -> Route:
        """The route of a session: the one it recorded while that version still serves, else a new one."""
        recorded = recorded_route(session)
        pin = session.metadata.get(PIN_KEY)
        pin = pin if isinstance(pin, int) else None
        if recorded is not None and recorded.version is not None:
            try:
                stage = self.registry.get(recorded.policy, recorded.version).stage
            except NotFound:
                stage = Stage.RETIRED
            if stage is not Stage.RETIRED:
                return recorded
        return self.route(routing_key(session), pin=pin)


def _one(versions: Any, stage: Stage) -> PolicyVersion | None:
    return next((v for v in versions if v.stage is stage), None)
