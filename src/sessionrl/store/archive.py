"""Parquet archive of finished sessions, partitioned by day, on any fsspec filesystem.

Layout: `<url>/date=YYYY-MM-DD/part-<ns>-<rand>.parquet`, one row per archived session view, the date being
the day the session was created (UTC). Each row holds the canonical session JSON (the source of truth for
reading back), its digest, and flattened columns for analysis (tools called, failures, rating, feedback
text, ...). Files are only ever added: a session archived twice (a retry after a crash, or a later view)
has several rows, and readers keep the one with the highest `state_version`, then the latest `written_at`.

`url` is a local path (or `file://` URL) by default; `s3://bucket/prefix` goes through s3fs, with
`storage_options` such as `{"client_kwargs": {"endpoint_url": ...}}`. DuckDB reads the files in place and
sees the latest row of each session as a view named `sessions`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import duckdb
import fsspec
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from sessionrl.errors import InvalidTransition, NotFound, StaleState
from sessionrl.session import codec
from sessionrl.session.events import StateChanged, apply
from sessionrl.session.model import CallStatus, FeedbackType, Session, SessionState, utcnow
from sessionrl.session.schema import load_session
from sessionrl.store.hot import SessionStore

SCHEMA = pa.schema(
    [
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("date", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("scenario", pa.string()),
        pa.field("schema_version", pa.int32(), nullable=False),
        pa.field("state_version", pa.int64(), nullable=False),
        pa.field("digest", pa.string(), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("written_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("user_id", pa.string()),
        pa.field("tools", pa.list_(pa.string()), nullable=False),
        pa.field("failed_tools", pa.list_(pa.string()), nullable=False),
        pa.field("n_tool_calls", pa.int32(), nullable=False),
        pa.field("n_llm_calls", pa.int32(), nullable=False),
        pa.field("tokens_used", pa.int64(), nullable=False),
        pa.field("tool_latency_ms", pa.float64(), nullable=False),
        pa.field("rating", pa.float64()),
        pa.field("feedback_types", pa.list_(pa.string()), nullable=False),
        pa.field("feedback_text", pa.string(), nullable=False),
        pa.field("session_json", pa.string(), nullable=False),
    ]
)
"""Columns of every archive file. `tools` and `failed_tools` list one entry per call, in call order."""

_LATEST = """
CREATE VIEW sessions AS SELECT * EXCLUDE (rank_) FROM (
    SELECT *, row_number() OVER (
        PARTITION BY session_id ORDER BY state_version DESC, written_at DESC
    ) AS rank_
    FROM session_rows
) WHERE rank_ = 1
"""
"""The `sessions` view: of all rows written for a session, the latest view."""


def session_row(session: Session, written_at: datetime) -> dict[str, Any]:
    """The archive row of one session: canonical JSON, digest, and flattened analysis columns."""
    ratings = [
        f.score for f in session.feedback if f.type is FeedbackType.HUMAN_RATING and f.score is not None
    ]
    return {
        "session_id": session.session_id,
        "date": partition_date(session),
        "state": session.state.value,
        "scenario": session.scenario,
        "schema_version": session.schema_version,
        "state_version": session.state_version,
        "digest": codec.digest(session),
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "written_at": written_at,
        "user_id": session.user_id,
        "tools": [c.tool for c in session.tool_calls],
        "failed_tools": [c.tool for c in session.tool_calls if c.status is not CallStatus.SUCCESS],
        "n_tool_calls": len(session.tool_calls),
        "n_llm_calls": len(session.llm_calls),
        "tokens_used": session.tokens_reported(),
        "tool_latency_ms": sum(c.latency_ms for c in session.tool_calls),
        "rating": sum(ratings) / len(ratings) if ratings else None,
        "feedback_types": [f.type.value for f in session.feedback],
        "feedback_text": "\n".join(f.comment for f in session.feedback if f.comment),
        "session_json": codec.dumps(session).decode(),
    }


def partition_date(session: Session) -> str:
    """The `date=` partition of a session: the UTC day it was created, as YYYY-MM-DD."""
    return session.created_at.astimezone(UTC).date().isoformat()


class Archive:
    """Append-only Parquet archive of sessions at `url` (a local path, `file://...` or `s3://...`)."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.fs: fsspec.AbstractFileSystem
        self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        self.root = self.root.rstrip("/")

    @property
    def is_local(self) -> bool:
        """Whether the archive lives on the local filesystem (DuckDB then reads the files directly)."""
        return isinstance(self.fs, LocalFileSystem)

    def write(self, sessions: Iterable[Session]) -> list[str]:
        """Write sessions as one new file per date partition; returns the URLs of the files written."""
        written_at = utcnow()
        by_date: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for session in sessions:
            row = session_row(session, written_at)
            by_date[row["date"]].append(row)
        paths = []
        for date, rows in sorted(by_date.items()):
            rows.sort(key=lambda r: r["session_id"])  # sorted ids let row-group statistics skip files
            table = pa.Table.from_pylist(rows, schema=SCHEMA)
            paths.append(self._write_file(date, table))
        return paths

    def _write_file(self, date: str, table: pa.Table) -> str:
        """Write one partition file. Locally it is written aside and renamed, so readers never see half."""
        folder = f"{self.root}/date={date}"
        name = f"part-{utcnow().strftime('%Y%m%dT%H%M%S%f')}-{uuid.uuid4().hex[:8]}.parquet"
        self.fs.makedirs(folder, exist_ok=True)
        target = f"{folder}/{name}"
        temp = f"{folder}/.{name}.tmp" if self.is_local else target
        with self.fs.open(temp, "wb") as handle:
            pq.write_table(table, handle, compression="zstd")
        if temp != target:
            self.fs.mv(temp, target)
        return str(self.fs.unstrip_protocol(target))

    def files(self) -> list[str]:
        """Paths (on `fs`) of every archive file, oldest partition first."""
        self.fs.invalidate_cache()
        if not self.fs.exists(self.root):
            return []
        return sorted(str(p) for p in self.fs.glob(f"{self.root}/date=*/part-*.parquet"))

    def duckdb_sql(self, query: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        """Run DuckDB SQL over the archive, seen as a view `sessions` (latest row per session)."""
        with duckdb.connect() as con:
            self._register(con)
            result = con.execute(query, list(params or ()))
            names = [d[0] for d in result.description or ()]
            return [dict(zip(names, row, strict=True)) for row in result.fetchall()]

    def _register(self, con: duckdb.DuckDBPyConnection) -> None:
        """Create the `sessions` view (and `session_rows`, every row written) on a DuckDB connection."""
        files = self.files()
        if not files:
            con.register("session_rows", SCHEMA.empty_table())
        else:
            if not self.is_local:
                con.register_filesystem(self.fs)
                files = [str(self.fs.unstrip_protocol(f)) for f in files]
            listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            source = f"read_parquet([{listed}], hive_partitioning = false)"
            con.execute(f"CREATE VIEW session_rows AS SELECT * FROM {source}")
        con.execute(_LATEST)

    def read(self, session_id: str) -> Session:
        """The latest archived view of one session; `NotFound` when it was never archived."""
        rows = self.duckdb_sql("SELECT session_json FROM sessions WHERE session_id = ?", [session_id])
        if not rows:
            raise NotFound("archived session", session_id)
        return _load(rows[0]["session_json"])

    def iter_sessions(self, batch_size: int = 1_000) -> Iterator[Session]:
        """Every archived session (latest view of each), by session id."""
        with duckdb.connect() as con:
            self._register(con)
            result = con.execute("SELECT session_json FROM sessions ORDER BY session_id")
            while batch := result.fetchmany(batch_size):
                for (doc,) in batch:
                    yield _load(doc)

    def digests(self) -> dict[str, str]:
        """The digest of the latest archived view of every session, by session id."""
        rows = self.duckdb_sql("SELECT session_id, digest FROM sessions")
        return {r["session_id"]: r["digest"] for r in rows}


def _load(doc: str) -> Session:
    return load_session(orjson.loads(doc))


DONE = (SessionState.FINISHED, SessionState.REJECTED)
"""States whose sessions are ready for the archive."""


def archive_finished(
    store: SessionStore, archive: Archive, before: datetime | None = None, *, batch: int = 500
) -> int:
    """Archive finished and rejected sessions last updated before `before` (timezone-aware; None: all).

    For each batch, the view the session will have once archived is written to Parquet first, then the
    `StateChanged(archived)` events are appended (one transaction) with `expected_version` set, so the
    archive and the store hold the same digest. A session that changed in between (late feedback) is
    skipped and archived again by a later run, whose newer row supersedes the earlier one; a crash between
    the two steps leaves only a row that the next run supersedes the same way. Returns how many sessions
    moved to `archived`.
    """
    moved = 0
    pending: list[Session] = []
    for state in DONE:
        for session in store.iter_sessions(state):
            if before is None or session.updated_at < before:
                pending.append(session)
            if len(pending) == batch:
                moved += _archive_batch(store, archive, pending)
                pending = []
    return moved + (_archive_batch(store, archive, pending) if pending else 0)


def archive_event(session_id: str) -> StateChanged:
    """The event that marks a session archived; its id is derived from the session, so retries repeat it."""
    key = hashlib.sha256(session_id.encode()).hexdigest()[:40]
    return StateChanged(
        event_id=f"archive_{key}", state=SessionState.ARCHIVED, reason="written to the archive"
    )


def _archive_batch(store: SessionStore, archive: Archive, sessions: Sequence[Session]) -> int:
    moves = [(s, archive_event(s.session_id)) for s in sessions]
    archive.write(apply(s, event) for s, event in moves)
    results = store.append_batch([(s.session_id, event, s.state_version) for s, event in moves])
    moved = 0
    for result in results:
        if isinstance(result, Session):
            moved += 1
        elif not isinstance(result, StaleState | InvalidTransition):
            raise result
    return moved
