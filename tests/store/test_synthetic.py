"""The session generator: deterministic, valid under the real fold, and shaped like the brief says."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from sessionrl.session import CallStatus, FeedbackType, Session, SessionCreated, SessionState, fold
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import (
    CHRONIC_COMMENTS,
    SCENARIOS,
    TOOLS,
    batch_items,
    generate,
    ingest,
    session_events,
)

SEED = 11


@pytest.fixture(scope="module")
def sessions() -> list[Session]:
    return [fold(events) for events in generate(600, seed=SEED)]


def test_same_seed_and_index_give_the_same_events() -> None:
    assert session_events(SEED, 7) == session_events(SEED, 7)
    assert session_events(SEED, 7) != session_events(SEED + 1, 7)


def test_a_session_does_not_depend_on_where_the_batch_starts() -> None:
    assert list(generate(4, seed=SEED, start=3)) == [session_events(SEED, i) for i in range(3, 7)]


def test_event_ids_are_unique_across_sessions() -> None:
    ids = [e.event_id for events in generate(200, seed=SEED) for e in events]
    assert len(ids) == len(set(ids))


def test_sessions_have_the_promised_shape(sessions: list[Session]) -> None:
    for s in sessions:
        assert 3 <= len(s.tool_calls) <= 8, s.session_id
        assert 1 <= len(s.llm_calls) <= 4, s.session_id
        assert 0 <= len(s.feedback) <= 2, s.session_id
    assert {s.scenario for s in sessions} == set(SCENARIOS)
    states = Counter(s.state for s in sessions)
    assert states[SessionState.FINISHED] > 0.9 * len(sessions)
    assert states[SessionState.REJECTED] > 0
    assert states[SessionState.EXECUTING] > 0


def test_plans_calls_and_claims_refer_to_what_exists(sessions: list[Session]) -> None:
    for s in sessions:
        assert s.plan is not None
        seen: set[str] = set()
        for goal in s.plan.subgoals:
            assert set(goal.depends_on) <= seen, f"{s.session_id}: {goal.id} depends on a later goal"
            seen.add(goal.id)
        for call in s.tool_calls:
            goal = s.plan.subgoal(call.subgoal_id or "")
            assert goal is not None
            assert goal.tool == call.tool
        if s.final_output is not None:
            cited = {cid for claim in s.final_output.claims for cid in claim.call_ids}
            assert cited <= s.call_ids()
            tool_cited = cited - {c.call_id for c in s.llm_calls}
            assert tool_cited <= {c.call_id for c in s.tool_calls if c.status is CallStatus.SUCCESS}


def test_failures_follow_the_tool_profiles(sessions: list[Session]) -> None:
    calls = [c for s in sessions for c in s.tool_calls]
    for call in calls:
        if call.status is CallStatus.TIMEOUT:
            assert call.retryable
            assert call.latency_ms == TOOLS[call.tool].timeout_ms
        elif call.status is CallStatus.ERROR:
            assert call.error_code == "invalid_params"
            assert not call.retryable
    # Each call fails with probability p = p_timeout + p_bad_params; the observed rate over all calls of a
    # tool stays within 4 binomial standard deviations sqrt(p(1-p)/n) of the expected mixture.
    for tool in ("crp_test_request", "lab_result_parser", "order.lookup"):
        mine = [c for c in calls if c.tool == tool]
        p = TOOLS[tool].p_timeout + TOOLS[tool].p_bad_params
        observed = sum(c.status is not CallStatus.SUCCESS for c in mine) / len(mine)
        assert abs(observed - p) < 4 * math.sqrt(p * (1 - p) / len(mine)) + 0.02, (tool, observed, p)


def test_feedback_is_late_rated_one_to_five_and_bilingual(sessions: list[Session]) -> None:
    ratings = [f for s in sessions for f in s.feedback if f.type is FeedbackType.HUMAN_RATING]
    assert {f.score for f in ratings} <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert len({f.score for f in ratings}) >= 4
    for s in sessions:
        for f in s.feedback:
            assert f.received_at >= f.occurred_at >= s.created_at
    comments = {f.comment for f in ratings if f.comment}
    assert any("chronic disease" in c for c in comments)
    assert any("慢性病" in c for c in comments)
    chronic = [s for s in sessions if any(f.comment in CHRONIC_COMMENTS for f in s.feedback)]
    assert chronic
    assert all(s.scenario == "clinical_triage" for s in chronic)


def test_batch_items_name_the_session_of_every_event() -> None:
    events = session_events(SEED, 0)
    items = batch_items(events)
    first = events[0]
    assert isinstance(first, SessionCreated)
    assert [sid for sid, _, _ in items] == [first.session_id] * len(events)
    assert [e for _, e, _ in items] == events
    with pytest.raises(ValueError, match="starts with"):
        batch_items(events[1:])


def test_ingest_stores_exactly_the_generated_sessions(store: SessionStore) -> None:
    appended = ingest(store, 25, seed=SEED, batch_sessions=10)
    expected = [fold(events) for events in generate(25, seed=SEED)]
    assert appended == sum(len(events) for events in generate(25, seed=SEED))
    assert [store.get(s.session_id) for s in expected] == expected
    ingest(store, 25, seed=SEED, batch_sessions=7)  # same event ids: stored once
    assert store.sql("SELECT count(*) AS n FROM events") == [{"n": appended}]
