"""Fixtures of the cluster tests: a local Ray cluster, and the store URL rollout workers share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessionrl.store.postgres_server import LocalPostgres, find_bin_dir


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster of 2 CPUs for the module's tests (one rollout worker per CPU)."""
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'sessionrl[cluster]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def shared_store_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A store the trainer and its workers share: a PostgreSQL database on a server started here, or
    (without PostgreSQL's programs) a SQLite file, which processes on one machine share too."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        yield f"sqlite:///{tmp_path_factory.mktemp('store') / 'sessions.db'}"
        return
    psycopg = pytest.importorskip(
        "psycopg", reason="psycopg is not installed (pip install 'psycopg[binary]')"
    )
    with LocalPostgres(bin_dir) as server:
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE cluster_tests")
        with psycopg.connect(server.url("cluster_tests"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_trgm")
        yield server.url("cluster_tests")
