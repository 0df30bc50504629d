"""The consistency checker finds drift between the log and everything derived from it, and repairs it."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from store_support import RawDB

from sessionrl.session import SessionCreate, fold
from sessionrl.session.codec import digest
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import ingest


class FakeArchive:
    """Holds digests, as the Parquet archive does."""

    def __init__(self, digests: Mapping[str, str]) -> None:
        self._digests = dict(digests)

    def digests(self) -> Mapping[str, str]:
        return self._digests


@pytest.fixture
def traffic(file_store: SessionStore) -> SessionStore:
    """The file store holding 30 generated sessions, projected."""
    ingest(file_store, 30, seed=11)
    file_store.project()
    return file_store


def tamper(raw: RawDB, sql: str, *params: object) -> None:
    assert raw.run(sql, *params) > 0


def drift_of(store: SessionStore, **kw: object) -> set[tuple[str, str]]:
    return {(d.session_id, d.kind) for d in store.consistency_check(**kw).drift}  # type: ignore[arg-type]


def test_an_untouched_store_is_clean(traffic: SessionStore) -> None:
    report = traffic.consistency_check()
    assert report.clean
    assert report.sessions == 30
    assert report.repaired == ()


def test_a_tampered_shard_is_found_and_repaired_from_the_log(
    traffic: SessionStore, raw: RawDB, db_url: str
) -> None:
    victim = traffic.session_ids()[3]
    logged = fold(e.event for e in traffic.events(victim))
    tamper(
        raw,
        'UPDATE session_shard SET doc = replace(doc, \'"status":"success"\', \'"status":"error"\')'
        " WHERE session_id = ? AND shard = 'execution'",
        victim,
    )
    report = traffic.consistency_check()
    assert {(d.session_id, d.kind) for d in report.drift} == {(victim, "materialised")}
    assert "digest" in report.drift[0].detail
    repaired = traffic.consistency_check(repair=True)
    assert repaired.repaired == (victim,)
    assert traffic.consistency_check().clean
    with SessionStore.open(db_url) as fresh:  # no cache: reads the rebuilt rows
        assert fresh.get(victim) == logged


def test_tampered_or_missing_query_rows_are_found_and_repaired(traffic: SessionStore, raw: RawDB) -> None:
    a, b, c = traffic.session_ids()[:3]
    tamper(raw, "UPDATE tool_calls SET status = 'timeout' WHERE session_id = ?", a)
    tamper(raw, "DELETE FROM feedback WHERE session_id = ?", b)
    tamper(raw, "INSERT INTO session_tags VALUES (?, 'bogus')", c)
    report = traffic.consistency_check(repair=True)
    assert {(d.session_id, d.kind) for d in report.drift} == {(a, "query"), (b, "query"), (c, "query")}
    assert "tool_calls" in next(d.detail for d in report.drift if d.session_id == a)
    assert set(report.repaired) == {a, b, c}
    assert traffic.consistency_check().clean


def test_a_lost_materialised_session_is_rebuilt(traffic: SessionStore, raw: RawDB, db_url: str) -> None:
    victim = traffic.session_ids()[0]
    expected = traffic.get(victim)
    tamper(raw, "DELETE FROM session_head WHERE session_id = ?", victim)
    tamper(raw, "DELETE FROM session_shard WHERE session_id = ?", victim)
    assert drift_of(traffic) == {(victim, "materialised")}
    traffic.consistency_check(repair=True)
    with SessionStore.open(db_url) as fresh:
        assert fresh.get(victim) == expected


def test_a_session_without_a_log_is_removed_by_repair(traffic: SessionStore, raw: RawDB) -> None:
    victim = traffic.session_ids()[0]
    tamper(raw, "DELETE FROM events WHERE session_id = ?", victim)
    assert drift_of(traffic) == {(victim, "materialised"), (victim, "query")}
    traffic.consistency_check(repair=True)
    assert victim not in traffic.session_ids()
    assert traffic.sql("SELECT COUNT(*) AS n FROM sessions WHERE session_id = ?", (victim,)) == [{"n": 0}]
    assert traffic.consistency_check().clean


def test_a_gap_in_the_log_is_reported_but_not_repaired(traffic: SessionStore, raw: RawDB) -> None:
    victim = traffic.session_ids()[0]
    tamper(raw, "DELETE FROM events WHERE session_id = ? AND seq = 2", victim)
    report = traffic.consistency_check(repair=True)
    assert [(d.session_id, d.kind) for d in report.drift] == [(victim, "log")]
    assert "sequence" in report.drift[0].detail
    assert report.repaired == ()


def test_an_archive_is_compared_by_digest(traffic: SessionStore) -> None:
    good, bad = traffic.session_ids()[:2]
    archive = FakeArchive({good: digest(traffic.get(good)), bad: "0" * 64, "never-logged": "1" * 64})
    report = traffic.consistency_check(archive=archive, repair=True)
    assert {(d.session_id, d.kind) for d in report.drift} == {(bad, "archive"), ("never-logged", "archive")}
    assert report.repaired == ()  # the store does not rewrite the archive


def test_sessions_waiting_for_projection_are_not_drift_and_a_check_writes_nothing(
    file_store: SessionStore, raw: RawDB
) -> None:
    file_store.create(SessionCreate(user_query="q", session_id="fresh"))
    report = file_store.consistency_check()
    assert report.clean
    assert report.sessions == 1
    assert raw.rows("SELECT COUNT(*) FROM sessions") == [(0,)]
