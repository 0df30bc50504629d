"""Fixtures for the store tests, each on both backends: a store, a store at a URL, raw SQL on its
database, and a session that is running.

Every test that takes `store`, `db_url`, `file_store` (or a fixture built on them) runs once on SQLite and
once on PostgreSQL (`store_backend`). The PostgreSQL server is started once per test session in a
temporary folder (`LocalPostgres`), and each test gets a schema of its own in one database, dropped
after it. Without PostgreSQL's programs or psycopg, the PostgreSQL runs are skipped, saying why. A test
about one engine's internals pins `store_backend` with `@pytest.mark.parametrize("store_backend", [...])`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from store_support import FreshURL, RawDB, start_session

from pg_support import local_postgres
from sessionrl.store import SessionStore
from sessionrl.store.postgres_server import LocalPostgres

TEST_DATABASE = "store_tests"
_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[LocalPostgres]:
    """One PostgreSQL server for the whole run, with a database whose schemas the tests take."""
    with local_postgres(TEST_DATABASE) as server:
        yield server


@contextmanager
def pg_schema(server: LocalPostgres) -> Iterator[str]:
    """A URL naming a new, empty schema of the test database (dropped afterwards)."""
    import psycopg

    name = f"t{next(_schemas)}"
    with psycopg.connect(server.url(TEST_DATABASE), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield server.url(TEST_DATABASE, f"-csearch_path={name},public")
    finally:
        with psycopg.connect(server.url(TEST_DATABASE), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_backend(request: pytest.FixtureRequest) -> str:
    """The backend the test's stores use."""
    return str(request.param)


@pytest.fixture
def fresh_url(store_backend: str, request: pytest.FixtureRequest) -> Iterator[FreshURL]:
    """`with fresh_url() as url:` a URL of an empty store on the test's backend (for tests, such as
    hypothesis ones, that need a new store per example). On PostgreSQL the test's one schema is emptied
    for each (its tables truncated, the outbox sequence restarted): much quicker than a new schema."""
    if store_backend == "sqlite":

        @contextmanager
        def sqlite_url() -> Iterator[str]:
            folder = request.getfixturevalue("tmp_path_factory").mktemp("store")
            yield f"sqlite:///{folder / 'sessions.db'}"

        yield sqlite_url
        return
    with pg_schema(request.getfixturevalue("pg_server")) as url:

        @contextmanager
        def emptied() -> Iterator[str]:
            empty_schema(url)
            yield url

        yield emptied


def empty_schema(url: str) -> None:
    """Remove every row the store keeps in the schema `url` names (its layout row stays)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT quote_ident(tablename) FROM pg_tables"
            " WHERE schemaname = current_schema() AND tablename <> 'store_meta'"
        ).fetchall()
        if tables:
            conn.execute(f"TRUNCATE {', '.join(t[0] for t in tables)} RESTART IDENTITY")
            conn.execute("SELECT setval('outbox_cursor_seq', 1, false)")


@pytest.fixture(scope="session")
def scratch_url(request: pytest.FixtureRequest) -> Callable[[str], AbstractContextManager[str]]:
    """`with scratch_url(backend) as url:` an empty store on that backend, for fixtures of any scope (in
    memory for SQLite)."""

    @contextmanager
    def open_url(backend: str) -> Iterator[str]:
        if backend == "sqlite":
            yield "sqlite://"
        else:
            with pg_schema(request.getfixturevalue("pg_server")) as url:
                yield url

    return open_url


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
def db_url(store_backend: str, db_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of an empty store on the test's backend (a file for SQLite, a schema for PostgreSQL)."""
    if store_backend == "sqlite":
        yield f"sqlite:///{db_path}"
    else:
        with pg_schema(request.getfixturevalue("pg_server")) as url:
            yield url


@pytest.fixture
def store(store_backend: str, request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    """A store on the test's backend (in memory for SQLite)."""
    url = "sqlite://" if store_backend == "sqlite" else request.getfixturevalue("db_url")
    with SessionStore.open(url) as s:
        yield s


@pytest.fixture
def file_store(db_url: str) -> Iterator[SessionStore]:
    with SessionStore.open(db_url) as s:
        yield s


@pytest.fixture
def raw(db_url: str) -> RawDB:
    """Plain SQL on the database of `db_url` (and so of `file_store`)."""
    return RawDB(db_url)


@pytest.fixture
def running(store: SessionStore) -> SessionStore:
    """The in-memory store holding session `s1`, executing, at state_version 4, with tool call `c1`."""
    start_session(store)
    return store


@pytest.fixture
def file_running(file_store: SessionStore) -> SessionStore:
    """The file store holding session `s1` as in `running`."""
    start_session(file_store)
    return file_store


V1_AT = "2024-05-01T10:00:00Z"


def write_v1_session(db: RawDB, sid: str, root_goal: str, subgoals: list[str]) -> None:
    """Write, with plain SQL, a session as a schema-v1 store held it: plan sub-goals as bare strings.

    The log has the session's creation and its v1 plan; the materialised document is v1 throughout.
    """
    create: dict[str, Any] = {"user_query": "old question", "session_id": sid, "tags": [], "metadata": {}}
    created: dict[str, Any] = {
        "type": "session_created",
        "event_id": f"{sid}.e1",
        "at": V1_AT,
        "session_id": sid,
    }
    created |= {"trace_id": "0" * 31 + "1", "create": create}
    plan: dict[str, Any] = {"root_goal": root_goal, "subgoals": subgoals}
    plan_set: dict[str, Any] = {"type": "plan_set", "event_id": f"{sid}.e2", "at": V1_AT, "plan": plan}
    head: dict[str, Any] = {
        "session_id": sid,
        "trace_id": created["trace_id"],
        "scenario": None,
        "tags": [],
        "user_id": None,
    }
    head |= {"user_query": "old question", "metadata": {}, "created_at": V1_AT, "updated_at": V1_AT}
    shards = {
        "plan": {"plan": plan},
        "execution": {"tool_calls": [], "llm_calls": [], "final_output": None},
        "feedback": {"feedback": []},
    }
    with db.connect() as conn:
        for seq, event in ((1, created), (2, plan_set)):
            conn.execute(
                "INSERT INTO events (session_id, seq, event_id, type, schema_version, at, payload)"
                " VALUES (?, ?, ?, ?, 1, ?, ?)",
                (sid, seq, event["event_id"], event["type"], V1_AT, orjson.dumps(event).decode()),
            )
            conn.execute(
                "INSERT INTO outbox (session_id, seq, type, at) VALUES (?, ?, ?, ?)",
                (sid, seq, event["type"], V1_AT),
            )
        conn.execute(
            "INSERT INTO session_head VALUES (?, 1, 'created', 2, 1, 0, 0, ?)",
            (sid, orjson.dumps(head).decode()),
        )
        conn.executemany(
            "INSERT INTO session_shard VALUES (?, ?, ?)",
            [(sid, name, orjson.dumps(doc).decode()) for name, doc in shards.items()],
        )


@pytest.fixture
def write_v1() -> Callable[[RawDB, str, str, list[str]], None]:
    """`write_v1(raw, session_id, root_goal, subgoals)` writes a schema-v1 session with plain SQL."""
    return write_v1_session
