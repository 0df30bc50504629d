"""The SQLite backend (`SQLiteBackend`): the URL form, the DDL, connection settings, transactions, the
read-only guard for user SQL, and feedback text search.

The rest of the store speaks plain SQL with `?` parameters and `INSERT ... ON CONFLICT`, which PostgreSQL
understands too; what differs between engines (types, pragmas, locking, the read-only guard, how text
search is spelled) lives here, behind the `sessionrl.store.backend.Backend` interface, so that a second
backend is one more module of the same shape.

Text search: feedback comments are indexed by `feedback_text`, an FTS5 table with the trigram tokenizer
whose content is the `feedback` table itself (nothing is stored twice; `feedback_text.rowid` is
`feedback.id`). Triggers on `feedback` keep it in step inside the statement that changes a row, so the
projector, a repair and a hand edit all update it in their own transaction. For SQL users:

    SELECT f.session_id FROM feedback_text t JOIN feedback f ON f.id = t.rowid
    WHERE feedback_text MATCH '"chronic disease"'   -- a quoted phrase: any substring of 3+ characters

`MATCH` folds case (Unicode) and needs at least three characters; `comment_contains` adds the exact
ASCII-case-insensitive `LIKE` test on the rows the index finds, and scans with `LIKE` for shorter needles.
"""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sessionrl.errors import InvalidQuery, InvalidStoreURL
from sessionrl.store.glossary import DROP_VIEWS, view_ddl
from sessionrl.store.summary import SQLITE_DDL as SUMMARY_DDL

STORE_SCHEMA = 5
"""Layout version of the store's own tables, kept in `PRAGMA user_version` (2 added the text index, 3 the
operations tables, 4 feedback per source and `llm_calls.status`/`error`, 5 the session list's tables
`session_facts`, `session_errors` and `session_text` with its index: see `sessionrl.store.migrations`)."""

REFOLD = "migration:refold"
"""The `cursors` row a layout change leaves when sessions must be folded again from their logs and their
query rows written again (`sessionrl.store.migrations` does it, and removes the row)."""

REPROJECT = "migration:reproject"
"""The `cursors` row a layout change leaves when every session's query rows must be written again from
its stored view (a new query table, such as layout 5's session list tables)."""

MARK_REFOLD = "INSERT INTO cursors (name, position) VALUES (?, 0) ON CONFLICT (name) DO NOTHING"
"""Leave the `REFOLD` (or `REPROJECT`) row, passing its name: a store made before the layout that needs it
is migrated when next opened."""

HOT_DDL = """
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL,
    schema_version INTEGER NOT NULL,
    at TEXT NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS session_head (
    session_id TEXT PRIMARY KEY,
    schema_version INTEGER NOT NULL,
    state TEXT NOT NULL,
    state_version INTEGER NOT NULL,
    plan_version INTEGER NOT NULL,
    execution_version INTEGER NOT NULL,
    feedback_version INTEGER NOT NULL,
    doc TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_shard (
    session_id TEXT NOT NULL,
    shard TEXT NOT NULL CHECK (shard IN ('plan', 'execution', 'feedback')),
    doc TEXT NOT NULL,
    PRIMARY KEY (session_id, shard)
);
CREATE TABLE IF NOT EXISTS outbox (
    cursor INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS cursors (
    name TEXT PRIMARY KEY,
    position INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rewards (
    session_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    ruleset_version TEXT NOT NULL,
    session_version INTEGER NOT NULL,
    vector TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (session_id, version)
);
"""
"""Tables written by appends: the event log, the materialised head and shards, the outbox, rewards."""

QUERY_DDL = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    trace_id TEXT NOT NULL,
    state TEXT NOT NULL,
    scenario TEXT,
    tags TEXT NOT NULL,
    user_id TEXT,
    user_query TEXT NOT NULL,
    root_goal TEXT,
    n_subgoals INTEGER NOT NULL,
    n_tool_calls INTEGER NOT NULL,
    n_llm_calls INTEGER NOT NULL,
    n_feedback INTEGER NOT NULL,
    final_output TEXT,
    state_version INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_state ON sessions (state);
