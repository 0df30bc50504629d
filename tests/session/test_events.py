"""The fold: events in, read view out; the lifecycle and feedback rules it enforces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sessionrl.errors import InvalidEvent, InvalidTransition
from sessionrl.session import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackAdded,
    FeedbackType,
    Plan,
    PlanSet,
    SessionCreate,
    SessionState,
    StateChanged,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
    apply,
    created,
    fold,
    parse_event,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def base_events() -> list:
    plan = Plan(
        root_goal="triage", subgoals=(SubGoal(id="g1", description="parse", tool="lab_result_parser"),)
    )
    return [
        created(SessionCreate(user_query="Hb 9.1, MCV 72", scenario="clinic")),
        PlanSet(plan=plan),
        StateChanged(state=SessionState.EXECUTING),
        ToolCallRecorded(
            call=ToolCall(call_id="c1", subgoal_id="g1", tool="lab_result_parser", status="success")
        ),
    ]


def rating(
    score: float, occurred: datetime, anchor: Anchor | None = None, annotator: str | None = None
) -> FeedbackAdded:
    fb = Feedback(
        type=FeedbackType.HUMAN_RATING,
        score=score,
        occurred_at=occurred,
        anchor=anchor or Anchor(),
        annotator=annotator,
    )
    return FeedbackAdded(feedback=fb)


def test_fold_bumps_each_shard_and_the_global_version() -> None:
    session = fold([*base_events(), rating(4, T0)])
    # created=1, plan_set, state_changed, tool_call, feedback -> 5 events in all
    assert session.state_version == 5
    assert (session.versions.plan, session.versions.execution, session.versions.feedback) == (1, 2, 1)
    assert session.state is SessionState.EXECUTING
    assert session.tool_calls[0].status is CallStatus.SUCCESS


def test_apply_does_not_change_its_input() -> None:
    session = fold(base_events())
    after = apply(session, StateChanged(state=SessionState.FINISHED))
    assert session.state is SessionState.EXECUTING
    assert after.state is SessionState.FINISHED


def test_bad_transition_names_state_and_allowed_targets() -> None:
    finished = apply(fold(base_events()), StateChanged(state=SessionState.FINISHED))
    with pytest.raises(InvalidTransition, match=r"not allowed in state 'finished'.*archived"):
        apply(finished, StateChanged(state=SessionState.EXECUTING))
    with pytest.raises(InvalidTransition, match="tool_call"):
        apply(finished, ToolCallRecorded(call=ToolCall(call_id="c2", tool="x", status="success")))


def test_feedback_accepted_in_every_state_after_creation() -> None:
    session = fold(base_events())
    for minute, state in enumerate((SessionState.FINISHED, SessionState.ARCHIVED)):
        session = apply(session, StateChanged(state=state))
        session = apply(session, rating(2 + minute, T0 + timedelta(minutes=minute)))
    assert session.state is SessionState.ARCHIVED
    assert session.versions.feedback == 2
    # same type, same anchor: one survives, the one that happened later
    assert [f.score for f in session.feedback] == [3]


def test_last_writer_wins_by_occurrence_not_arrival() -> None:
    late_arrival_early_event = rating(2, T0)
    early_arrival_late_event = rating(5, T0 + timedelta(hours=2))
    session = fold([*base_events(), early_arrival_late_event, late_arrival_early_event])
    assert [f.score for f in session.feedback] == [5]
    # a different anchor is a different piece of feedback
    session = apply(session, rating(1, T0, Anchor(call_id="c1")))
    assert sorted(f.score or 0 for f in session.feedback) == [1, 5]


def test_ratings_from_different_sources_all_stay() -> None:
    later = T0 + timedelta(hours=2, minutes=30)
    session = fold(
        [*base_events(), rating(4, T0, annotator="doc_007"), rating(2, later, annotator="doc_012")]
    )
    assert [(f.annotator, f.score) for f in session.feedback] == [("doc_007", 4), ("doc_012", 2)]
    assert session.versions.feedback == 2


def test_a_source_replaces_only_its_own_earlier_item() -> None:
    events = [
        rating(4, T0, annotator="doc_007"),
        rating(2, T0 + timedelta(hours=1), annotator="doc_012"),
        rating(5, T0 + timedelta(hours=2), annotator="doc_007"),  # doc_007 changes their mind
        rating(1, T0 - timedelta(hours=1), annotator="doc_012"),  # an older opinion arriving late: ignored
    ]
    session = fold([*base_events(), *events])
    assert sorted((f.annotator, f.score) for f in session.feedback) == [("doc_007", 5), ("doc_012", 2)]
    # feedback naming no annotator is one source of its own
    session = apply(session, rating(3, T0))
    session = apply(session, rating(1, T0 + timedelta(minutes=1)))
    assert [f.score for f in session.feedback if f.annotator is None] == [1]
    assert {f.source for f in session.feedback} == {"doc_007", "doc_012", "anonymous"}


@pytest.mark.parametrize(
    ("anchor", "field"),
    [
        (Anchor(call_id="nope"), "feedback.anchor.call_id"),
        (Anchor(subgoal_id="g9"), "feedback.anchor.subgoal_id"),
    ],
)
def test_feedback_to_unknown_anchor_is_rejected(anchor: Anchor, field: str) -> None:
    with pytest.raises(InvalidEvent) as err:
        apply(fold(base_events()), rating(4, T0, anchor))
    assert err.value.field == field


def test_feedback_that_gives_no_time_is_not_late() -> None:
    # one reading of the clock: a reward discounted by received_at - occurred_at is not moved by the
    # microseconds between two readings (it made seeded RL runs differ run to run)
    now = Feedback(type=FeedbackType.AUTO_VALIDATION, score=1.0)
    assert now.received_at == now.occurred_at
    happened = datetime.now(UTC) - timedelta(hours=2)
    rated = Feedback(type=FeedbackType.HUMAN_RATING, score=4.0, occurred_at=happened)
    assert rated.occurred_at == happened
    assert rated.received_at - happened >= timedelta(hours=2)
    arrived = Feedback(type=FeedbackType.HUMAN_RATING, score=4.0, received_at=T0)
    assert arrived.occurred_at == arrived.received_at == T0
    assert Feedback.model_validate_json(rated.model_dump_json()) == rated


def test_anchor_names_at_most_one_target() -> None:
    with pytest.raises(ValueError, match="at most one"):
        Anchor(call_id="c1", subgoal_id="g1")


def test_events_need_a_created_session_first() -> None:
    with pytest.raises(InvalidEvent, match="create it first"):
        apply(None, StateChanged(state=SessionState.PLANNING))
    with pytest.raises(InvalidEvent, match="already exists"):
        apply(fold(base_events()), base_events()[0])


@pytest.mark.parametrize(
    ("raw", "field", "rule"),
    [
        (b"{not json", "body", "malformed JSON"),
        (b'{"type": "plan_set", "plan": {"root_goal": "x"}, "colour": 1}', "plan_set.colour", "Extra inputs"),
        (b'{"type": "plan_set", "plan": {"root_goal": 7}}', "plan_set.plan.root_goal", "valid string"),
        (b'{"type": "teleport"}', "event", "tag"),
    ],
)
def test_parse_event_names_field_and_rule(raw: bytes, field: str, rule: str) -> None:
    with pytest.raises(InvalidEvent) as err:
        parse_event(raw)
    assert err.value.field == field
    assert rule in err.value.rule


def test_logprobs_must_match_token_ids() -> None:
    from sessionrl.session import LLMCall

    with pytest.raises(ValueError, match="logprobs has 1 entries but token_ids has 2"):
        LLMCall(call_id="l1", token_ids=(1, 2), logprobs=(-0.1,))


def test_recording_a_call_id_again_moves_the_new_record_last_and_drops_the_old() -> None:
    from sessionrl.session import LLMCall, LLMCallRecorded

    def tool(call_id: str, status: str = "success") -> ToolCallRecorded:
        return ToolCallRecorded(call=ToolCall(call_id=call_id, tool="t", status=status))

    session = fold([*base_events(), tool("c2"), tool("c3"), tool("c1", "error")])
    assert [(c.call_id, c.status) for c in session.tool_calls] == [
        ("c2", CallStatus.SUCCESS),
        ("c3", CallStatus.SUCCESS),
        ("c1", CallStatus.ERROR),
    ]
    replies = [("l1", "a"), ("l2", "b"), ("l1", "c")]
    llm = [LLMCallRecorded(call=LLMCall(call_id=i, response=r)) for i, r in replies]
    session = fold([*base_events(), *llm])
    assert [(c.call_id, c.response) for c in session.llm_calls] == [("l2", "b"), ("l1", "c")]
