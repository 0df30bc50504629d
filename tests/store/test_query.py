"""Typed queries and read-only SQL over the query tables, checked against the sessions themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from sessionrl.errors import InvalidQuery
from sessionrl.session import (
    CallStatus,
    Feedback,
    FeedbackAdded,
    FeedbackType,
    Session,
    SessionCreate,
    SessionState,
    created,
)
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.synthetic import ingest

CHRONIC = """
SELECT COUNT(*) AS whole,
       SUM(CASE WHEN EXISTS (SELECT 1 FROM tool_calls c WHERE c.session_id = s.session_id AND c.tool = ?)
           THEN 1 ELSE 0 END) AS part
FROM sessions s
WHERE EXISTS (SELECT 1 FROM feedback f WHERE f.session_id = s.session_id AND LOWER(f.comment) LIKE ?)
"""
"""The chronic-disease question written by hand, as a power user would, in SQL both backends speak
(`LOWER` folds ASCII case alone on both)."""


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def traffic(
    request: pytest.FixtureRequest, scratch_url: Callable[[str], AbstractContextManager[str]]
) -> Iterator[SessionStore]:
    """A store holding 400 generated sessions (clinic, customer service and finance traffic)."""
    with scratch_url(request.param) as url, SessionStore.open(url) as store:
        ingest(store, 400, seed=3)
        yield store


@pytest.fixture(scope="module")
def sessions(traffic: SessionStore) -> list[Session]:
    return list(traffic.iter_sessions())


def mentions(session: Session, text: str) -> bool:
    return any(text in (f.comment or "").lower() for f in session.feedback)


def called(session: Session, tool: str) -> bool:
    return any(c.tool == tool for c in session.tool_calls)


def test_the_chronic_disease_question_agrees_across_query_sql_and_the_sessions(
    traffic: SessionStore, sessions: list[Session]
) -> None:
    about = SessionQuery(comment_contains="chronic disease")
    crp = SessionQuery(tool_called="crp_test_request")
    whole = [s for s in sessions if mentions(s, "chronic disease")]
    part = [s for s in whole if called(s, "crp_test_request")]
    assert len(whole) > 0
    assert traffic.count(about) == len(whole)
    assert traffic.fraction(about, crp) == pytest.approx(len(part) / len(whole))
    [row] = traffic.sql(CHRONIC, ("crp_test_request", "%chronic disease%"))
    assert (row["whole"], row["part"]) == (len(whole), len(part))
    assert {r.session_id for r in traffic.query(about.model_copy(update={"limit": 1000}))} == {
        s.session_id for s in whole
    }


def _first(sessions: list[Session], pick: Callable[[Session], object]) -> object:
    return next(v for s in sessions if (v := pick(s)) is not None)


def test_every_filter_matches_what_the_sessions_say(traffic: SessionStore, sessions: list[Session]) -> None:
    scenario = _first(sessions, lambda s: s.scenario)
    user = _first(sessions, lambda s: s.user_id)
    tag = _first(sessions, lambda s: s.tags[-1] if s.tags else None)
    failed = _first(sessions, lambda s: next((c.tool for c in s.tool_calls if c.status != "success"), None))
    mid = sorted(s.created_at for s in sessions)[len(sessions) // 2]
    cases: list[tuple[dict[str, object], Callable[[Session], bool]]] = [
        ({"state": SessionState.FINISHED}, lambda s: s.state == SessionState.FINISHED),
        ({"scenario": scenario}, lambda s: s.scenario == scenario),
        ({"user_id": user}, lambda s: s.user_id == user),
        ({"tags": (tag,)}, lambda s: tag in s.tags),
        (
            {"tool_failed": failed},
            lambda s: any(c.tool == failed and c.status != "success" for c in s.tool_calls),
        ),
        (
            {"feedback_type": FeedbackType.HUMAN_RATING, "max_score": 2},
            lambda s: any(
                f.type == "human_rating" and f.score is not None and f.score <= 2 for f in s.feedback
            ),
        ),
        ({"min_score": 4.5}, lambda s: any(f.score is not None and f.score >= 4.5 for f in s.feedback)),
        ({"created_after": mid}, lambda s: s.created_at >= mid),
        (
            {"created_before": mid, "scenario": scenario},
            lambda s: s.created_at < mid and s.scenario == scenario,
        ),
    ]
    for filters, predicate in cases:
        expected = {s.session_id for s in sessions if predicate(s)}
        got = {r.session_id for r in traffic.query(SessionQuery(limit=1000, **filters))}
        assert got == expected, filters
        assert 0 < len(expected) < len(sessions), filters  # each case really filters


def test_rows_are_ordered_and_paged(traffic: SessionStore, sessions: list[Session]) -> None:
    newest = sorted(sessions, key=lambda s: (s.created_at, s.session_id), reverse=True)
    page = traffic.query(SessionQuery(descending=True, limit=5, offset=5))
    assert [r.session_id for r in page] == [s.session_id for s in newest[5:10]]
    by_id = traffic.query(SessionQuery(order_by="session_id", limit=3))
    assert [r.session_id for r in by_id] == sorted(s.session_id for s in sessions)[:3]


def test_a_row_summarises_its_session(traffic: SessionStore, sessions: list[Session]) -> None:
    session = sessions[7]
    [row] = [r for r in traffic.query(SessionQuery(limit=1000)) if r.session_id == session.session_id]
    assert (row.state, row.scenario, row.tags, row.user_id) == (
        session.state,
        session.scenario,
        session.tags,
        session.user_id,
    )
    assert (row.n_tool_calls, row.n_llm_calls, row.n_feedback) == (
        len(session.tool_calls),
        len(session.llm_calls),
        len(session.feedback),
    )
    assert (row.created_at, row.state_version) == (session.created_at, session.state_version)


def test_comment_search_treats_wildcards_literally(store: SessionStore) -> None:
    for sid, comment in (("a", "50% off was wrong"), ("b", "500 off")):
        store.create(SessionCreate(user_query="q", session_id=sid))
        store.append(sid, FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT, comment=comment)))
    assert [r.session_id for r in store.query(SessionQuery(comment_contains="50%"))] == ["a"]
    assert [r.session_id for r in store.query(SessionQuery(comment_contains="50% OFF"))] == ["a"]


def test_queries_see_every_acknowledged_write(store: SessionStore) -> None:
    store.create(SessionCreate(user_query="q", session_id="new", tags=("x",)))
    assert store.count(SessionQuery(tags=("x",))) == 1
    assert store.fraction(SessionQuery(tags=("nothing",)), SessionQuery()) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        {"min_score": 3, "max_score": 2},
        {"limit": 0},
        {"offset": -1},
        {"tool": "x"},
        {"state": "flying"},
    ],
)
def test_bad_queries_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SessionQuery.model_validate(bad)


# read-only SQL


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM sessions",
        "INSERT INTO sessions (session_id) VALUES ('x')",
        "UPDATE session_head SET state = 'finished'",
        "DROP TABLE events",
        "PRAGMA journal_mode=DELETE",
        "ATTACH DATABASE ':memory:' AS other",
        "WITH doomed AS (SELECT session_id FROM sessions) DELETE FROM sessions",
        "SELECT 1; DELETE FROM sessions",
        "/* looks harmless */ CREATE TABLE t (x)",
    ],
)
@pytest.mark.parametrize("fixture", ["running", "file_running"])
def test_sql_refuses_anything_that_writes(
    fixture: str, sql: str, store_backend: str, request: pytest.FixtureRequest
) -> None:
    store: SessionStore = request.getfixturevalue(fixture)
    before = store.sql("SELECT COUNT(*) AS n FROM sessions")
    with pytest.raises(InvalidQuery):
        store.sql(sql)
    assert store.sql("SELECT COUNT(*) AS n FROM sessions") == before == [{"n": 1}]
    assert store.append("s1", FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT))).state_version == 5


def test_sql_reads_with_parameters_and_ctes(running: SessionStore) -> None:
    rows = running.sql(
        "WITH calls AS (SELECT session_id, status FROM tool_calls WHERE status = :status)"
        " SELECT s.session_id, COUNT(*) AS n FROM sessions s JOIN calls USING (session_id) GROUP BY 1",
        {"status": CallStatus.SUCCESS.value},
    )
    assert rows == [{"session_id": "s1", "n": 1}]


def test_sql_errors_are_reported_as_invalid_sql(running: SessionStore) -> None:
    with pytest.raises(InvalidQuery) as err:
        running.sql("SELECT nope FROM sessions")
    assert "nope" in err.value.rule


def test_the_read_only_guard_does_not_outlive_the_call(store: SessionStore) -> None:
    with pytest.raises(InvalidQuery):
        store.sql("DELETE FROM sessions")
    store.create(SessionCreate(user_query="q", session_id="after"))
    assert store.count(SessionQuery()) == 1


def test_created_between_uses_time_order_not_text_order(store: SessionStore) -> None:
    # .5 s after midnight sorts before midnight itself as raw text ("00.5Z" < "00Z"); stored times do not
    midnight = datetime(2026, 1, 1, tzinfo=UTC)
    for sid, at in (("late", midnight.replace(microsecond=500000)), ("early", midnight)):
        store.append(
            sid, created(SessionCreate(user_query="q", session_id=sid)).model_copy(update={"at": at})
        )
    after = SessionQuery(created_after=midnight.replace(microsecond=100000))
    assert [r.session_id for r in store.query(after)] == ["late"]
