"""The write path: validate an event, fold it into the current session, store log + view + outbox.

Checks that need no database (parsing, size, canonical form) run in `prepare`, outside the write lock.
`BatchWriter` then handles any number of prepared events inside one transaction; each either succeeds
or raises its own error, having written nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionrl.errors import EventTooLarge, InvalidEvent, NotFound, StaleState
from sessionrl.session.events import Event, SessionCreated, apply, parse_event
from sessionrl.session.model import SCHEMA_VERSION, Session
from sessionrl.store.backend import Connection
from sessionrl.store.cache import SessionCache
from sessionrl.store.documents import (
    ShardEncoder,
    canonical_event,
    changed_shards,
    chunks,
    encode_event,
    iso,
    read_sessions,
    write_sessions,
)

EventInput = Event | bytes | str | Mapping[str, Any]
"""An event as a model, or as raw JSON (text, bytes or a decoded mapping) to be validated."""


def current(conn: Connection, cache: SessionCache, session_id: str) -> tuple[Session, bool] | None:
    """The stored session (from the cache when it is current) and whether its document is of an older schema.

    Call inside a transaction so that the version check and the read see the same state.
    """
    return current_many(conn, cache, [session_id]).get(session_id)


def current_many(
    conn: Connection, cache: SessionCache, session_ids: Sequence[str]
) -> dict[str, tuple[Session, bool]]:
    """`current` for many sessions at once: one version query, one document read for the cache misses."""
    found: dict[str, tuple[Session, bool]] = {}
    missing: list[str] = []
    for chunk in chunks(session_ids, 500):
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT session_id, state_version FROM session_head WHERE session_id IN ({marks})"
        for sid, version in conn.execute(sql, chunk):
            cached = cache.get(sid, version)
            if cached is None:
                missing.append(sid)
            else:
                found[sid] = (cached, False)
    for sid, loaded in read_sessions(conn, missing).items():
        if not loaded[1]:
            cache.put(loaded[0])
        found[sid] = loaded
    return found


@dataclass(frozen=True, slots=True)
class Prepared:
    """An event that passed every check that needs no database."""

    session_id: str
    event: Event
    payload: str
    expected: int | None


def prepare(session_id: str, raw: EventInput, expected: int | None, max_bytes: int) -> Prepared:
    """Validate, encode and size-check an event; the event kept is the one that will read back."""
    if isinstance(raw, bytes | str):
        raw = parse_event(raw)
    elif isinstance(raw, Mapping):
        raw = parse_event(dict(raw))
    payload = encode_event(raw)
    if len(payload) > max_bytes:
        raise EventTooLarge(len(payload), max_bytes)
    event = canonical_event(payload)
    if isinstance(event, SessionCreated) and event.session_id != session_id:
        raise InvalidEvent("session_id", f"the event creates {event.session_id!r}, not {session_id!r}")
    return Prepared(session_id, event, payload.decode(), expected)


class BatchWriter:
    """Writes prepared events inside one open transaction; `touched` holds the resulting sessions.

    `load` reads what the checks need for the whole batch in a few statements; `write` then checks and folds
    each event in memory; `flush` (call it before the transaction commits) writes the log, the outbox and
    the materialised views with one statement per table. Few statements matter: each one hands the
    interpreter lock to whatever else runs in the process, and a busy event loop makes the writer wait
    for it back.
    """

    def __init__(self, conn: Connection, cache: SessionCache, encoder: ShardEncoder) -> None:
        self.conn = conn
        self.cache = cache
        self.encoder = encoder
        self.touched: dict[str, Session] = {}
        self._stored: dict[str, tuple[Session, bool] | None] = {}
        """Sessions as stored before the batch (None: not stored), read by `load` or on first use."""
        self._owners: dict[str, str] = {}
        self._legacy: set[str] = set()
        self._dirty: dict[str, set[str]] = {}
        self._events: list[tuple[Any, ...]] = []
        self._outbox: list[tuple[Any, ...]] = []

    def load(self, items: Sequence[Prepared]) -> None:
        """Read which of the batch's event ids are logged already, and the sessions its events touch."""
        ids = [item.event.event_id for item in items]
        for chunk in chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT event_id, session_id FROM events WHERE event_id IN ({marks})"
            self._owners.update(self.conn.execute(sql, chunk))
        sessions = list(dict.fromkeys(item.session_id for item in items))
        found = current_many(self.conn, self.cache, sessions)
        self._stored.update((sid, found.get(sid)) for sid in sessions)

    def write(self, item: Prepared) -> Session:
        """Append one event; raise (having written nothing) if it is a duplicate, stale or not allowed."""
        event, sid = item.event, item.session_id
        owner = self._owners.get(event.event_id)
        if owner is not None:
            return self._duplicate(item, owner)
        old = self._session(sid)
        if old is None and not isinstance(event, SessionCreated):
            raise NotFound("session", sid)
        actual = 0 if old is None else old.state_version
        if item.expected is not None and item.expected != actual:
            raise StaleState(sid, item.expected, actual)
        new = apply(old, event)
        at = iso(event.at)
        seq = new.state_version
        self._events.append((sid, seq, event.event_id, event.type, SCHEMA_VERSION, at, item.payload))
        self._outbox.append((sid, seq, event.type, at))
        self._owners[event.event_id] = sid
        self._dirty.setdefault(sid, set()).update(changed_shards(old, new, legacy=sid in self._legacy))
        self._legacy.discard(sid)
        self.touched[sid] = new
        return new

    def flush(self) -> None:
        """Write the batch's log rows, each touched session's view once (with every shard any of its
        events changed), then the outbox rows.

        Deferring the view to the end of the batch keeps a batch of many events of one session (an import,
        a replay) linear: each shard is encoded once, not once per event. The outbox comes last because
        a backend may order outbox writers by a lock held from their first outbox row to their commit
        (PostgreSQL does, see `sessionrl.store.postgres`): the less that follows it, the shorter the wait.
        """
        self.conn.executemany(
            "INSERT INTO events (session_id, seq, event_id, type, schema_version, at, payload)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            self._events,
        )
        views = ((self.touched[sid], sorted(shards)) for sid, shards in self._dirty.items())
        write_sessions(self.conn, views, self.encoder)
        self.conn.executemany(
            "INSERT INTO outbox (session_id, seq, type, at) VALUES (?, ?, ?, ?)", self._outbox
        )
        self._events.clear()
        self._outbox.clear()
        self._dirty.clear()

    def _session(self, session_id: str) -> Session | None:
        if session_id in self.touched:
            return self.touched[session_id]
        if session_id not in self._stored:
            self._stored[session_id] = current(self.conn, self.cache, session_id)
        found = self._stored[session_id]
        if found is None:
            return None
        if found[1]:
            self._legacy.add(session_id)
        return found[0]

    def _duplicate(self, item: Prepared, owner: str) -> Session:
        """An event id already logged: the same event again returns the session as it is now."""
        event = item.event
        generated = isinstance(event, SessionCreated) and event.create.session_id is None
        if owner != item.session_id and not generated:
            raise InvalidEvent("event_id", f"{event.event_id!r} was already used by session {owner!r}")
        session = self._session(owner)
        if session is None:
            raise NotFound("session", owner)
        return session
