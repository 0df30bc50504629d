"""The consistency checker: the event log is the truth; everything else is compared with its fold.

For every session it replays the log (`fold`), then compares the digest of the result with the
materialised session, the rows the projector would write with the query tables, and, when an archive is
given, with the digest the archive holds. With `repair=True` it rebuilds the materialised session and
its query rows from the log. A broken log (a gap in the sequence, an event that no longer validates or
applies) cannot be repaired from itself and is only reported.

The trigram text index is derived from the `feedback` rows, not per session: it is checked as a whole
against them (drift of kind `index`, named by the index) and, with `repair=True`, rebuilt from them after
the sessions were.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from sessionrl.errors import SessionRLError
from sessionrl.session.codec import digest
from sessionrl.session.events import fold
from sessionrl.session.model import Session
from sessionrl.session.schema import load_session
from sessionrl.store.backend import PROJECTOR_KEY, Backend, Connection, session_key
from sessionrl.store.documents import (
    SHARDS,
    Doc,
    chunks,
    decode_event,
    delete_session,
    read_documents,
    write_session,
)
from sessionrl.store.projector import COLUMNS, REWARD, Rows, flatten, position, read_rows, replace_rows

DriftKind = Literal["log", "materialised", "query", "index", "archive"]


class DigestSource(Protocol):
    """Anything holding session digests to compare with the log, such as the Parquet archive."""

    def digests(self) -> Mapping[str, str]:
        """Digest (`sessionrl.session.codec.digest`) of every session it holds, by session id."""
        ...


@dataclass(frozen=True, slots=True)
class Drift:
    """One disagreement: which session, where (`kind`), and what differs.

    A drift of kind `index` is not about one session: `session_id` names the index (`feedback_text`).
    """

    session_id: str
    kind: DriftKind
    detail: str


@dataclass(frozen=True, slots=True)
class ConsistencyReport:
    """What a check found, and which sessions it rebuilt from their logs (plus the text index's name when
    it rebuilt that index)."""

    sessions: int
    drift: tuple[Drift, ...]
    repaired: tuple[str, ...]

    @property
    def clean(self) -> bool:
        """True when nothing disagreed with the log."""
        return not self.drift


@dataclass(frozen=True, slots=True)
class Replay:
    """A session's log replayed: the folded view (None when there is no log) or why replay failed."""

    session: Session | None
    problem: str | None = None


def check(db: Backend, *, repair: bool, archive: DigestSource | None, chunk: int = 200) -> ConsistencyReport:
    """Compare every session with its log; with `repair`, rebuild what drifted (see the module doc)."""
    with db.snapshot() as conn:
        ids = _all_session_ids(conn)
    archived = dict(archive.digests()) if archive is not None else {}
    drift: list[Drift] = []
    for part in chunks(ids, chunk):
        with db.snapshot() as conn:
            drift += _inspect(conn, part, archived)
    known = set(ids)
    drift += [
        Drift(sid, "archive", "archived but not in the event log") for sid in archived if sid not in known
    ]
    problem = db.text_index_problem()
    if problem is not None:
        drift.append(Drift(db.text_index, "index", f"text index disagrees with the feedback rows: {problem}"))
    repaired: list[str] = []
    if repair:
        broken = {d.session_id for d in drift if d.kind == "log"}
        todo = sorted({d.session_id for d in drift if d.kind in ("materialised", "query")} - broken)
        for part in chunks(todo, chunk):
            with db.atomic() as conn:
                db.serialise(conn, [*map(session_key, part), PROJECTOR_KEY])
                repaired += rebuild(conn, part)
        if problem is not None:
            db.rebuild_text_index()
            repaired.append(db.text_index)
    return ConsistencyReport(len(ids), tuple(drift), tuple(repaired))


def _all_session_ids(conn: Connection) -> list[str]:
    sql = "SELECT session_id FROM events UNION SELECT session_id FROM session_head"
    sql += " UNION SELECT session_id FROM sessions ORDER BY 1"
    return [r[0] for r in conn.execute(sql)]


