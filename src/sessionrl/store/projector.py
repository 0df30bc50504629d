"""The projector: drains the outbox into flat query tables.

Every append leaves an outbox row `(cursor, session_id, seq)` in the same transaction as the event. The
projector reads outbox rows after its saved cursor, rebuilds the query rows of each named session from
its materialised document, and moves the cursor, all in one transaction. A session already projected at
`seq` or later is skipped, so projecting twice, or again after a crash between an append and its
projection, neither duplicates nor loses a row. The trigram index over feedback comments follows the
`feedback` rows through their triggers, in the same transaction (see `sessionrl.store.dialect`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sessionrl.session.schema import migrate
from sessionrl.store import summary
from sessionrl.store.backend import Connection
from sessionrl.store.documents import Doc, chunks, iso, read_documents

CURSOR = "projector"
"""Name of the projector's row in the `cursors` table."""

REWARD = "reward"
"""Outbox type of a saved reward: announced on the change feed, nothing to project."""

COLUMNS: dict[str, tuple[str, ...]] = {
    "sessions": (
        *("session_id", "trace_id", "state", "scenario", "tags", "user_id", "user_query", "root_goal"),
        *("n_subgoals", "n_tool_calls", "n_llm_calls", "n_feedback", "final_output", "state_version"),
        *("created_at", "updated_at"),
    ),
    "session_tags": ("session_id", "tag"),
    "tool_calls": (
        *("session_id", "call_id", "subgoal_id", "tool", "status", "error_code", "retryable"),
        *("latency_ms", "attempt", "started_at", "finished_at"),
    ),
    "llm_calls": (
        *("session_id", "call_id", "purpose", "policy_version", "tokens_used", "n_tokens"),
        *("status", "error", "started_at", "finished_at"),
    ),
    "feedback": (
        *("session_id", "position", "feedback_id", "type", "score", "comment", "annotator"),
        *("anchor_call_id", "anchor_subgoal_id", "anchor_at", "occurred_at", "received_at"),
    ),
    "session_facts": ("session_id", "outcome", "failed_calls", "duration_ms", "policy_version", "stage"),
    "session_errors": ("session_id", "code"),
    "session_text": ("session_id", "body"),
}
"""Columns of every projected table, in the order `flatten` produces them."""

Row = tuple[Any, ...]


@dataclass
class Rows:
    """Query-table rows, by table."""

    tables: dict[str, list[Row]] = field(default_factory=lambda: {t: [] for t in COLUMNS})

    def add(self, other: Rows) -> None:
        """Append another set of rows to this one."""
        for table, rows in other.tables.items():
            self.tables[table].extend(rows)


def flatten(doc: Doc) -> Rows:
    """The query rows of one session, from its current-schema JSON document.

    Timestamps become fixed-width UTC text so that comparing them as text compares times. A NUL character
    in text becomes U+FFFD, on every backend: PostgreSQL text cannot hold NUL (the log and the session's
    documents, JSON-escaped, keep it).
    """
    sid = doc["session_id"]
    rows = Rows()
    rows.tables["sessions"].append(_session_row(doc))
    rows.tables["session_tags"].extend((sid, tag) for tag in dict.fromkeys(doc["tags"]))
    rows.tables["tool_calls"].extend(_tool_row(sid, c) for c in doc["tool_calls"])
    rows.tables["llm_calls"].extend(_llm_row(sid, c) for c in doc["llm_calls"])
    rows.tables["feedback"].extend(_feedback_row(sid, i, f) for i, f in enumerate(doc["feedback"]))
    rows.tables["session_facts"].append(summary.facts_row(doc))
    rows.tables["session_errors"].extend(summary.error_rows(doc))
    rows.tables["session_text"].append(summary.text_row(doc))
    for table, table_rows in rows.tables.items():
        if any("\x00" in v for row in table_rows for v in row if isinstance(v, str)):
            rows.tables[table] = [tuple(map(_without_nul, row)) for row in table_rows]
    return rows


def _without_nul(value: Any) -> Any:
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


def _session_row(doc: Doc) -> Row:
    plan = doc.get("plan") or {}
    output = doc.get("final_output") or {}
    return (
        doc["session_id"],
        doc["trace_id"],
        doc["state"],
        doc.get("scenario"),
        orjson.dumps(doc["tags"]).decode(),
        doc.get("user_id"),
        doc["user_query"],
        plan.get("root_goal"),
        len(plan.get("subgoals", ())),
        len(doc["tool_calls"]),
        len(doc["llm_calls"]),
        len(doc["feedback"]),
        output.get("text"),
        doc["state_version"],
        iso(doc["created_at"]),
        iso(doc["updated_at"]),
    )