CREATE INDEX IF NOT EXISTS sessions_scenario ON sessions (scenario);
CREATE INDEX IF NOT EXISTS sessions_user ON sessions (user_id);
CREATE INDEX IF NOT EXISTS sessions_created ON sessions (created_at);
CREATE TABLE IF NOT EXISTS session_tags (
    session_id TEXT NOT NULL,
    tag TEXT NOT NULL,
    PRIMARY KEY (session_id, tag)
);
CREATE INDEX IF NOT EXISTS session_tags_tag ON session_tags (tag, session_id);
CREATE TABLE IF NOT EXISTS tool_calls (
    session_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    subgoal_id TEXT,
    tool TEXT NOT NULL,
    status TEXT NOT NULL,
    error_code TEXT,
    retryable INTEGER NOT NULL,
    latency_ms REAL NOT NULL,
    attempt INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    PRIMARY KEY (session_id, call_id)
);
CREATE INDEX IF NOT EXISTS tool_calls_tool ON tool_calls (tool, session_id, status);
CREATE TABLE IF NOT EXISTS llm_calls (
    session_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    purpose TEXT NOT NULL,
    policy_version INTEGER,
    tokens_used INTEGER,
    n_tokens INTEGER,
    status TEXT NOT NULL,
    error TEXT,
    started_at TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    PRIMARY KEY (session_id, call_id)
);
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    feedback_id TEXT NOT NULL,
    type TEXT NOT NULL,
    score REAL,
    comment TEXT,
    annotator TEXT,
    anchor_call_id TEXT,
    anchor_subgoal_id TEXT,
    anchor_at TEXT,
    occurred_at TEXT NOT NULL,
    received_at TEXT NOT NULL,
    UNIQUE (session_id, position)
);
CREATE INDEX IF NOT EXISTS feedback_type ON feedback (type, session_id);
CREATE VIRTUAL TABLE IF NOT EXISTS feedback_text USING fts5 (
    comment, content = 'feedback', content_rowid = 'id', tokenize = 'trigram'
);
CREATE TRIGGER IF NOT EXISTS feedback_text_insert AFTER INSERT ON feedback BEGIN
    INSERT INTO feedback_text (rowid, comment) VALUES (new.id, new.comment);
END;
CREATE TRIGGER IF NOT EXISTS feedback_text_delete AFTER DELETE ON feedback BEGIN
    INSERT INTO feedback_text (feedback_text, rowid, comment) VALUES ('delete', old.id, old.comment);
END;
CREATE TRIGGER IF NOT EXISTS feedback_text_update AFTER UPDATE OF id, comment ON feedback BEGIN
    INSERT INTO feedback_text (feedback_text, rowid, comment) VALUES ('delete', old.id, old.comment);
    INSERT INTO feedback_text (rowid, comment) VALUES (new.id, new.comment);
END;
"""
"""Query tables, filled from the outbox by the projector (rewards are written directly, see `rewards`).

`feedback.id` is an explicit integer key (not the implicit rowid, which VACUUM may renumber) because the
text index `feedback_text` refers to rows by it; its triggers and `rebuild_text_index` are its only writers.
"""

OPS_DDL = """
CREATE TABLE IF NOT EXISTS policy_versions (
    policy TEXT NOT NULL,
    version INTEGER NOT NULL,
    kind TEXT NOT NULL,
    stage TEXT NOT NULL,
    artifact TEXT NOT NULL,
    share REAL NOT NULL,
    lineage TEXT NOT NULL,
    evaluation TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (policy, version)
);
CREATE TABLE IF NOT EXISTS ops_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    kind TEXT NOT NULL,
    policy TEXT,
    version INTEGER,
    detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ops_settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
