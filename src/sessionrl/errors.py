"""Named exceptions shared by every part of sessionrl.

Each error carries enough context to be turned into a useful message (and an HTTP problem) without
parsing its text.
"""

from __future__ import annotations

import importlib.util


class SessionRLError(Exception):
    """Base class of every error sessionrl raises on purpose."""


class NotFound(SessionRLError):
    """A session (or another record) does not exist."""

    def __init__(self, what: str, key: str) -> None:
        super().__init__(f"{what} {key!r} not found")
        self.what = what
        self.key = key


class StaleState(SessionRLError):
    """The caller's view of a session is not the stored one (optimistic concurrency)."""

    def __init__(self, session_id: str, expected: int, actual: int) -> None:
        super().__init__(
            f"session {session_id!r}: expected state_version {expected}, but the store holds {actual}"
        )
        self.session_id = session_id
        self.expected = expected
        self.actual = actual


class InvalidTransition(SessionRLError):
    """An event is not allowed in the session's current state."""

    def __init__(self, session_id: str, state: str, event: str, allowed: str = "") -> None:
        hint = f" (allowed: {allowed})" if allowed else ""
        super().__init__(f"session {session_id!r}: {event!r} is not allowed in state '{state}'{hint}")
        self.session_id = session_id
        self.state = str(state)
        self.event = event


class InvalidEvent(SessionRLError):
    """An event or input failed validation. `field` names where, `rule` names what was broken."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class EventTooLarge(InvalidEvent):
    """An encoded event is larger than the store accepts."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__("event", f"encoded size {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class InvalidStoreURL(SessionRLError):
    """A store URL names no known backend, is malformed for its backend, or leads to a store this
    version cannot open. `url` is the URL given, `rule` says what is wrong with it."""

    def __init__(self, url: str, rule: str) -> None:
        super().__init__(f"store URL {url!r}: {rule}")
        self.url = url
        self.rule = rule


class InvalidQuery(SessionRLError):
    """A SQL statement given to the store was refused (it could write) or failed; `rule` says why."""

    def __init__(self, rule: str) -> None:
        super().__init__(f"sql: {rule}")
        self.rule = rule


class MissingExtra(SessionRLError):
    """A feature needs packages of an extra that is not installed; the message says which to install."""

    def __init__(self, feature: str, extra: str, missing: list[str]) -> None:
        super().__init__(
            f"{feature} needs the {extra} extra ({', '.join(missing)} missing): "
            f"pip install 'sessionrl[{extra}]'"
        )
        self.extra = extra
        self.missing = missing


def require_extra(feature: str, extra: str, *modules: str) -> None:
    """Raise `MissingExtra` when any of `modules` (top-level names) cannot be imported.

    >>> require_extra("the dashboard", "ui", "json")
    >>> try:
    ...     require_extra("the dashboard", "ui", "no_such_module_x")
    ... except MissingExtra as missing:
    ...     print(missing)
    the dashboard needs the ui extra (no_such_module_x missing): pip install 'sessionrl[ui]'
    """
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingExtra(feature, extra, missing)
