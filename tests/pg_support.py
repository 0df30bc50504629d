"""A PostgreSQL server for a test run, started as the `postgres` user when tests run as root (PostgreSQL
refuses root), with one database ready for the store.

Where it cannot run (no PostgreSQL programs, no `postgres` user to run them as, no psycopg) the tests that
need it are skipped, saying why, on a developer's machine, and fail in CI (`CI` set to `true`, as CI
services set it): there `.ci/run` installs PostgreSQL first, so a CI machine without it is a broken CI
machine, never a run that passes the PostgreSQL half of the suite unseen."""

from __future__ import annotations

import os
import pwd
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

from sessionrl.store.postgres_server import OS_USER, LocalPostgres, find_bin_dir


def in_ci() -> bool:
    """Whether the tests run in CI, where PostgreSQL must be there (`CI=true` or `CI=1`)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def unavailable(reason: str) -> NoReturn:
    """Skip the test (a developer's machine) or fail it (CI) because PostgreSQL cannot run: `reason`."""
    if in_ci():
        pytest.fail(f"{reason}; CI is set, so the PostgreSQL tests must run (.ci/run installs it)")
    pytest.skip(reason)


@contextmanager
def local_postgres(database: str) -> Iterator[LocalPostgres]:
    """A server started in a temporary folder, with `database` created and its text-search extension."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        unavailable("PostgreSQL is not installed: no initdb on PATH or under /usr/lib/postgresql/*/bin")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_USER)
        except KeyError:
            unavailable(f"PostgreSQL refuses to run as root and there is no {OS_USER!r} user to run it as")
    try:
        import psycopg
    except ImportError:
        unavailable("psycopg is not installed (pip install 'psycopg[binary]')")
    with LocalPostgres(bin_dir) as server:
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {database}")
        with psycopg.connect(server.url(database), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_trgm SCHEMA public")
        yield server
