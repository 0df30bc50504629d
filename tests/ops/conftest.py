"""Fixtures of the operations tests: a store on each backend (PostgreSQL when its programs are installed)."""

from __future__ import annotations

import itertools
import os
import pwd
from collections.abc import Iterator

import pytest

from sessionrl.store import SessionStore
from sessionrl.store.postgres_server import OS_USER, LocalPostgres, find_bin_dir

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def ops_pg() -> Iterator[LocalPostgres]:
    """A database on a PostgreSQL server started for the run (skipped, saying why, when there is none)."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed: no initdb on PATH or under /usr/lib/postgresql/*/bin")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_USER)
        except KeyError:
            pytest.skip(f"PostgreSQL refuses to run as root and there is no {OS_USER!r} user to run it as")
    psycopg = pytest.importorskip(
        "psycopg", reason="psycopg is not installed (pip install 'psycopg[binary]')"
    )
    with LocalPostgres(bin_dir) as server:
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE ops_tests")
        with psycopg.connect(server.url("ops_tests"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_trgm SCHEMA public")
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
