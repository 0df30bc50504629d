"""The PostgreSQL backend (`PostgresBackend`, psycopg 3): the DDL, transactions, cross-process locking,
the change feed's commit order, the read-only guard for user SQL, and feedback text search.

Open it with `SessionStore.open("postgresql://user@host/db")` (any libpq URL; `postgres://` too). Several
processes may share one database; each holds one writer and one reader connection.

Per-session serialisation across processes: every write transaction first takes transaction-scoped
advisory locks on the sessions it touches (`serialise`). A second process appending to the same session
waits for the first to commit and then reads the version it left, so `StaleState`, idempotent event
ids and last-writer-wins behave as on a single writer; different sessions proceed in parallel. A
session's lock is one of `LOCK_BUCKETS` (its id hashed), at the cost of two sessions sharing a bucket
now and then waiting for each other: the buckets are many, since a group commit writes dozens of
sessions in one transaction, and two processes' transactions that shared any bucket would take turns,
commit and disk sync included. PostgreSQL's lock table is small, so a transaction naming more than
`MAX_SESSION_LOCKS` keys takes the writers' lock exclusively instead of one lock per bucket; every other
transaction holds that lock shared, so it waits for the large one (a large import or repair), as it
would if the large one held every bucket. The writers' lock comes first, the buckets after it in
ascending order, and the outbox lock below always last, so no two writers wait on each other in a
cycle. The projector takes a lock of its own, so one process at a time drains the outbox.

The change feed never skips a commit: outbox cursors are not taken from the column default but by the
trigger `outbox_commit_order`, which first takes a transaction-scoped advisory lock on the outbox (held
until the transaction ends) and then draws the next value of `outbox_cursor_seq`. Locks are released
only after a commit is visible, so a transaction that draws a larger cursor starts drawing after every
smaller cursor's transaction is visible (or rolled back): a reader that sees cursor `c` sees every
committed cursor below `c`, and may move past it safely. Only the last statements of a write
transaction (its outbox rows to its commit) are serialised; the rest of it runs in parallel.

Text search: `feedback.comment` and `session_text.body` (a session's searchable text, see
`sessionrl.store.summary`) carry GIN trigram indexes (`pg_trgm`), which serve `ILIKE '%…%'`
for needles of three characters or more, Chinese included (the index is built under the database's
character classification; the `ILIKE` re-check makes the answer exact whatever it is). Text columns use
the "C" collation, so `ORDER BY` sorts by code point as SQLite and Python do and `ILIKE` folds ASCII case
alone, as SQLite's `LIKE` does. For SQL users:

    SELECT session_id FROM feedback WHERE comment ILIKE '%慢性病%'
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import psycopg

from sessionrl.errors import InvalidQuery, InvalidStoreURL
from sessionrl.store.backend import Connection
from sessionrl.store.dialect import (
    MARK_REFOLD,
    REFOLD,
    REPROJECT,
    check_read_only_text,
    contains_pattern,
)
from sessionrl.store.glossary import view_ddl

_log = logging.getLogger(__name__)

LAYOUT = 4
"""Layout version of the store's tables on PostgreSQL, kept in `store_meta` (SQLite's has its own; 2 added
the operations tables, 3 feedback per source and `llm_calls.status`/`error`, 4 the session list's tables
`session_facts`, `session_errors` and `session_text` with its trigram index: see
`sessionrl.store.migrations`)."""

T = 'TEXT COLLATE "C"'

DDL = f"""
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE TABLE IF NOT EXISTS events (
    session_id {T} NOT NULL, seq BIGINT NOT NULL, event_id {T} NOT NULL UNIQUE, type {T} NOT NULL,
    schema_version INTEGER NOT NULL, at {T} NOT NULL, payload {T} NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS session_head (
    session_id {T} PRIMARY KEY, schema_version INTEGER NOT NULL, state {T} NOT NULL,
    state_version BIGINT NOT NULL, plan_version BIGINT NOT NULL, execution_version BIGINT NOT NULL,
    feedback_version BIGINT NOT NULL, doc {T} NOT NULL
);
CREATE TABLE IF NOT EXISTS session_shard (
    session_id {T} NOT NULL,
    shard {T} NOT NULL CHECK (shard IN ('plan', 'execution', 'feedback')),
    doc {T} NOT NULL,
    PRIMARY KEY (session_id, shard)
);
CREATE SEQUENCE IF NOT EXISTS outbox_cursor_seq;
CREATE TABLE IF NOT EXISTS outbox (
    cursor BIGINT PRIMARY KEY, session_id {T} NOT NULL, seq BIGINT NOT NULL, type {T} NOT NULL,
    at {T} NOT NULL
);
CREATE OR REPLACE FUNCTION outbox_commit_order() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(TG_RELID::int4, 0);
    NEW.cursor := nextval(quote_ident(TG_TABLE_SCHEMA) || '.outbox_cursor_seq');
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS outbox_commit_order ON outbox;
CREATE TRIGGER outbox_commit_order BEFORE INSERT ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_commit_order();
CREATE TABLE IF NOT EXISTS cursors (name {T} PRIMARY KEY, position BIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS rewards (
    session_id {T} NOT NULL, version BIGINT NOT NULL, ruleset_version {T} NOT NULL,
    session_version BIGINT NOT NULL, vector {T} NOT NULL, created_at {T} NOT NULL,
    PRIMARY KEY (session_id, version)
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id {T} PRIMARY KEY, trace_id {T} NOT NULL, state {T} NOT NULL, scenario {T},
    tags {T} NOT NULL, user_id {T}, user_query {T} NOT NULL, root_goal {T},
    n_subgoals BIGINT NOT NULL, n_tool_calls BIGINT NOT NULL, n_llm_calls BIGINT NOT NULL,
    n_feedback BIGINT NOT NULL, final_output {T}, state_version BIGINT NOT NULL,
    created_at {T} NOT NULL, updated_at {T} NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_state ON sessions (state);
CREATE INDEX IF NOT EXISTS sessions_scenario ON sessions (scenario);
CREATE INDEX IF NOT EXISTS sessions_user ON sessions (user_id);
CREATE INDEX IF NOT EXISTS sessions_created ON sessions (created_at);
CREATE TABLE IF NOT EXISTS session_tags (
    session_id {T} NOT NULL, tag {T} NOT NULL, PRIMARY KEY (session_id, tag)
);
CREATE INDEX IF NOT EXISTS session_tags_tag ON session_tags (tag, session_id);
CREATE TABLE IF NOT EXISTS tool_calls (
    session_id {T} NOT NULL, call_id {T} NOT NULL, subgoal_id {T}, tool {T} NOT NULL,
    status {T} NOT NULL, error_code {T}, retryable INTEGER NOT NULL, latency_ms DOUBLE PRECISION NOT NULL,
    attempt BIGINT NOT NULL, started_at {T} NOT NULL, finished_at {T} NOT NULL,
    PRIMARY KEY (session_id, call_id)
);
CREATE INDEX IF NOT EXISTS tool_calls_tool ON tool_calls (tool, session_id, status);
CREATE TABLE IF NOT EXISTS llm_calls (
    session_id {T} NOT NULL, call_id {T} NOT NULL, purpose {T} NOT NULL, policy_version BIGINT,
    tokens_used BIGINT, n_tokens BIGINT, status {T} NOT NULL, error {T}, started_at {T} NOT NULL,
    finished_at {T} NOT NULL,
    PRIMARY KEY (session_id, call_id)
);
CREATE TABLE IF NOT EXISTS feedback (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, session_id {T} NOT NULL,
    position BIGINT NOT NULL, feedback_id {T} NOT NULL, type {T} NOT NULL, score DOUBLE PRECISION,
    comment {T}, annotator {T}, anchor_call_id {T}, anchor_subgoal_id {T}, anchor_at {T},
    occurred_at {T} NOT NULL, received_at {T} NOT NULL,
    UNIQUE (session_id, position)
);
CREATE INDEX IF NOT EXISTS feedback_type ON feedback (type, session_id);
CREATE TABLE IF NOT EXISTS session_facts (
    session_id {T} PRIMARY KEY, outcome INTEGER, failed_calls BIGINT NOT NULL,
    duration_ms DOUBLE PRECISION, policy_version BIGINT, stage {T}
);
CREATE INDEX IF NOT EXISTS session_facts_outcome ON session_facts (outcome, session_id);
CREATE INDEX IF NOT EXISTS session_facts_stage ON session_facts (stage, session_id);
CREATE TABLE IF NOT EXISTS session_errors (
    session_id {T} NOT NULL, code {T} NOT NULL, PRIMARY KEY (session_id, code)
);
CREATE INDEX IF NOT EXISTS session_errors_code ON session_errors (code, session_id);
CREATE INDEX IF NOT EXISTS rewards_ruleset ON rewards (ruleset_version, session_id);
CREATE TABLE IF NOT EXISTS session_text (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, session_id {T} NOT NULL UNIQUE,
    body {T} NOT NULL
);
CREATE TABLE IF NOT EXISTS policy_versions (
    policy {T} NOT NULL, version BIGINT NOT NULL, kind {T} NOT NULL, stage {T} NOT NULL,
    artifact {T} NOT NULL, share DOUBLE PRECISION NOT NULL, lineage {T} NOT NULL, evaluation {T} NOT NULL,
    created_at {T} NOT NULL, updated_at {T} NOT NULL, PRIMARY KEY (policy, version)
);
CREATE TABLE IF NOT EXISTS ops_log (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, at {T} NOT NULL, kind {T} NOT NULL,
    policy {T}, version BIGINT, detail {T} NOT NULL
);
CREATE TABLE IF NOT EXISTS ops_settings (key {T} PRIMARY KEY, value {T} NOT NULL, updated_at {T} NOT NULL);
"""
"""The store's tables, as SQLite's (`sessionrl.store.dialect`) with PostgreSQL's types, plus the outbox's
commit-order trigger (see the module doc); the layout version is a row of `store_meta`."""

TEXT_INDEX = "feedback_comment_trgm"
"""The trigram index over `feedback.comment`."""

TEXT_INDEX_DDL = f"CREATE INDEX IF NOT EXISTS {TEXT_INDEX} ON feedback USING gin (comment gin_trgm_ops)"

SESSION_TEXT_INDEX_DDL = (
    "CREATE INDEX IF NOT EXISTS session_text_trgm ON session_text USING gin (body gin_trgm_ops)"
)

TEXT_INDEXES = {TEXT_INDEX: TEXT_INDEX_DDL, "session_text_trgm": SESSION_TEXT_INDEX_DDL}
"""The trigram indexes by name, with the statement that makes each: the text search's."""

LOCK_BUCKETS = 65_536
"""How many advisory locks the sessions (and the projector) are spread over (see the module doc): two
transactions of 64 sessions each share a bucket about once in sixteen."""

MAX_SESSION_LOCKS = 256
"""The most bucket locks one `serialise` call takes; a call naming more keys takes the writers' lock
exclusively instead (see the module doc). A group commit writes at most `commit_batch` (256) events."""

WRITERS = -1
"""The bucket number of the writers' lock (buckets are never negative)."""

LOCK_SPACE = -0x5E55
"""The first half of every `serialise` lock's two-part key, apart from the outbox lock's (its table's
oid, never negative at this size) and other applications' single-number keys."""

DDL_LOCK = 0x5E55_10_4C
"""Advisory lock key held while the tables are created, so processes opening a new store at once do not
race on the catalog."""

_TOKENS = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/|\?|%|(?<!:):([A-Za-z_]\w*)", re.S
)


@lru_cache(maxsize=512)
def translate(sql: str, named: bool = False) -> str:
    """The store's SQL (`?` parameters, or `:name` ones when `named`) spelled for psycopg (`%s`, `%(name)s`).

    `%` becomes `%%` everywhere (psycopg reads it even inside literals); `?` and `:name` are replaced
    only outside literals, quoted names and comments, and a `::` cast is left alone.

    >>> translate("SELECT '?', x::text FROM t WHERE a = ? AND b LIKE '5%'")
    "SELECT '?', x::text FROM t WHERE a = %s AND b LIKE '5%%'"
    >>> translate("SELECT :a, ':b'", named=True)
    "SELECT %(a)s, ':b'"
    """

    def swap(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "%":
            return "%%"
        if token == "?":
            return "%s"
        if match.group(1) is not None:
            return f"%({match.group(1)})s" if named else token
        return token.replace("%", "%%")

    return _TOKENS.sub(swap, sql)


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for a name.

    >>> lock_key("session:s1") == lock_key("session:s1") != lock_key("session:s2")
    True
    """
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


class PostgresConnection:
    """A psycopg connection running the store's SQL (`?` parameters) inside the backend's transaction."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        self.holds_writers = False
        """Whether the transaction holds the writers' lock already (`PostgresBackend.serialise`)."""

    def execute(self, sql: str, parameters: Any = None, /) -> psycopg.Cursor[Any]:
        """Run one statement with its parameters."""
        return self.raw.execute(translate(sql), () if parameters is None else parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> psycopg.Cursor[Any]:
        """Run one statement per parameter row, pipelined (one round-trip for the batch)."""
        cursor = self.raw.cursor()
        rows = list(parameters)
        if rows:
            cursor.executemany(translate(sql), rows)
        return cursor


def redact(url: str) -> str:
    """The URL without its password, for messages.

    >>> redact("postgresql://bob:secret@db:5432/runs")
    'postgresql://bob:***@db:5432/runs'
    """
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _connect(url: str) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(url, autocommit=True)
    except psycopg.Error as exc:
        raise InvalidStoreURL(redact(url), f"cannot connect: {str(exc).strip()}") from exc


class PostgresBackend:
    """The store on PostgreSQL: a writer and a reader connection, each behind its own lock (see the module
    doc for how processes sharing the database stay consistent)."""

    text_index = TEXT_INDEX
    reward_total = "CAST(CAST(vector AS json) ->> 'session_reward' AS DOUBLE PRECISION)"

    def __init__(self, url: str) -> None:
        self.url = url
        self._closed = False
        self.lock = threading.RLock()
        self.reader_lock = threading.RLock()
        self.writer = _connect(url)
        try:
            self._create_tables()
            self.reader = _connect(url)
        except BaseException:
            self.writer.close()
            raise

    @classmethod
    def from_url(cls, url: str) -> PostgresBackend:
        """Open (creating the tables if needed) the store in the database at a `postgresql://` URL."""
        return cls(url)

    def _create_tables(self) -> None:
        """Create the tables of a new store, or check the layout of an existing one (which needs no
        right beyond reading it); either way, bring the glossary's views up to date when they are not."""
        with self.atomic() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (DDL_LOCK,))
            found = 0
            if (
                conn.execute(
                    "SELECT 1 FROM pg_tables WHERE tablename = 'store_meta' AND schemaname = current_schema()"
                ).fetchone()
                is not None
            ):
                row = conn.execute("SELECT value FROM store_meta WHERE key = 'layout'").fetchone()
                found = 0 if row is None else int(row[0])
            if found > LAYOUT:
                rule = f"its store layout {found} is newer than this version's ({LAYOUT})"
                raise InvalidStoreURL(redact(self.url), rule)
            if found < LAYOUT:
                conn.execute(f"CREATE TABLE IF NOT EXISTS store_meta (key {T} PRIMARY KEY, value BIGINT)")
                if 1 <= found < 3:  # llm_calls gained status and error; it is filled again by the refold
                    conn.execute("DROP TABLE llm_calls")
                self.writer.execute(DDL)
                if 1 <= found < 3:
                    conn.execute(MARK_REFOLD, (REFOLD,))
                if 1 <= found < 4:  # the session list's tables are filled from every session's view
                    conn.execute(MARK_REFOLD, (REPROJECT,))
                conn.execute(TEXT_INDEX_DDL)
                conn.execute(SESSION_TEXT_INDEX_DDL)
                _create_views(conn)
                _set_meta(conn, "layout", LAYOUT)
            elif not _views_current(conn):
                _create_views(conn)

    def _begin(self, role: str, begin: str) -> psycopg.Connection[Any]:
        """Start a transaction on the `writer` or `reader` connection, first connecting again if the
        connection was lost (a server restart, a failover): nothing was sent yet, so that is safe."""
        conn: psycopg.Connection[Any] = getattr(self, role)
        if not conn.closed:
            try:
                conn.execute(begin)
                return conn
            except psycopg.OperationalError:
                if not conn.closed:
                    raise
        if self._closed:
            raise psycopg.InterfaceError("the store is closed")
        conn = _connect(self.url)
        setattr(self, role, conn)
        conn.execute(begin)
        return conn

    @contextmanager
    def atomic(self) -> Iterator[PostgresConnection]:
        """One write transaction (READ COMMITTED; `serialise` orders writers of the same sessions)."""
        with self.lock:
            conn = self._begin("writer", "BEGIN")
            try:
                yield PostgresConnection(conn)
            except BaseException:
                _rollback(conn)
                raise
            conn.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[PostgresConnection]:
        """A read-only REPEATABLE READ transaction on the reader: one committed state throughout."""
        with self.reader_lock:
            conn = self._begin("reader", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield PostgresConnection(conn)
            finally:
                _rollback(conn)

    def serialise(self, conn: Connection, keys: Sequence[str]) -> None:
        """Hold the writers' lock shared, then the advisory lock of each key's bucket in ascending order,
        until the transaction ends; for more than MAX_SESSION_LOCKS buckets, the writers' lock alone,
        exclusively. A second call in the transaction takes its buckets alone, however many: the first
        call's hold on the writers' lock stands (asking for it again, exclusively after shared, could
        wait on a writer that waits on this one)."""
        buckets = sorted({lock_key(k) % LOCK_BUCKETS for k in keys})
        if not buckets:
            return
        held = isinstance(conn, PostgresConnection) and conn.holds_writers
        if not held and len(buckets) > MAX_SESSION_LOCKS:
            conn.execute("SELECT pg_advisory_xact_lock(?, ?)", (LOCK_SPACE, WRITERS))
        else:
            wanted = buckets if held else [WRITERS, *buckets]
            sql = (
                "SELECT CASE WHEN b = ? THEN pg_advisory_xact_lock_shared(?, b)"
                " ELSE pg_advisory_xact_lock(?, b) END FROM unnest(?::int[]) WITH ORDINALITY AS t(b, i)"
                " ORDER BY i"
            )
            conn.execute(sql, (WRITERS, LOCK_SPACE, LOCK_SPACE, wanted))
        if isinstance(conn, PostgresConnection):
            conn.holds_writers = True

    def read_only_sql(
        self, sql: str, params: tuple[object, ...] | dict[str, object]
    ) -> list[dict[str, object]]:
        """Run one user statement in a READ ONLY transaction, which PostgreSQL stops from writing.

        Parameters are `?` (a tuple) or `:name` (a dict), as on SQLite. Give untrusted users a role that
        may only SELECT: a read-only transaction still lets a statement call functions with effects
        outside the database's tables (advisory locks, `pg_sleep`).
        """
        check_read_only_text(sql)
        with self.reader_lock:
            conn = self._begin("reader", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                cursor = conn.execute(translate(sql, isinstance(params, dict)), params)
                names = [d[0] for d in cursor.description or ()]
                return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            except psycopg.Error as exc:
                rule = "statement is not read-only" if "read-only" in str(exc) else str(exc).strip()
                raise InvalidQuery(rule) from exc
            finally:
                _rollback(conn)

    def feedback_conditions(
        self, feedback_type: str | None, needle: str | None
    ) -> tuple[list[str], list[Any]]:
        """Conditions on `feedback` rows of this type whose comment contains `needle` (`ILIKE`, which the
        trigram index serves), and their values."""
        conds: list[str] = []
        params: list[Any] = []
        if feedback_type is not None:
            conds.append("type = ?")
            params.append(feedback_type)
        if needle is not None:
            conds.append("comment ILIKE ? ESCAPE '\\'")
            params.append(contains_pattern(needle))
        return conds, params

    def text_sessions(self, needles: Sequence[str]) -> tuple[str, list[Any]]:
        """A query of the sessions whose text contains any of `needles` (`ILIKE`, which the trigram index
        `session_text_trgm` serves for three characters or more), and its values."""
        conds = " OR ".join("(body ILIKE ? ESCAPE '\\')" for _ in needles)
        return f"SELECT session_id FROM session_text WHERE {conds}", [contains_pattern(n) for n in needles]

    def text_index_problem(self) -> str | None:
        """Why a trigram index (the feedback comments', then the sessions' text's) cannot serve
        searches (missing, or left invalid), or None.

        PostgreSQL maintains an index inside every statement that changes its table, so its entries
        cannot drift from the rows; what can go wrong is its absence or an interrupted build.
        """
        for index in TEXT_INDEXES:
            with self.snapshot() as conn:
                row = conn.execute(
                    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                    " WHERE c.oid = to_regclass(?)",
                    (index,),
                ).fetchone()
            if row is None or not row[0]:
                return f"index {index} is {'missing' if row is None else 'invalid'}"
        return None

    def rebuild_text_index(self) -> None:
        """Create the trigram indexes if they are missing, and rebuild them from their rows."""
        with self.atomic() as conn:
            for index, ddl in TEXT_INDEXES.items():
                conn.execute(ddl)
                conn.execute(f"REINDEX INDEX {index}")

    def close(self) -> None:
        """Close both connections."""
        with self.lock, self.reader_lock:
            self._closed = True
            self.writer.close()
            if hasattr(self, "reader"):
                self.reader.close()


def _view_statements() -> tuple[str, ...]:
    """The glossary's views as this version spells them on PostgreSQL (see `sessionrl.store.glossary`)."""
    return view_ddl("ILIKE", ' COLLATE "C"')


def _views_current(conn: PostgresConnection) -> bool:
    """Whether both glossary views exist and were made from this version's statements (their hash is the
    `store_meta` row `views`): a store made before the views existed, or before the glossary changed,
    lacks them or holds an older glossary, whatever its layout."""
    row = conn.execute(
        "SELECT (SELECT value FROM store_meta WHERE key = 'views'),"
        " to_regclass('glossary') IS NOT NULL AND to_regclass('comment_terms') IS NOT NULL"
    ).fetchone()
    return row is not None and bool(row[1]) and row[0] == lock_key("\n".join(_view_statements()))


def _create_views(conn: PostgresConnection) -> None:
    """(Re)create the glossary views and record which statements made them. A role that may only read
    the store opens it all the same, without the views, saying so: they are a convenience for SQL users,
    and the typed `comment_mentions` filter does not read them."""
    statements = _view_statements()
    conn.execute("SAVEPOINT views")
    try:
        for statement in statements:
            conn.execute(statement)
        _set_meta(conn, "views", lock_key("\n".join(statements)))
    except psycopg.errors.InsufficientPrivilege as exc:
        conn.execute("ROLLBACK TO SAVEPOINT views")
        _log.warning("the glossary views could not be brought up to date: %s", str(exc).strip())
    conn.execute("RELEASE SAVEPOINT views")


def _set_meta(conn: PostgresConnection, key: str, value: int) -> None:
    conn.execute(
        "INSERT INTO store_meta (key, value) VALUES (?, ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def _rollback(conn: psycopg.Connection[Any]) -> None:
    """End the open transaction without keeping it (a broken connection has none left to end)."""
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.execute("ROLLBACK")