"""
"""Operations tables (`sessionrl.ops`): the policy registry, its log of decisions, and global switches."""

TEXT_INDEX = "feedback_text"
"""The trigram full-text index over `feedback.comment` (see the module doc)."""

TRIGRAM = 3
"""Shortest needle the trigram index can look up; shorter ones are found by scanning."""

SESSION_TEXT_INDEX = "session_text_index"
"""The trigram full-text index over `session_text.body` (a session's searchable text)."""

REWARD_TOTAL = "json_extract(vector, '$.session_reward')"
"""A `rewards` row's session reward, read from its vector (PostgreSQL spells it with its JSON operators)."""

_FEEDBACK_V1_COLUMNS = (
    "session_id, position, feedback_id, type, score, comment, annotator, anchor_call_id,"
    " anchor_subgoal_id, anchor_at, occurred_at, received_at"
)

PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA busy_timeout=10000",
    "PRAGMA wal_autocheckpoint=4000",
)
"""WAL so readers never block the writer; FULL so an acknowledged commit survives a power cut.

The commit that takes the WAL past `wal_autocheckpoint` pages copies it into the database and syncs it,
which costs that one append extra fsyncs. At SQLite's default of 1000 pages such appends are frequent
enough to sit at the append latency's p99; four times the pages makes them four times rarer, each
checkpoint no slower (its fsyncs dominate), and pages rewritten between checkpoints (the outbox tail,
index leaves) are copied once instead of up to four times.
"""

CONTAINS = "{column} LIKE ? ESCAPE '\\'"
"""Case-insensitive (ASCII) substring test; PostgreSQL spells it ILIKE. Use with `contains_pattern`."""

TEXT_MATCH = f"id IN (SELECT rowid FROM {TEXT_INDEX} WHERE {TEXT_INDEX} MATCH ?)"
"""Feedback rows whose comment holds a phrase, found in the trigram index. Use with `match_phrase`."""


def contains_pattern(needle: str) -> str:
    r"""The LIKE pattern matching any text that contains `needle` literally.

    >>> contains_pattern("50%_off")
    '%50\\%\\_off%'
    """
    escaped = needle.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def match_phrase(needle: str) -> str:
    """The FTS5 query matching `needle` literally, as one quoted phrase (inner quotes doubled).

    >>> match_phrase('a "b" c')
    '"a ""b"" c"'
    """
    return '"' + needle.replace('"', '""') + '"'


def comment_contains(needle: str) -> tuple[str, list[str]]:
    """A condition on `feedback` rows whose comment contains `needle` (ASCII case ignored), and its values.

    Needles of three characters or more are looked up in the trigram index; `LIKE` then re-checks only the
    rows found, so the answer is exactly that of the plain `LIKE` scan used for shorter needles (the index
    also folds non-ASCII case, `LIKE` does not).

    >>> comment_contains("ok")[1]
    ['%ok%']
    >>> comment_contains("慢性病")[1]
    ['"慢性病"', '%慢性病%']
    """
    like = CONTAINS.format(column="comment")
    if len(needle) < TRIGRAM:
        return like, [contains_pattern(needle)]
    return f"{TEXT_MATCH} AND {like}", [match_phrase(needle), contains_pattern(needle)]


@dataclass(frozen=True)
class Location:
    """Where the database lives: a file path, or None for a private in-memory database."""

    path: str | None


def parse_url(url: str) -> Location:
    """Parse `sqlite:///relative.db`, `sqlite:////absolute.db`, `sqlite://:memory:` or `sqlite://`.

    >>> parse_url("sqlite:////tmp/s.db").path
    '/tmp/s.db'
    >>> parse_url("sqlite://").path is None
    True
    """
    if url in ("sqlite://", "sqlite://:memory:", "sqlite:///:memory:"):
        return Location(None)
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return Location(url[len("sqlite:///") :])
    raise InvalidStoreURL(url, "expected sqlite:///<path> or sqlite://:memory:")


_READ_ONLY_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
"""Authorizer actions a read-only statement needs; everything else (writes, DDL, PRAGMA, ATTACH) is denied,
except the read-only `PRAGMA data_version` that FTS5 asks for to see whether its cached index is current."""

_LEADING = re.compile(r"^\s*(?:(?:--[^\n]*\n|/\*.*?\*/)\s*)*(\w+)", re.DOTALL)


def check_read_only_text(sql: str) -> None:
    """Reject statements that do not start with SELECT or WITH (comments allowed before them)."""
    match = _LEADING.match(sql)
    word = match.group(1).upper() if match else ""
    if word not in ("SELECT", "WITH"):
        raise InvalidQuery(f"only SELECT or WITH statements are allowed, got {word or 'nothing'!r}")


