"""Data migrations: what a layout change leaves to redo from the event log, done once when a store opens.

A backend changes its tables inside its own DDL transaction (`dialect.STORE_SCHEMA` on SQLite,
`postgres.LAYOUT` on PostgreSQL). When the change also means that sessions must be folded again, it
leaves the `cursors` row `dialect.REFOLD`, and `SessionStore` calls `finish_pending` before it serves
anything: in one write transaction that holds every session it rewrites (and the projector), it

- folds again from its log every session with more than one feedback event, and writes its materialised
  view and query rows anew: before SQLite layout 4 / PostgreSQL layout 3, feedback of the same type on the
  same anchor from two sources kept only the later item in the view (the log kept both);
- writes the query rows of every other session with LLM calls again from its stored view: the
  `llm_calls` table was made again with `status` and `error` columns;
- removes the row. A second process opening the same store meanwhile waits, then finds nothing to do.

A layout that adds a query table (SQLite layout 5 / PostgreSQL layout 4: the session list's
`session_facts`, `session_errors` and `session_text`) leaves the row `dialect.REPROJECT` instead, or as
well: then the query rows of every session not folded again are written again from its stored view.

A session whose log cannot be replayed (a gap, an event that no longer applies) keeps its view; it is
counted, logged, and reported by the consistency checker as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sessionrl.store.backend import PROJECTOR_KEY, Backend, Connection, session_key
from sessionrl.store.consistency import rebuild
from sessionrl.store.dialect import REFOLD, REPROJECT
from sessionrl.store.documents import chunks, read_documents
from sessionrl.store.projector import replace_rows

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class MigrationReport:
    """What `finish_pending` did: sessions folded again, sessions whose rows were written again, and
    sessions it could not fold (their log is broken)."""

    refolded: int = 0
    reprojected: int = 0
    unreplayable: tuple[str, ...] = ()


def pending(conn: Connection) -> bool:
    """Whether a layout change left sessions to fold again or to project again."""
    return bool(_marks(conn))


def _marks(conn: Connection) -> set[str]:
    rows = conn.execute("SELECT name FROM cursors WHERE name IN (?, ?)", (REFOLD, REPROJECT)).fetchall()
    return {str(r[0]) for r in rows}


def finish_pending(db: Backend, chunk: int = 500) -> MigrationReport:
    """Fold again what a layout change left to fold (see the module doc); nothing when nothing is left."""
    with db.snapshot() as conn:
        if not pending(conn):
            return MigrationReport()
        several = _several_feedback(conn) if REFOLD in _marks(conn) else []
    with db.atomic() as conn:
        db.serialise(conn, [PROJECTOR_KEY, *map(session_key, several)])
        marks = _marks(conn)
        if not marks:  # another process finished it while this one waited
            return MigrationReport()
        if REFOLD in marks:
            late = sorted(set(_several_feedback(conn)) - set(several))  # a writer added them meanwhile
            db.serialise(conn, [session_key(sid) for sid in late])
            several += late
        done: list[str] = []
        for part in chunks(several, chunk):
            done += rebuild(conn, part)
        refold = set(several)
        again = _all_sessions(conn) if REPROJECT in marks else _with_llm_calls(conn)
        others = [sid for sid in again if sid not in refold]
        for part in chunks(others, chunk):
            docs = read_documents(conn, part)
            replace_rows(conn, {sid: docs.get(sid) for sid in part})
        conn.execute("DELETE FROM cursors WHERE name IN (?, ?)", (REFOLD, REPROJECT))
    report = MigrationReport(len(done), len(others), tuple(sorted(refold - set(done))))
    if report.unreplayable:
        _log.warning(
            "store migration: %d session(s) could not be folded from their logs and keep their stored "
            "view (run the consistency check): %s",
            len(report.unreplayable),
            ", ".join(report.unreplayable[:10]),
        )
    _log.info("store migration: %d session(s) folded again, %d reprojected", report.refolded, len(others))
    return report


def _several_feedback(conn: Connection) -> list[str]:
    sql = "SELECT session_id FROM events WHERE type = 'feedback' GROUP BY session_id HAVING COUNT(*) > 1"
    return sorted(r[0] for r in conn.execute(sql))


def _all_sessions(conn: Connection) -> list[str]:
    return sorted(r[0] for r in conn.execute("SELECT session_id FROM sessions"))


def _with_llm_calls(conn: Connection) -> list[str]:
    return sorted(r[0] for r in conn.execute("SELECT session_id FROM sessions WHERE n_llm_calls > 0"))
