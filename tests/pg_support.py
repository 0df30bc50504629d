"""A PostgreSQL server for a test run, started as the `postgres` user when tests run as root (PostgreSQL
refuses root), with one database ready for the store; skipped, saying why, where it cannot run."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from sessionrl.store.postgres_server import OS_USER, LocalPostgres, find_bin_dir


@contextmanager
def local_postgres(database: str) -> Iterator[LocalPostgres]:
    """A server started in a temporary folder, with `database` created and its text-search extension."""
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
            admin.execute(f"CREATE DATABASE {database}")
        with psycopg.connect(server.url(database), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_trgm SCHEMA public")
        yield server