def _tool_row(sid: str, c: Doc) -> Row:
    return (
        sid,
        c["call_id"],
        c.get("subgoal_id"),
        c["tool"],
        c["status"],
        c.get("error_code"),
        int(c["retryable"]),
        float(c["latency_ms"]),
        c["attempt"],
        iso(c["started_at"]),
        iso(c["finished_at"]),
    )


def _llm_row(sid: str, c: Doc) -> Row:
    tokens = c.get("token_ids")
    return (
        sid,
        c["call_id"],
        c["purpose"],
        c.get("policy_version"),
        c.get("tokens_used"),
        None if tokens is None else len(tokens),
        c.get("status", "success"),
        c.get("error_message"),
        iso(c["started_at"]),
        iso(c["finished_at"]),
    )


def _feedback_row(sid: str, position: int, f: Doc) -> Row:
    anchor = f.get("anchor") or {}
    at = anchor.get("at")
    score = f.get("score")
    return (
        sid,
        position,
        f["feedback_id"],
        f["type"],
        None if score is None else float(score),
        f.get("comment"),
        f.get("annotator"),
        anchor.get("call_id"),
        anchor.get("subgoal_id"),
        None if at is None else iso(at),
        iso(f["occurred_at"]),
        iso(f["received_at"]),
    )


def replace_rows(conn: Connection, docs: Mapping[str, Doc | None]) -> None:
    """Make the query rows of these sessions those of their documents (None: remove the session's rows)."""
    ids = list(docs)
    for table in COLUMNS:
        for chunk in chunks(ids, 500):
            marks = ",".join("?" * len(chunk))
            conn.execute(f"DELETE FROM {table} WHERE session_id IN ({marks})", chunk)
    rows = Rows()
    for doc in docs.values():
        if doc is not None:
            rows.add(flatten(migrate(doc)))
    for table, cols in COLUMNS.items():
        if rows.tables[table]:
            marks = ",".join("?" * len(cols))
            conn.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", rows.tables[table])


def position(conn: Connection) -> int:
    """The outbox cursor up to which everything has been projected."""
    row = conn.execute("SELECT position FROM cursors WHERE name = ?", (CURSOR,)).fetchone()
    return 0 if row is None else int(row[0])


def project_batch(conn: Connection, limit: int) -> int:
    """Project up to `limit` outbox rows past the cursor inside the caller's transaction; return how many."""
    start = position(conn)
    pending = conn.execute(
        "SELECT cursor, session_id, seq, type FROM outbox WHERE cursor > ? ORDER BY cursor LIMIT ?",
        (start, limit),
    ).fetchall()
    if not pending:
        return 0
    wanted: dict[str, int] = {}
    for _, sid, seq, kind in pending:
        if kind != REWARD:
            wanted[sid] = max(seq, wanted.get(sid, 0))
    done = projected_versions(conn, list(wanted))
    stale = [sid for sid, seq in wanted.items() if done.get(sid, 0) < seq]
    found = read_documents(conn, stale)
    replace_rows(conn, {sid: found.get(sid) for sid in stale})
    conn.execute(
        "INSERT INTO cursors (name, position) VALUES (?, ?)"
        " ON CONFLICT (name) DO UPDATE SET position = excluded.position",
        (CURSOR, pending[-1][0]),
    )
    return len(pending)


def projected_versions(conn: Connection, session_ids: Sequence[str]) -> dict[str, int]:
    """The state_version each session was last projected at."""
    out: dict[str, int] = {}
    for chunk in chunks(session_ids, 500):
        marks = ",".join("?" * len(chunk))
        sql = f"SELECT session_id, state_version FROM sessions WHERE session_id IN ({marks})"
        out.update(conn.execute(sql, chunk).fetchall())
    return out


def read_rows(conn: Connection, session_ids: Sequence[str]) -> Rows:
    """The query rows currently stored for these sessions, in a stable order."""
    rows = Rows()
    for table, cols in COLUMNS.items():
        for chunk in chunks(session_ids, 500):
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT {', '.join(cols)} FROM {table} WHERE session_id IN ({marks})"
            rows.tables[table].extend(conn.execute(sql, chunk).fetchall())
    return rows
