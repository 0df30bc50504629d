"""Fixtures of the operations tests: a store on each backend (PostgreSQL when its programs are installed)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from pg_support import local_postgres
from sessionrl.store import SessionStore
from sessionrl.store.postgres_server import LocalPostgres

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def ops_pg() -> Iterator[LocalPostgres]:
    """A database on a PostgreSQL server started for the run (skipped, saying why, when there is none)."""
    with local_postgres("ops_tests") as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def ops_store(request: pytest.FixtureRequest) -> Iterator[SessionStore]:
    """An empty store on each backend (SQLite in memory; a fresh schema of the PostgreSQL database)."""
    if request.param == "sqlite":
        with SessionStore.open("sqlite://") as store:
            yield store
        return
    import psycopg

    server = request.getfixturevalue("ops_pg")
    url, name = server.url("ops_tests"), f"ops{next(_schemas)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        with SessionStore.open(server.url("ops_tests", f"-csearch_path={name},public")) as store:
            yield store
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two exported tiny policies that load (`a`, `b`), and a folder that does not exist (`gone`)."""
    import shutil

    from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy

    root = tmp_path_factory.mktemp("artifacts")
    config = TinyModelConfig(vocab_size=300, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    build_tiny_policy(["find the order and refund it"] * 20, config, root / "a")
    shutil.copytree(root / "a", root / "b")
    return {"a": str(root / "a"), "b": str(root / "b"), "gone": str(root / "gone")}
