"""The write path: validate an event, fold it into the current session, store log + view + outbox.

Checks that need no database (parsing, size, canonical form) run in `prepare`, outside the write lock.
`BatchWriter` then handles any number of units of prepared events inside one transaction; a unit is
written whole or not at all, and a rejected unit leaves the others alone.

Several writers may share one store (processes on one PostgreSQL database, or engines in one process).
A writer that builds a unit on the session as it last saw it names that version as the unit's `basis`:
the unit is refused (`StaleState`) if any other writer appended to the session since, and the writer
rebuilds it on the fresh session. Appends the writer made itself in between are no reason to refuse
(its own concurrent steps commute); `OwnWrites` remembers which versions those were.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sessionrl.errors import EventTooLarge, InvalidEvent, NotFound, SessionRLError, StaleState
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

Write = tuple[str, EventInput, int | None]
"""One event to append: session id, event, and the version the session must be at (None: any)."""

Result = Session | SessionRLError
"""What one write led to: the session after it, or the error that refused it."""


@dataclass(frozen=True, slots=True)
class Unit:
    """Writes appended together, in order, in one transaction: every one of them, or none.

    `basis` is the version of the first write's session that the unit was built on: the unit is refused
    with `StaleState` if another writer appended to that session since (see `OwnWrites`).
    """

    writes: Sequence[Write]
    basis: int | None = None


class OwnWrites:
    """The versions one writer appended itself, per session: an unbroken run `(base, head]`.

    A unit built on version `basis` is current when the session is still there, or when every version
    after `basis` is this writer's own (`base <= basis`): nobody else wrote in between. A session whose
    run was forgotten (past `capacity`, least recently used first) only accepts an exact `basis`, which
    is never wrong, only sometimes a needless retry. Thread-safe.

    >>> own = OwnWrites()
    >>> own.record("s1", 3, 5)
    >>> own.base("s1", 5), own.base("s1", 4)
    (3, 4)
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self._runs: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._lock = threading.Lock()

    def base(self, session_id: str, stored: int) -> int:
        """The oldest version a unit may be built on with the session at `stored`: the start of this
        writer's own run when the run reaches `stored`, else `stored` itself."""
        with self._lock:
            run = self._runs.get(session_id)
        return run[0] if run is not None and run[1] == stored else stored

    def record(self, session_id: str, before: int, after: int) -> None:
        """This writer moved the session from version `before` to `after` (one committed transaction)."""
        with self._lock:
            run = self._runs.get(session_id)
            if run is not None and run[1] >= after:
                return  # a later transaction of this writer was recorded first: keep it
            start = run[0] if run is not None and run[1] == before else before
            self._runs[session_id] = (start, after)
            self._runs.move_to_end(session_id)
            while len(self._runs) > self.capacity:
                self._runs.popitem(last=False)


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


class _Mark(NamedTuple):
    """A batch as it was before a unit (see `BatchWriter._mark`)."""

    events: int
    outbox: int
    sessions: dict[str, tuple[Session | None, set[str] | None, bool]]
    """Per session of the unit: its touched view, its dirty shards and whether it was of an old schema."""
    fresh: list[str]
    """The unit's event ids that were not logged before it."""


class BatchWriter:
    """Writes prepared events inside one open transaction; `touched` holds the resulting sessions.

    `load` reads what the checks need for the whole batch in a few statements; `write_unit` then checks
    and folds each unit's events in memory (undoing the unit's earlier events when a later one is
    refused); `flush` (call it before the transaction commits) writes the log, the outbox and the
    materialised views with one statement per table. Few statements matter: each one hands the
    interpreter lock to whatever else runs in the process, and a busy event loop makes the writer wait
    for it back.
    """

    def __init__(
        self, conn: Connection, cache: SessionCache, encoder: ShardEncoder, own: OwnWrites | None = None
    ) -> None:
        self.conn = conn
        self.cache = cache
        self.encoder = encoder
        self.own = own
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

    def write_unit(self, items: Sequence[Prepared], basis: int | None = None) -> list[Result]:
        """Append a unit's events in order: one result per event, or, when any is refused, that error for
        every event of the unit and nothing of it written. `basis`: see `Unit`."""
        if not items:
            return []
        mark = self._mark(items) if len(items) > 1 else None  # one write alone changes nothing if refused
        results: list[Result] = []
        try:
            if basis is not None:
                self._check_basis(items[0].session_id, basis)
            for item in items:
                results.append(self.write(item))
        except SessionRLError as exc:
            if mark is not None:
                self._restore(mark)
            return [exc] * len(items)
        return results

    def versions(self) -> dict[str, tuple[int, int]]:
        """Each touched session's version before the batch and after it."""
        return {sid: (self._before(sid), s.state_version) for sid, s in self.touched.items()}

    def _before(self, session_id: str) -> int:
        found = self._stored.get(session_id)
        return 0 if found is None else found[0].state_version

    def _check_basis(self, session_id: str, basis: int) -> None:
        """`StaleState` unless every version of the session after `basis` is this writer's own."""
        session = self._session(session_id)
        actual = 0 if session is None else session.state_version
        before = self._before(session_id)
        base = before if self.own is None else self.own.base(session_id, before)
        if not base <= basis <= actual:
            raise StaleState(session_id, basis, actual)

    def _mark(self, items: Sequence[Prepared]) -> _Mark:
        """What `_restore` needs to undo the unit of `items`: the batch as it is before it."""
        sids = {item.session_id for item in items}
        for sid in sids:
            self._session(sid)  # read before the unit, so undoing it never re-reads
        saved = {
            sid: (
                self.touched.get(sid),
                None if (d := self._dirty.get(sid)) is None else set(d),
                sid in self._legacy,
            )
            for sid in sids
        }
        fresh = [item.event.event_id for item in items if item.event.event_id not in self._owners]
        return _Mark(len(self._events), len(self._outbox), saved, fresh)

    def _restore(self, mark: _Mark) -> None:
        del self._events[mark.events :], self._outbox[mark.outbox :]
        for event_id in mark.fresh:
            self._owners.pop(event_id, None)
        for sid, (session, dirty, legacy) in mark.sessions.items():
            if session is None:
                self.touched.pop(sid, None)
            else:
                self.touched[sid] = session
            if dirty is None:
                self._dirty.pop(sid, None)
            else:
                self._dirty[sid] = dirty
            if legacy:
                self._legacy.add(sid)
            else:
                self._legacy.discard(sid)

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