def _read_only(action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
    data_version = action == sqlite3.SQLITE_PRAGMA and arg1 == "data_version" and arg2 is None
    return sqlite3.SQLITE_OK if action in _READ_ONLY_ACTIONS or data_version else sqlite3.SQLITE_DENY


def _statements(script: str) -> Iterator[str]:
    """The statements of a DDL script, in order (a `;` inside a trigger body does not end its statement)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                yield pending
            pending = ""


def _migrate_v1(conn: sqlite3.Connection) -> None:
    """Layout 1 keyed `feedback` by (session_id, position) alone: copy its rows into the layout-2 table,
    which gives each the integer key the text index refers to (its insert trigger indexes every row)."""
    conn.execute("DROP INDEX feedback_type")
    conn.execute("ALTER TABLE feedback RENAME TO feedback_v1")
    for statement in _statements(QUERY_DDL):
        conn.execute(statement)
    cols = _FEEDBACK_V1_COLUMNS
    conn.execute(
        f"INSERT INTO feedback ({cols}) SELECT {cols} FROM feedback_v1 ORDER BY session_id, position"
    )
    conn.execute("DROP TABLE feedback_v1")


def text_index_problem(conn: sqlite3.Connection) -> str | None:
    """Why a text index disagrees with its table (the feedback comments' first, then the sessions' text),
    or None when both agree.

    This is FTS5's integrity check against its content table; it is spelled as an INSERT, so it runs on
    the writer (it changes nothing). It reports disagreement as corruption; any other error is raised.
    """
    for index in (TEXT_INDEX, SESSION_TEXT_INDEX):
        try:
            conn.execute(f"INSERT INTO {index} ({index}, rank) VALUES ('integrity-check', 1)")
        except sqlite3.DatabaseError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_CORRUPT:
                raise
            return str(exc) if index == TEXT_INDEX else f"{index}: {exc}"
    return None


def rebuild_text_index(conn: sqlite3.Connection) -> None:
    """Rebuild the text indexes from every row of `feedback` and of `session_text`."""
    for index in (TEXT_INDEX, SESSION_TEXT_INDEX):
        conn.execute(f"INSERT INTO {index} ({index}) VALUES ('rebuild')")


def _connect(target: str, *, uri: bool) -> sqlite3.Connection:
    conn = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


class SQLiteBackend:
    """The store on SQLite: a writer connection and a reader connection, each behind its own lock.

    The writer runs every transaction (`atomic`). File databases get a separate read-only connection so
    long analytic reads do not hold up appends (WAL lets them run side by side); an in-memory database
    has one connection, so reader and writer are the same one under the same lock.
    """

    text_index = TEXT_INDEX
    reward_total = REWARD_TOTAL

    def __init__(self, location: Location, url: str = "") -> None:
        self.location = location
        self.url = url
        self.lock = threading.RLock()
        if location.path is not None:  # a new store's folder is made, as its file is
            Path(location.path).parent.mkdir(parents=True, exist_ok=True)
        self.writer = _connect(location.path or ":memory:", uri=False)
        for pragma in PRAGMAS:
            self.writer.execute(pragma)
        self._create_tables()
        if location.path is None:
            self.reader, self.reader_lock = self.writer, self.lock
        else:
            self.reader = _connect(f"{Path(location.path).resolve().as_uri()}?mode=ro", uri=True)
            self.reader_lock = threading.RLock()

    @classmethod
    def from_url(cls, url: str) -> SQLiteBackend:
        """Open (creating it and its folder if needed) the database at a `sqlite://` URL (see `parse_url`)."""
        return cls(parse_url(url), url)

    def _create_tables(self) -> None:
        found = self.writer.execute("PRAGMA user_version").fetchone()[0]
        if found > STORE_SCHEMA:
            self.writer.close()
            rule = f"its store layout {found} is newer than this version's ({STORE_SCHEMA})"
            raise InvalidStoreURL(self.url or str(self.location.path), rule)
        with self.atomic() as conn:
            for statement in DROP_VIEWS:  # created again below, over the tables as they end up
                conn.execute(statement)
            if found == 1:
                _migrate_v1(conn)
            if 1 <= found < 4:  # llm_calls gained status and error; it is filled again by the refold
                conn.execute("DROP TABLE llm_calls")
            for statement in _statements(HOT_DDL + QUERY_DDL + SUMMARY_DDL + OPS_DDL):
                conn.execute(statement)
            if 1 <= found < 4:
                conn.execute(MARK_REFOLD, (REFOLD,))
            if 1 <= found < 5:  # the session list's tables are filled from every session's view
                conn.execute(MARK_REFOLD, (REPROJECT,))
            for statement in view_ddl("LIKE"):  # the glossary's views, as this version spells them
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={STORE_SCHEMA}")

    @contextmanager
    def atomic(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        with self.lock:
            conn = self.writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction on the reader: every statement inside sees the same committed state."""
        with self.reader_lock:
            conn = self.reader
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def serialise(self, conn: Any, keys: Sequence[str]) -> None:
        """Nothing to do: `atomic` holds SQLite's write lock (`BEGIN IMMEDIATE`), one writer at a time."""

    def read_only_sql(
        self, sql: str, params: tuple[object, ...] | dict[str, object]
    ) -> list[dict[str, object]]:
        """Run one user statement that may only read; anything else is refused by an authorizer.

        The text index is opened first, outside the authorizer: opening an FTS5 table compiles its
        declaration, which the authorizer would see as a schema write.
        """
        check_read_only_text(sql)
        with self.reader_lock:
            conn = self.reader
            for index in (TEXT_INDEX, SESSION_TEXT_INDEX):
                conn.execute(f"SELECT rowid FROM {index} LIMIT 0").fetchall()
            conn.set_authorizer(_read_only)
            try:
                cursor = conn.execute(sql, params)
                names = [d[0] for d in cursor.description or ()]
                return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            except sqlite3.Error as exc:
                rule = "statement is not read-only" if "not authorized" in str(exc) else str(exc)
                raise InvalidQuery(rule) from exc
            finally:
                conn.set_authorizer(None)

    def feedback_conditions(
        self, feedback_type: str | None, needle: str | None
    ) -> tuple[list[str], list[Any]]:
        """Conditions on `feedback` rows of this type whose comment contains `needle`, and their values.

        A text-index lookup finds few rows, fetched by key; `+type` then keeps the planner (which has no
        table statistics) from walking every row of that type in the (type, session_id) index instead.
        """
        conds: list[str] = []
        params: list[Any] = []
        by_text = needle is not None and len(needle) >= TRIGRAM
        if feedback_type is not None:
            conds.append("+type = ?" if by_text else "type = ?")
            params.append(feedback_type)
        if needle is not None:
            condition, values = comment_contains(needle)
            conds.append(condition)
            params.extend(values)
        return conds, params

    def text_sessions(self, needles: Sequence[str]) -> tuple[str, list[Any]]:
        """A query of the sessions whose text contains any of `needles` (case ignored), and its values:
        one trigram-index lookup for those of three characters or more, a scan for shorter ones.

        The index gives `session_text` row ids; their session ids are read from the narrow index
        `session_text_session` rather than from the rows, which hold the whole text (a word found in a
        quarter of 100,000 sessions reads a few MB instead of most of the table)."""
        long = [n for n in needles if len(n) >= TRIGRAM]
        short = [n for n in needles if len(n) < TRIGRAM]
        parts = [f"SELECT session_id FROM session_text WHERE {CONTAINS.format(column='body')}" for _ in short]
        values: list[Any] = [contains_pattern(n) for n in short]
        if long:
            index = SESSION_TEXT_INDEX
            parts.insert(
                0,
                "SELECT session_id FROM session_text INDEXED BY session_text_session"
                f" WHERE id IN (SELECT rowid FROM {index} WHERE {index} MATCH ?)",
            )
            values.insert(0, " OR ".join(map(match_phrase, long)))
        return " UNION ".join(parts), values

    def text_index_problem(self) -> str | None:
        """Why the text index disagrees with the feedback comments, or None (see `text_index_problem`)."""
        with self.atomic() as conn:
            return text_index_problem(conn)

    def rebuild_text_index(self) -> None:
        """Rebuild the text index from every row of `feedback`, in one write transaction."""
        with self.atomic() as conn:
            rebuild_text_index(conn)

    def close(self) -> None:
        """Close both connections (the WAL is checkpointed by SQLite when the last one closes)."""
        with self.lock, self.reader_lock:
            if self.reader is not self.writer:
                self.reader.close()
            self.writer.close()
