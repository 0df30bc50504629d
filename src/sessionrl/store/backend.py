"""The boundary between the store and a database engine: what a backend must offer, and the table of them.

The store's modules speak one SQL: `?` parameters, `INSERT ... ON CONFLICT`, no engine-specific
functions. They run it on a `Connection` that a `Backend` hands out inside a transaction (`atomic` for
writes, `snapshot` for reads). What differs between engines (the DDL, connection settings, locking across
processes (`serialise`), the read-only guard for user SQL, how feedback text is searched and its index
checked) is the backend's.

A second engine is one more module with a class of this shape and one more row in `BACKENDS`; a driver
that spells parameters otherwise (`%s`) translates them in its `Connection`. `SessionStore.open(url)`
picks the backend by the URL's scheme:

>>> sorted(BACKENDS)
['postgres', 'postgresql', 'sqlite']
>>> scheme("sqlite:///sessions.db"), scheme("sessions.db")
('sqlite', '')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from sessionrl.errors import InvalidStoreURL
from sessionrl.store.dialect import SQLiteBackend


class Cursor(Protocol):
    """The rows of one statement (the DB-API cursor methods the store uses)."""

    @property
    def description(self) -> Any:
        """Column descriptions (the first item of each is the column's name), or None."""
        ...

    def fetchone(self) -> Any:
        """The next row as a tuple, or None."""
        ...

    def fetchall(self) -> list[Any]:
        """Every remaining row, as tuples."""
        ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """A connection inside a transaction, running the store's SQL (`?` parameters)."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor:
        """Run one statement with its parameters."""
        ...

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Cursor:
        """Run one statement once per parameter row, as one round-trip where the driver can."""
        ...


class Backend(Protocol):
    """One database engine under the store: transactions, user SQL, and feedback text search."""

    text_index: str
    """The name the feedback text index is reported under when it drifts."""

    reward_total: str
    """SQL reading a `rewards` row's session reward from its `vector` column, in this engine's spelling."""

    def atomic(self) -> AbstractContextManager[Connection]:
        """One write transaction: committed durably when the block ends, rolled back if it raises."""
        ...

    def snapshot(self) -> AbstractContextManager[Connection]:
        """A read transaction: every statement inside sees the same committed state."""
        ...

    def serialise(self, conn: Connection, keys: Sequence[str]) -> None:
        """Inside `atomic`: make other processes' transactions naming any of these keys (`session:<id>`,
        `projector`) wait until this one ends; a no-op where the engine runs one writer at a time."""
        ...

    def read_only_sql(self, sql: str, params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]:
        """Run one user statement that may only read (`InvalidQuery` otherwise); rows as dicts."""
        ...

    def feedback_conditions(
        self, feedback_type: str | None, needle: str | None
    ) -> tuple[list[str], list[Any]]:
        """Conditions on `feedback` rows of this type whose comment contains `needle` (ASCII case
        ignored; either may be None), and their parameters, spelled for this engine."""
        ...

    def text_sessions(self, needles: Sequence[str]) -> tuple[str, list[Any]]:
        """A query (one `session_id` column) of the sessions whose text contains any of `needles` (case
        ignored), and its parameters, spelled for this engine (through its text index where a needle is
        long enough)."""
        ...

    def text_index_problem(self) -> str | None:
        """Why the feedback text index disagrees with the feedback rows, or None when it agrees."""
        ...

    def rebuild_text_index(self) -> None:
        """Rebuild the feedback text index from the feedback rows, in one write transaction."""
        ...

    def close(self) -> None:
        """Release the connections."""
        ...


def _postgres(url: str) -> Backend:
    """Open a PostgreSQL store; psycopg is imported only when one is opened."""
    from sessionrl.store.postgres import PostgresBackend

    return PostgresBackend.from_url(url)


BACKENDS: dict[str, Callable[[str], Backend]] = {
    "sqlite": SQLiteBackend.from_url,
    "postgresql": _postgres,
    "postgres": _postgres,
}
"""Backends by URL scheme: each opens (creating if needed) the store at a URL of its scheme."""


PROJECTOR_KEY = "projector"
"""The `Backend.serialise` key of the projector, and of a repair that rewrites query rows."""


def session_key(session_id: str) -> str:
    """The `Backend.serialise` key of one session: its writers take it."""
    return f"session:{session_id}"


def scheme(url: str) -> str:
    """The scheme of a store URL (the text before `://`; empty when there is none)."""
    head, found, _ = url.partition("://")
    return head.lower() if found else ""


def open_backend(url: str) -> Backend:
    """The backend for `url`'s scheme, opened; `InvalidStoreURL` naming the known schemes otherwise."""
    opener = BACKENDS.get(scheme(url))
    if opener is None:
        known = ", ".join(f"{name}://" for name in sorted(BACKENDS))
        raise InvalidStoreURL(url, f"no store backend for this scheme; known: {known}")
    return opener(url)
