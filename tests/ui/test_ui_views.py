"""The session page's layout worked out from a session: DAG columns, serving calls, timeline marks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackType,
    Plan,
    Session,
    SubGoal,
    ToolCall,
)
from sessionrl.ui import views

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def call(call_id: str, goal: str, status: CallStatus, start_ms: int, ms: int, attempt: int = 1) -> ToolCall:
    start = T0 + timedelta(milliseconds=start_ms)
    return ToolCall(
        call_id=call_id,
        subgoal_id=goal,
        tool=f"tool_{goal}",
        status=status,
        latency_ms=ms,
        attempt=attempt,
        started_at=start,
        finished_at=start + timedelta(milliseconds=ms),
    )


def session() -> Session:
    plan = Plan(
        root_goal="refund",
        subgoals=(
            SubGoal(id="a", description="find the order"),
            SubGoal(id="b", description="check the item", depends_on=("a",)),
            SubGoal(id="c", description="refund", depends_on=("a", "b")),
            SubGoal(id="d", description="tell the user"),
        ),
    )
    calls = (
        call("c1", "a", CallStatus.SUCCESS, 0, 100),
        call("c2", "b", CallStatus.TIMEOUT, 100, 300, attempt=3),
        call("c3", "b", CallStatus.SUCCESS, 400, 100),
        call("c4", "c", CallStatus.REFUSED, 500, 0),
    )
    breach = Feedback(type=FeedbackType.SLA_BREACH, anchor=Anchor(call_id="c2"))
    rejected = Feedback(type=FeedbackType.PLAN_REJECTION, comment="too long")
    return Session(
        session_id="s",
        trace_id="0" * 31 + "1",
        user_query="q",
        plan=plan,
        tool_calls=calls,
        feedback=(breach, rejected),
        created_at=T0,
        updated_at=T0,
    )


def test_the_dag_puts_each_subgoal_after_its_longest_chain_and_shows_the_call_that_served_it() -> None:
    dag = views.layout(session())
    nodes = {n.id: n for n in dag.nodes}
    assert views.depths(session().plan) == {"a": 0, "b": 1, "c": 2, "d": 0}  # type: ignore[arg-type]
    assert nodes["a"].x < nodes["b"].x < nodes["c"].x
    assert nodes["a"].x == nodes["d"].x
    assert nodes["a"].y != nodes["d"].y
    assert (nodes["b"].status, nodes["b"].call_id) == ("success", "c3")  # the success, not the timeout
    assert (nodes["c"].status, nodes["d"].status) == ("refused", "pending")
    assert {(e.start, e.end) for e in dag.edges} == {("a", "b"), ("a", "c"), ("b", "c")}
    assert all(dag.width >= n.x + views.NODE_W and dag.height >= n.y + views.NODE_H for n in dag.nodes)


def test_a_dependency_cycle_does_not_hang_the_layout() -> None:
    plan = Plan(
        root_goal="g",
        subgoals=(
            SubGoal(id="a", description="", depends_on=("b",)),
            SubGoal(id="b", description="", depends_on=("a",)),
        ),
    )
    assert set(views.depths(plan)) == {"a", "b"}


def test_the_timeline_places_each_step_and_marks_retries_faults_refusals_and_verdicts() -> None:
    line = views.timeline(session(), plan_at=T0)
    assert [b.anchor for b in line.bars] == ["plan", "c1", "c2", "c3", "c4"]
    assert line.span_ms == 500
    bars = {b.anchor: b for b in line.bars}
    assert (bars["c2"].left, bars["c2"].width) == (20.0, 60.0)
    assert bars["c2"].marks == ("2 retries", "fault: timeout", "sla_breach")
    assert bars["c4"].marks == ("refused: guard",)
    assert bars["c1"].marks == ()
    assert [f.type for f in views.session_verdicts(session())] == [FeedbackType.PLAN_REJECTION]


def test_feedback_delay_is_received_minus_occurred() -> None:
    late = Feedback(type=FeedbackType.COMMENT, occurred_at=T0, received_at=T0 + timedelta(minutes=2))
    assert views.delay_s(late) == 120.0
