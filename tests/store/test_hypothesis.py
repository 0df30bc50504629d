"""Properties: whatever valid events are written read back as their fold; v1 documents keep all content."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_support import FreshURL, RawDB

from sessionrl.session import (
    TRANSITIONS,
    Anchor,
    CallStatus,
    Event,
    Feedback,
    FeedbackAdded,
    FeedbackType,
    FinalOutput,
    LLMCall,
    LLMCallRecorded,
    OutputSet,
    Plan,
    PlanSet,
    Session,
    SessionCreate,
    SessionPatch,
    SessionPatched,
    StateChanged,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
    accepts,
    apply,
    created,
    fold,
)
from sessionrl.session.codec import digest
from sessionrl.store import SessionStore

TIMES = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC))
TEXT = st.text(max_size=30)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
CALL_IDS = st.sampled_from(["c1", "c2", "c3", "l1", "l2"])


def tool_call(draw: st.DrawFn) -> ToolCallRecorded:
    call = ToolCall(
        call_id=draw(CALL_IDS),
        tool=draw(st.sampled_from(["crp_test_request", "lab_parser", "sms.send"])),
        params=draw(st.dictionaries(TEXT, JSON, max_size=3)),
        output=draw(JSON),
        status=draw(st.sampled_from(CallStatus)),
        latency_ms=draw(st.floats(0, 1e6)),
        attempt=draw(st.integers(1, 5)),
        started_at=draw(TIMES),
    )
    return ToolCallRecorded(call=call, at=draw(TIMES))


def llm_call(draw: st.DrawFn) -> LLMCallRecorded:
    ids = draw(st.lists(st.integers(0, 50_000), max_size=5))
    logprobs = draw(st.lists(st.floats(-50, 0), min_size=len(ids), max_size=len(ids)))
    call = LLMCall(
        call_id=draw(CALL_IDS), response=draw(TEXT), token_ids=tuple(ids), logprobs=tuple(logprobs)
    )
    return LLMCallRecorded(call=call, at=draw(TIMES))


def feedback(draw: st.DrawFn, session: Session) -> FeedbackAdded:
    anchors = [Anchor()] + [Anchor(call_id=c) for c in sorted(session.call_ids())]
    if session.plan is not None:
        anchors += [Anchor(subgoal_id=g.id) for g in session.plan.subgoals]
    fb = Feedback(
        type=draw(st.sampled_from(FeedbackType)),
        score=draw(st.none() | st.floats(-5, 5)),
        comment=draw(st.none() | TEXT),
        anchor=draw(st.sampled_from(anchors)),
        occurred_at=draw(TIMES),
    )
    return FeedbackAdded(feedback=fb, at=draw(TIMES))


def plan_set(draw: st.DrawFn) -> PlanSet:
    n = draw(st.integers(0, 4))
    goals = tuple(SubGoal(id=f"g{i}", description=draw(TEXT), tool=draw(st.none() | TEXT)) for i in range(n))
    return PlanSet(plan=Plan(root_goal=draw(TEXT), subgoals=goals), at=draw(TIMES))


def next_event(draw: st.DrawFn, session: Session) -> Event | None:
    """A random event the session accepts now, or None if the drawn kind is not allowed."""
    kind = draw(st.sampled_from(["state", "tool", "llm", "feedback", "plan", "output", "patch"]))
    if kind == "state":
        targets = sorted(TRANSITIONS[session.state])
        return StateChanged(state=draw(st.sampled_from(targets)), at=draw(TIMES)) if targets else None
    if kind == "feedback":
        return feedback(draw, session)
    if kind == "patch":
        return SessionPatched(patch=SessionPatch(tags=draw(st.none() | st.tuples(TEXT))), at=draw(TIMES))
    builders: dict[str, Callable[[st.DrawFn], Event]] = {"tool": tool_call, "llm": llm_call, "plan": plan_set}
    event_type = {"tool": "tool_call", "llm": "llm_call", "plan": "plan_set", "output": "output_set"}[kind]
    if not accepts(session.state, event_type):
        return None
    if kind == "output":
        return OutputSet(output=FinalOutput(text=draw(TEXT)), at=draw(TIMES))
    return builders[kind](draw)


@st.composite
def sessions_events(draw: st.DrawFn) -> list[Event]:
    create = SessionCreate(
        user_query=draw(TEXT),
        session_id="s",
        scenario=draw(st.none() | TEXT),
        tags=draw(st.lists(TEXT, max_size=3).map(tuple)),
        metadata=draw(st.dictionaries(TEXT, JSON, max_size=3)),
    )
    events: list[Event] = [created(create)]
    session = apply(None, events[0])
    for _ in range(draw(st.integers(0, 24))):
        event = next_event(draw, session)
        if event is not None:
            events.append(event)
            session = apply(session, event)
    return events


def _dump(events: list[Any]) -> list[dict[str, Any]]:
    return [e.model_dump(mode="json") for e in events]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(events=sessions_events())
def test_any_valid_sequence_reads_back_as_its_fold(fresh_url: FreshURL, events: list[Event]) -> None:
    expected = fold(events)
    with fresh_url() as url:
        with SessionStore.open(url) as store:
            for event in events:
                store.append("s", event)
            assert digest(store.get("s")) == digest(expected)
        with SessionStore.open(url) as fresh:
            assert digest(fresh.get("s")) == digest(expected)
            assert _dump([e.event for e in fresh.events("s")]) == _dump(events)
            assert fold(e.event for e in fresh.events("s")) == fresh.get("s")
            assert fresh.consistency_check().clean


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(root=TEXT, subgoals=st.lists(TEXT, max_size=8))
def test_v1_documents_keep_every_description_in_order_and_the_root_goal(
    fresh_url: FreshURL,
    write_v1: Callable[[RawDB, str, str, list[str]], None],
    root: str,
    subgoals: list[str],
) -> None:
    """`write_v1` and `fresh_url` are plain functions (no state), so sharing them across examples is safe."""
    with fresh_url() as url, SessionStore.open(url) as store:
        write_v1(RawDB(url), "old", root, subgoals)
        plan = store.get("old").plan
        assert plan is not None
        assert plan.root_goal == root
        assert [g.description for g in plan.subgoals] == subgoals
        assert [g.id for g in plan.subgoals] == [f"g{i}" for i in range(1, len(subgoals) + 1)]
        logged = fold(e.event for e in store.events("old")).plan
        assert logged == plan
