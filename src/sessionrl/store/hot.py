"""`SessionStore`: the durable, event-sourced session store, on a backend picked by the URL's scheme.

Every change is an event, appended in one transaction with the materialised session (three shards and
their versions) and an outbox row, and acknowledged only after that transaction is durable (on SQLite:
WAL, `synchronous=FULL`). Reads of the current session come from a small cache checked against the
stored version. Query tables are filled from the outbox by the projector, lazily: every query drains it first,
so what a query sees includes every acknowledged write.

>>> from sessionrl.session import SessionCreate, StateChanged
>>> with SessionStore.open("sqlite://") as store:
...     s = store.create(SessionCreate(user_query="Where is my order?", session_id="s1"))
...     s = store.append("s1", StateChanged(state="executing"), expected_version=1)
...     (s.state.value, s.state_version, [e.seq for e in store.events("s1")])
('executing', 2, [1, 2])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field

from sessionrl.errors import InvalidEvent, NotFound, SessionRLError, StaleState
from sessionrl.session.events import created
from sessionrl.session.model import Session, SessionCreate, SessionState, utcnow
from sessionrl.session.schema import load_session
from sessionrl.store import consistency, migrations, projector
from sessionrl.store import query as queries
from sessionrl.store.backend import PROJECTOR_KEY, Backend, open_backend, session_key
from sessionrl.store.cache import SessionCache
from sessionrl.store.consistency import ConsistencyReport, DigestSource
from sessionrl.store.documents import ShardEncoder, chunks, decode_event, iso, read_documents
from sessionrl.store.query import SessionQuery
from sessionrl.store.records import Change, ChangeBatch, RewardRecord, SessionRow, StoredEvent
from sessionrl.store.writes import (
    BatchWriter,
    EventInput,
    OwnWrites,
    Prepared,
    Result,
    Unit,
    Write,
    current,
    prepare,
)

MiB = 1 << 20


class StoreConfig(BaseModel):
    """How to open a session store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        description="sqlite:///relative.db, sqlite:////absolute.db, sqlite:// (in memory), or"
        " postgresql://user@host/database; the scheme picks the backend (`sessionrl.store.backend.BACKENDS`)."
    )
    max_event_bytes: int = Field(default=MiB, ge=256, description="Largest encoded event accepted.")
    cache_sessions: int = Field(default=1024, ge=0, description="Current sessions kept in memory.")
    projector_batch: int = Field(default=2000, ge=1, description="Outbox rows projected per transaction.")


