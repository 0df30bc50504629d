"""The projector: outbox to query tables, idempotent per (session, seq), safe across crashes."""

from __future__ import annotations

from typing import Any

import pytest
from store_support import RawDB, start_session

from sessionrl.session import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackAdded,
    FeedbackType,
    SessionCreate,
    SessionState,
    StateChanged,
    ToolCall,
    ToolCallRecorded,
)
from sessionrl.store import SessionQuery, SessionStore, projector


def tables(store: SessionStore) -> dict[str, list[dict[str, Any]]]:
    """Every projected table, ordered, as plain rows."""
    return {t: store.sql(f"SELECT * FROM {t} ORDER BY 1, 2") for t in projector.COLUMNS}


def raw_count(raw: RawDB, sql: str) -> int:
    return int(raw.rows(sql)[0][0])


def test_projection_flattens_a_session_into_its_tables(running: SessionStore) -> None:
    fb = Feedback(type=FeedbackType.COMMENT, comment="Chronic disease ignored", anchor=Anchor(call_id="c1"))
    running.append("s1", FeedbackAdded(feedback=fb))
    # created, plan, executing, tool call, feedback: five outbox rows
    assert running.project() == 5
    [session] = running.sql("SELECT * FROM sessions")
    assert (session["session_id"], session["state"], session["state_version"]) == ("s1", "executing", 5)
    assert (session["n_subgoals"], session["n_tool_calls"], session["n_feedback"]) == (1, 1, 1)
    assert running.sql("SELECT tag FROM session_tags") == [{"tag": "lab"}]
    [call] = running.sql("SELECT call_id, tool, status, retryable FROM tool_calls")
    assert call == {"call_id": "c1", "tool": "lab_parser", "status": "success", "retryable": 0}
    [row] = running.sql("SELECT type, comment, anchor_call_id FROM feedback")
    assert row == {"type": "comment", "comment": "Chronic disease ignored", "anchor_call_id": "c1"}


def test_a_bounded_projection_consumes_at_most_its_rows_and_a_stale_query_reads_no_further(
    running: SessionStore,
) -> None:
    start_session(running, "s2")  # four outbox rows each, s1's first
    assert running.project(limit=3) == 3
    assert [r.session_id for r in running.query(SessionQuery(), fresh=False)] == ["s1"]
    assert running.project(limit=4) == 4
    assert {r.session_id for r in running.query(SessionQuery(), fresh=False)} == {"s1", "s2"}
    running.append("s2", StateChanged(state=SessionState.FINISHED))
    assert {r.state.value for r in running.query(SessionQuery(), fresh=False)} == {"executing"}
    assert {r.state.value for r in running.query(SessionQuery())} == {"executing", "finished"}  # drained
    assert running.project(limit=5) == 0


def test_projecting_twice_changes_nothing(running: SessionStore) -> None:
    running.project()
    first = tables(running)
    assert running.project() == 0
    assert tables(running) == first


def test_redelivered_outbox_rows_are_skipped_not_duplicated(file_running: SessionStore, raw: RawDB) -> None:
    file_running.project()
    first = tables(file_running)
    raw.run("UPDATE cursors SET position = 0 WHERE name = 'projector'")
    assert file_running.project() == 4  # consumed again, but every session is already at its seq
    assert tables(file_running) == first


def test_a_crash_between_commit_and_projection_loses_and_duplicates_nothing(db_url: str, raw: RawDB) -> None:
    store = SessionStore.open(db_url)
    for i in range(3):
        store.create(SessionCreate(user_query=f"q{i}", session_id=f"s{i}"))
    store.close()  # acknowledged and committed; the process "dies" before any projection
    assert raw_count(raw, "SELECT COUNT(*) FROM sessions") == 0
    with SessionStore.open(db_url) as reopened:
        assert reopened.project() == 3
        assert [r["session_id"] for r in reopened.sql("SELECT session_id FROM sessions ORDER BY 1")] == [
            "s0",
            "s1",
            "s2",
        ]
        assert reopened.consistency_check().clean


def test_a_projection_that_fails_midway_rolls_back_and_resumes(
    file_running: SessionStore, raw: RawDB, monkeypatch: pytest.MonkeyPatch
) -> None:
    file_running.create(SessionCreate(user_query="q", session_id="s2"))
    real = projector.flatten

    def failing(doc: dict[str, Any]) -> projector.Rows:
        if doc["session_id"] == "s2":
            raise RuntimeError("power cut")
        return real(doc)

    monkeypatch.setattr(projector, "flatten", failing)
    with pytest.raises(RuntimeError):
        file_running.project()
    # s1 was flattened before the failure, but the whole batch rolled back with the cursor
    assert raw_count(raw, "SELECT COUNT(*) FROM sessions") == 0
    assert raw_count(raw, "SELECT COUNT(*) FROM cursors") == 0
    monkeypatch.setattr(projector, "flatten", real)
    assert file_running.project() == 5
    assert [r["session_id"] for r in file_running.sql("SELECT session_id FROM sessions ORDER BY 1")] == [
        "s1",
        "s2",
    ]
    assert file_running.consistency_check().clean


def test_a_replaced_call_replaces_its_row(running: SessionStore) -> None:
    running.project()
    retry = ToolCall(call_id="c1", tool="lab_parser", status=CallStatus.TIMEOUT, attempt=2)
    running.append("s1", ToolCallRecorded(call=retry))
    assert running.sql("SELECT call_id, status, attempt FROM tool_calls") == [
        {"call_id": "c1", "status": "timeout", "attempt": 2}
    ]


def test_reward_announcements_are_consumed_without_projection(running: SessionStore) -> None:
    running.project()
    running.save_reward("s1", {"session": 1.0}, "rules-1")
    assert running.project() == 1
    assert running.sql("SELECT version FROM rewards") == [{"version": 1}]
