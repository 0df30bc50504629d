"""The Parquet archive: whatever is written reads back equal, locally and on S3, partitioned by day."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import boto3
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from sessionrl.errors import NotFound
from sessionrl.session import Feedback, FeedbackAdded, FeedbackType, Session, SessionState, apply, fold
from sessionrl.session.codec import digest
from sessionrl.store import SessionStore
from sessionrl.store.archive import Archive, archive_event, archive_finished
from sessionrl.store.synthetic import CHRONIC_COMMENTS, generate, ingest


@pytest.fixture(scope="module")
def sessions() -> list[Session]:
    return [fold(events) for events in generate(120, seed=5)]


@pytest.fixture(scope="module")
def s3_options() -> Iterator[dict[str, Any]]:
    """A real S3 endpoint on loopback (moto's server on an ephemeral port) with a bucket `archive`."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-east-1"}
    boto3.client("s3", endpoint_url=endpoint, **creds).create_bucket(Bucket="archive")
    yield {
        "key": "test",
        "secret": "test",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    server.stop()


def _by_id(items: list[Session]) -> dict[str, Session]:
    return {s.session_id: s for s in items}


def test_local_round_trip_reads_back_equal(tmp_path: Path, sessions: list[Session]) -> None:
    archive = Archive(str(tmp_path / "archive"))
    archive.write(sessions)
    for s in sessions[:10]:
        assert archive.read(s.session_id) == s
    assert _by_id(list(archive.iter_sessions())) == _by_id(sessions)


def test_file_url_and_plain_path_name_the_same_archive(tmp_path: Path, sessions: list[Session]) -> None:
    Archive(f"file://{tmp_path}/a").write(sessions[:3])
    assert Archive(str(tmp_path / "a")).read(sessions[0].session_id) == sessions[0]


def test_s3_round_trip_through_a_real_endpoint(s3_options: dict[str, Any], sessions: list[Session]) -> None:
    archive = Archive("s3://archive/sessions", storage_options=s3_options)
    paths = archive.write(sessions[:30])
    assert all(p.startswith("s3://archive/sessions/date=") for p in paths)
    assert archive.read(sessions[7].session_id) == sessions[7]
    assert _by_id(list(archive.iter_sessions())) == _by_id(sessions[:30])
    rows = archive.duckdb_sql("SELECT count(*) AS n FROM sessions")
    assert rows == [{"n": 30}]


def test_files_are_partitioned_by_creation_day(tmp_path: Path, sessions: list[Session]) -> None:
    archive = Archive(str(tmp_path))
    paths = archive.write(sessions)
    assert len(paths) == len({s.created_at.astimezone(UTC).date() for s in sessions})  # one file per day
    folder_of: dict[str, str] = {}
    for path in archive.files():
        folder = Path(path).parent.name
        table = pq.read_table(path, columns=["session_id", "date"])
        assert [f"date={d}" for d in table.column("date").to_pylist()] == [folder] * table.num_rows
        folder_of |= dict.fromkeys(table.column("session_id").to_pylist(), folder)
    assert folder_of == {s.session_id: f"date={s.created_at.astimezone(UTC).date()}" for s in sessions}


def test_digests_match_the_canonical_digest(tmp_path: Path, sessions: list[Session]) -> None:
    archive = Archive(str(tmp_path))
    archive.write(sessions)
    assert archive.digests() == {s.session_id: digest(s) for s in sessions}


def test_the_latest_view_of_a_session_wins(tmp_path: Path, sessions: list[Session]) -> None:
    archive = Archive(str(tmp_path))
    old = next(s for s in sessions if s.state == "finished")
    late = Feedback(
        type=FeedbackType.COMMENT, comment="late note", occurred_at=old.updated_at + timedelta(days=2)
    )
    new = apply(old, FeedbackAdded(feedback=late, at=old.updated_at + timedelta(days=3)))
    archive.write([old])
    archive.write([new])
    archive.write([old])  # a retried write of an older view does not roll the archive back
    assert archive.read(old.session_id) == new
    assert archive.digests() == {old.session_id: digest(new)}
    assert archive.duckdb_sql("SELECT count(*) AS n FROM session_rows") == [{"n": 3}]


def test_empty_archive_answers_empty(tmp_path: Path) -> None:
    archive = Archive(str(tmp_path / "nothing-yet"))
    assert archive.digests() == {}
    assert list(archive.iter_sessions()) == []
    assert archive.duckdb_sql("SELECT count(*) AS n FROM sessions") == [{"n": 0}]
    with pytest.raises(NotFound):
        archive.read("s-missing")


def test_duckdb_answers_the_chronic_disease_question(tmp_path: Path, sessions: list[Session]) -> None:
    archive = Archive(str(tmp_path))
    archive.write(sessions)
    rows = archive.duckdb_sql(
        """
        SELECT count(*) AS n, sum(list_contains(tools, 'crp_test_request')::INT) AS called
        FROM sessions WHERE feedback_text ILIKE '%chronic disease%' OR feedback_text LIKE '%慢性病%'
        """
    )
    chronic = [s for s in sessions if any(f.comment in CHRONIC_COMMENTS for f in s.feedback)]
    called = [s for s in chronic if any(c.tool == "crp_test_request" for c in s.tool_calls)]
    assert chronic
    assert rows == [{"n": len(chronic), "called": len(called)}]


def test_flattened_columns_summarise_the_session(tmp_path: Path, sessions: list[Session]) -> None:
    archive = Archive(str(tmp_path))
    s = next(s for s in sessions if any(c.status != "success" for c in s.tool_calls) and s.feedback)
    archive.write([s])
    (row,) = archive.duckdb_sql("SELECT tools, failed_tools, n_tool_calls, rating, state FROM sessions")
    assert row["tools"] == [c.tool for c in s.tool_calls]
    assert row["failed_tools"] == [c.tool for c in s.tool_calls if c.status != "success"]
    assert row["n_tool_calls"] == len(s.tool_calls)
    ratings = [f.score for f in s.feedback if f.type is FeedbackType.HUMAN_RATING]
    assert row["rating"] == (ratings[0] if ratings else None)
    assert row["state"] == s.state.value


@pytest.fixture
def filled(store: SessionStore) -> SessionStore:
    """A store (on each backend) holding 40 generated sessions (finished, rejected and still executing)."""
    ingest(store, 40, seed=9)
    return store


def test_archive_finished_moves_done_sessions_and_matches_the_store(
    tmp_path: Path, filled: SessionStore
) -> None:
    archive = Archive(str(tmp_path))
    done = set(filled.session_ids(SessionState.FINISHED)) | set(filled.session_ids(SessionState.REJECTED))
    running = set(filled.session_ids(SessionState.EXECUTING))
    assert done
    assert running
    assert archive_finished(filled, archive, batch=7) == len(done)
    assert set(filled.session_ids(SessionState.ARCHIVED)) == done
    assert set(filled.session_ids(SessionState.EXECUTING)) == running
    assert archive.digests() == {sid: digest(filled.get(sid)) for sid in done}
    assert filled.consistency_check(archive=archive).clean
    files = archive.files()
    assert archive_finished(filled, archive) == 0  # nothing left to archive, nothing written
    assert archive.files() == files


def test_archive_finished_respects_before(tmp_path: Path, filled: SessionStore) -> None:
    finished = [filled.get(sid) for sid in filled.session_ids(SessionState.FINISHED)]
    cut = sorted(s.updated_at for s in finished)[len(finished) // 2]
    older = {s.session_id for s in finished if s.updated_at < cut}
    rejected_older = {
        sid for sid in filled.session_ids(SessionState.REJECTED) if filled.get(sid).updated_at < cut
    }
    assert archive_finished(filled, Archive(str(tmp_path)), before=cut) == len(older | rejected_older)
    assert set(filled.session_ids(SessionState.ARCHIVED)) == older | rejected_older


def test_a_retry_after_a_crash_between_parquet_and_store_converges(
    tmp_path: Path, filled: SessionStore
) -> None:
    archive = Archive(str(tmp_path))
    sid = filled.session_ids(SessionState.FINISHED)[0]
    archive.write([apply(filled.get(sid), archive_event(sid))])  # the crash: written, never appended
    archive_finished(filled, archive)
    assert filled.get(sid).state is SessionState.ARCHIVED
    assert archive.digests()[sid] == digest(filled.get(sid))
    assert filled.consistency_check(archive=archive).clean


def test_late_feedback_after_archiving_shows_as_archive_drift(tmp_path: Path, filled: SessionStore) -> None:
    archive = Archive(str(tmp_path))
    archive_finished(filled, archive)
    sid = filled.session_ids(SessionState.ARCHIVED)[0]
    filled.append(sid, FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT, comment="follow-up")))
    report = filled.consistency_check(archive=archive)
    assert [(d.session_id, d.kind) for d in report.drift] == [(sid, "archive")]