def replay(conn: Connection, session_ids: Sequence[str]) -> dict[str, Replay]:
    """Fold the log of each session; a gap in the sequence or a failing event is a problem, not an error."""
    logs: dict[str, list[tuple[int, int, str]]] = {sid: [] for sid in session_ids}
    for part in chunks(session_ids, 500):
        marks = ",".join("?" * len(part))
        sql = f"SELECT session_id, seq, schema_version, payload FROM events WHERE session_id IN ({marks})"
        for sid, seq, version, payload in conn.execute(sql + " ORDER BY session_id, seq", part):
            logs[sid].append((seq, version, payload))
    out: dict[str, Replay] = {}
    for sid, log in logs.items():
        if not log:
            out[sid] = Replay(None)
        elif [seq for seq, _, _ in log] != list(range(1, len(log) + 1)):
            out[sid] = Replay(None, f"sequence is not 1..{len(log)}")
        else:
            try:
                out[sid] = Replay(fold(decode_event(p, v) for _, v, p in log))
            except SessionRLError as exc:
                out[sid] = Replay(None, f"replay failed: {exc}")
    return out


def _inspect(conn: Connection, ids: Sequence[str], archived: Mapping[str, str]) -> list[Drift]:
    replays = replay(conn, ids)
    docs = read_documents(conn, ids)
    rows = _rows_by_session(read_rows(conn, ids))
    pending = _pending(conn)
    drift: list[Drift] = []
    for sid in ids:
        r = replays[sid]
        if r.problem is not None:
            drift.append(Drift(sid, "log", r.problem))
            continue
        logged = None if r.session is None else digest(r.session)
        if (problem := _materialised_problem(docs.get(sid), logged)) is not None:
            drift.append(Drift(sid, "materialised", problem))
        if sid not in pending:
            actual = rows.get(sid) or Rows()
            expected = Rows() if r.session is None else flatten(r.session.model_dump(mode="json"))
            tables = [t for t in COLUMNS if Counter(expected.tables[t]) != Counter(actual.tables[t])]
            if tables:
                drift.append(Drift(sid, "query", f"rows differ from the log in {', '.join(tables)}"))
        if sid in archived and archived[sid] != logged:
            drift.append(
                Drift(sid, "archive", f"archive digest {archived[sid][:12]} != log {str(logged)[:12]}")
            )
    return drift


def _materialised_problem(doc: Doc | None, logged: str | None) -> str | None:
    if doc is None:
        return None if logged is None else "missing"
    if logged is None:
        return "stored without an event log"
    try:
        stored = digest(load_session(doc))
    except (SessionRLError, ValueError) as exc:
        return f"unreadable: {exc}"
    return None if stored == logged else f"digest {stored[:12]} != log {logged[:12]}"


def _rows_by_session(rows: Rows) -> dict[str, Rows]:
    out: dict[str, Rows] = {}
    for table, table_rows in rows.tables.items():
        for row in table_rows:
            out.setdefault(row[0], Rows()).tables[table].append(row)
    return out


def _pending(conn: Connection) -> set[str]:
    """Sessions with outbox rows not yet projected: their query rows are behind, not wrong."""
    sql = "SELECT DISTINCT session_id FROM outbox WHERE cursor > ? AND type <> ?"
    return {r[0] for r in conn.execute(sql, (position(conn), REWARD))}


def rebuild(conn: Connection, session_ids: Sequence[str]) -> list[str]:
    """Rewrite the materialised view and query rows of sessions from their logs; return those rebuilt."""
    done: list[str] = []
    for sid, r in replay(conn, session_ids).items():
        if r.problem is not None:
            continue
        if r.session is None:
            delete_session(conn, sid)
            replace_rows(conn, {sid: None})
        else:
            write_session(conn, r.session, SHARDS)
            replace_rows(conn, {sid: r.session.model_dump(mode="json")})
        done.append(sid)
    return done