class SessionStore:
    """The session store facade. Thread-safe; use as a context manager or call `close()`."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._db = open_backend(config.url)
        try:
            migrations.finish_pending(self._db)  # what an older layout left to fold again, once
        except BaseException:
            self._db.close()
            raise
        self._cache = SessionCache(config.cache_sessions)
        self._encoder = ShardEncoder(config.cache_sessions)

    @classmethod
    def open(cls, url: str, *, max_event_bytes: int = MiB, cache_sessions: int = 1024) -> SessionStore:
        """Open (creating if needed) the store at `url`; `InvalidStoreURL` for a scheme no backend serves."""
        return cls(StoreConfig(url=url, max_event_bytes=max_event_bytes, cache_sessions=cache_sessions))

    @property
    def backend(self) -> Backend:
        """The database backend under this store (picked by the URL's scheme)."""
        return self._db

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the database connections."""
        self._db.close()

    # writes

    def create(self, create: SessionCreate, *, event_id: str | None = None) -> Session:
        """Open a session. Repeating the call with the same `event_id` returns the session it created."""
        event = created(create, event_id=event_id)
        return self.append(event.session_id, event)

    def append(self, session_id: str, event: EventInput, expected_version: int | None = None) -> Session:
        """Append one event and return the session it leads to.

        Raises `StaleState` if `expected_version` is not the stored version, `InvalidTransition` if the
        session's state does not allow the event, `InvalidEvent` / `EventTooLarge` for bad input, and
        `NotFound` for an unknown session; in every case nothing is written. An `event_id` already in the
        log is not stored again: the session is returned as it is now.
        """
        result = self.append_batch([(session_id, event, expected_version)])[0]
        if isinstance(result, SessionRLError):
            raise result
        return result

    def append_batch(self, items: Sequence[Write]) -> list[Result]:
        """Append many events in one transaction (one durable commit), in order.

        Each item gets its own result: the session it led to, or the error that rejected it (a rejected
        item writes nothing and does not stop the others).
        """
        results = self.append_units([Unit([item]) for item in items])
        return [unit[0] for unit in results]

    def append_units(self, units: Sequence[Unit], own: OwnWrites | None = None) -> list[list[Result]]:
        """Append units of events in one transaction (one durable commit), in order: one result per
        write of each unit.

        A unit is written whole or not at all: when one of its writes is refused, every write of the unit
        gets that error and none is stored; the other units go on. `own` is the calling writer's record
        of its own appends, which a unit's `basis` is checked against (without it a basis must be exact)
        and which this call extends once the transaction has committed.

        Every session written is locked for the transaction (`Backend.serialise`), so writers in other
        processes take turns on it: the versions checked here are the ones the transaction writes on.
        """
        prepared = [self._prepare_unit(unit) for unit in units]
        results: list[list[Result]] = []
        valid = [item for unit in prepared if not isinstance(unit, SessionRLError) for item in unit]
        with self._db.atomic() as conn:
            self._db.serialise(conn, [session_key(item.session_id) for item in valid])
            writer = BatchWriter(conn, self._cache, self._encoder, own)
            writer.load(valid)
            for unit, items in zip(units, prepared, strict=True):
                if isinstance(items, SessionRLError):
                    results.append([items] * len(unit.writes))
                else:
                    results.append(writer.write_unit(items, unit.basis))
            writer.flush()
        for session in writer.touched.values():
            self._cache.put(session)
        if own is not None:
            for sid, (before, after) in writer.versions().items():
                own.record(sid, before, after)
        return results

    def _prepare_unit(self, unit: Unit) -> list[Prepared] | SessionRLError:
        """The unit's writes prepared, or the first error among them (which refuses the whole unit)."""
        try:
            return [
                prepare(sid, event, expected, self.config.max_event_bytes)
                for sid, event, expected in unit.writes
            ]
        except SessionRLError as exc:
            return exc

    def save_reward(self, session_id: str, vector: dict[str, Any], ruleset_version: str) -> int:
        """Store a new reward version for a session and announce it on the change feed; return the version."""
        try:
            encoded = orjson.dumps(vector).decode()
        except TypeError as exc:
            raise InvalidEvent("vector", f"must be JSON-serialisable: {exc}") from exc
        now = iso(utcnow())
        with self._db.atomic() as conn:
            self._db.serialise(conn, [session_key(session_id)])
            row = conn.execute(
                "SELECT state_version FROM session_head WHERE session_id = ?", (session_id,)
            ).fetchone()
            if row is None:
                raise NotFound("session", session_id)
            sql = "SELECT COALESCE(MAX(version), 0) + 1 FROM rewards WHERE session_id = ?"
            version = int(conn.execute(sql, (session_id,)).fetchone()[0])
            conn.execute(
                "INSERT INTO rewards (session_id, version, ruleset_version, session_version, vector,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, version, ruleset_version, row[0], encoded, now),
            )
            conn.execute(
                "INSERT INTO outbox (session_id, seq, type, at) VALUES (?, ?, ?, ?)",
                (session_id, version, projector.REWARD, now),
            )
        return version

    # reads of the log and the current view

    def get(self, session_id: str, min_version: int | None = None) -> Session:
        """The current session; `StaleState` if it has not reached `min_version` yet."""
        with self._db.snapshot() as conn:
            found = current(conn, self._cache, session_id)
        if found is None:
            raise NotFound("session", session_id)
        session = found[0]
        if min_version is not None and min_version > session.state_version:
            raise StaleState(session_id, min_version, session.state_version)
        return session

    def events(self, session_id: str) -> list[StoredEvent]:
        """A session's event log in order (events written under older schemas come back upcast)."""
        with self._db.snapshot() as conn:
            rows = conn.execute(
                "SELECT seq, event_id, type, schema_version, at, payload FROM events"
                " WHERE session_id = ? ORDER BY seq",
                (session_id,),
            ).fetchall()
        if not rows:
            raise NotFound("session", session_id)
        return [
            StoredEvent(
                session_id, seq, eid, kind, version, datetime.fromisoformat(at), decode_event(p, version)
            )
            for seq, eid, kind, version, at, p in rows
        ]

    def session_ids(self, state: SessionState | None = None) -> list[str]:
        """Ids of every stored session (or those in `state`), sorted."""
        with self._db.snapshot() as conn:
            if state is None:
                rows = conn.execute("SELECT session_id FROM session_head ORDER BY session_id")
            else:
                sql = "SELECT session_id FROM session_head WHERE state = ? ORDER BY session_id"
                rows = conn.execute(sql, (SessionState(state).value,))
            return [r[0] for r in rows]

    def iter_sessions(self, state: SessionState | None = None, *, batch: int = 200) -> Iterator[Session]:
        """Every stored session (or those in `state`), in id order, read `batch` at a time."""
        for part in chunks(self.session_ids(state), batch):
            with self._db.snapshot() as conn:
                docs = read_documents(conn, part)
            yield from (load_session(docs[sid]) for sid in part if sid in docs)

    # query tables

    def project(self, limit: int | None = None) -> int:
        """Drain the outbox into the query tables (at most `limit` rows of it when given); return how many
        outbox rows were consumed."""
        total = 0
        while limit is None or total < limit:
            batch = (
                self.config.projector_batch
                if limit is None
                else min(self.config.projector_batch, limit - total)
            )
            with self._db.atomic() as conn:
                self._db.serialise(conn, [PROJECTOR_KEY])
                done = projector.project_batch(conn, batch)
            if done == 0:
                break
            total += done
        return total

    def query(self, q: SessionQuery, *, fresh: bool = True) -> list[SessionRow]:
        """Sessions matching typed filters (see `SessionQuery`), from the query tables. They are brought up
        to date first (`project`) unless `fresh` is False: then they are as far as the last projection
        took them, and the call costs only its own read."""
        if fresh:
            self.project()
        with self._db.snapshot() as conn:
            return queries.select_rows(conn, self._db, q)

    def count(self, q: SessionQuery) -> int:
        """How many sessions match `q` (its order, limit and offset are ignored)."""
        self.project()
        with self._db.snapshot() as conn:
            return queries.count(conn, self._db, q)

    def fraction(self, of: SessionQuery, having: SessionQuery) -> float:
        """Of the sessions matching `of`, the fraction that also match `having` (0.0 when none match `of`)."""
        self.project()
        with self._db.snapshot() as conn:
            whole = queries.count(conn, self._db, of)
            part = queries.count(conn, self._db, of, having)
        return part / whole if whole else 0.0

    def sql(self, sql: str, params: tuple[Any, ...] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        """Run one read-only statement (SELECT or WITH) and return its rows as dicts.

        Tables: `sessions`, `session_tags`, `tool_calls`, `llm_calls`, `feedback`, `rewards`, and the log
        (`events`). Anything that would write, and any statement that fails, raises `InvalidQuery`.
        """
        self.project()
        return self._db.read_only_sql(sql, params)

    # change feed and rewards

    def changes(self, after: int = 0, limit: int = 1000) -> ChangeBatch:
        """Changes with a cursor greater than `after`, oldest first. Delivery is at-least-once: a reader
        that crashes before saving the returned cursor sees the same changes again."""
        if after < 0:
            raise InvalidEvent("after", f"must be >= 0, got {after}")
        if not 1 <= limit <= 10_000:
            raise InvalidEvent("limit", f"must be between 1 and 10000, got {limit}")
        with self._db.snapshot() as conn:
            rows = conn.execute(
                "SELECT cursor, session_id, seq, type, at FROM outbox WHERE cursor > ?"
                " ORDER BY cursor LIMIT ?",
                (after, limit),
            ).fetchall()
        changes = [Change(c, sid, seq, kind, datetime.fromisoformat(at)) for c, sid, seq, kind, at in rows]
        return ChangeBatch(changes, changes[-1].cursor if changes else after)

    def rewards(self, session_id: str) -> list[RewardRecord]:
        """Every reward version of a session, oldest first."""
        with self._db.snapshot() as conn:
            if (
                conn.execute("SELECT 1 FROM session_head WHERE session_id = ?", (session_id,)).fetchone()
                is None
            ):
                raise NotFound("session", session_id)
            rows = conn.execute(
                "SELECT version, ruleset_version, session_version, vector, created_at FROM rewards"
                " WHERE session_id = ? ORDER BY version",
                (session_id,),
            ).fetchall()
        return [
            RewardRecord(session_id, v, rules, sv, orjson.loads(vec), datetime.fromisoformat(at))
            for v, rules, sv, vec, at in rows
        ]

    def reward(self, session_id: str, version: int | None = None) -> RewardRecord:
        """One reward version of a session (the latest when `version` is None)."""
        records = self.rewards(session_id)
        chosen = [r for r in records if version is None or r.version == version]
        if not chosen:
            raise NotFound("reward", f"{session_id} v{'latest' if version is None else version}")
        return chosen[-1]

    # consistency

    def consistency_check(
        self, repair: bool = False, archive: DigestSource | None = None
    ) -> ConsistencyReport:
        """Compare the log with the materialised sessions, the query tables and (if given) an archive.

        Sessions still waiting in the outbox are not compared with the query tables (they are behind,
        not wrong). Without `repair` nothing is written; with `repair=True`, sessions that drifted
        from their log are rebuilt from it (see `sessionrl.store.consistency`).
        """
        report = consistency.check(self._db, repair=repair, archive=archive)
        for sid in report.repaired:
            self._cache.drop(sid)
        return report
