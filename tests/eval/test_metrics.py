"""Agent metrics on small hand-built sessions whose expected values are worked out in the comments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from sessionrl.eval import compute, correction_uplift, metrics_table, task_success
from sessionrl.eval.metrics import dag_validity_rate, failure_attribution, pass_hat_k
from sessionrl.session import (
    Feedback,
    FeedbackAdded,
    FeedbackType,
    Plan,
    PlanSet,
    Session,
    SessionCreate,
    SessionState,
    StateChanged,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
    created,
    fold,
)

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def session(
    task: str,
    statuses: list[tuple[str, str | None]],
    solved: bool | None,
    *,
    rejection: str | None = None,
    entities: tuple[str, ...] = (),
    rating: float | None = None,
) -> Session:
    events: list = [
        created(SessionCreate(user_query=task, metadata={"task_id": task, "expected_entities": entities}))
    ]
    if rejection is None:
        events.append(PlanSet(plan=Plan(root_goal=task, subgoals=(SubGoal(id="g1", description="d"),))))
        events.append(StateChanged(state=SessionState.EXECUTING))
        for i, (status, code) in enumerate(statuses):
            call = ToolCall(
                call_id=f"c{i}", tool="t", params={"order_id": f"#W{i}"}, status=status, error_code=code
            )
            events.append(ToolCallRecorded(call=call))
    else:
        reason = {"reason": rejection}
        events.append(FeedbackAdded(feedback=Feedback(type=FeedbackType.PLAN_REJECTION, data=reason)))
    if solved is not None:
        events.append(FeedbackAdded(feedback=Feedback(type=FeedbackType.TASK_OUTCOME, score=float(solved))))
    if rating is not None:
        events.append(FeedbackAdded(feedback=Feedback(type=FeedbackType.HUMAN_RATING, score=rating)))
    return fold(events)


def test_pass_hat_k_by_hand() -> None:
    # 4 attempts, 2 solved: pass^1 = 2/4, pass^2 = C(2,2)/C(4,2) = 1/6, pass^3 = 0
    assert pass_hat_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_hat_k(4, 2, 3) == 0.0
    with pytest.raises(ValueError, match="k <= n"):
        pass_hat_k(1, 1, 2)


def test_latest_task_outcome_wins() -> None:
    s = session("a", [], None)
    late_fail = Feedback(type=FeedbackType.TASK_OUTCOME, score=0.0, occurred_at=T0 + timedelta(1))
    early_win = Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0, occurred_at=T0)
    s = fold([*_events_of(s), FeedbackAdded(feedback=late_fail), FeedbackAdded(feedback=early_win)])
    assert task_success(s) is False
    assert task_success(session("b", [], None)) is None


def _events_of(s: Session) -> list:
    return [created(SessionCreate(user_query=s.user_query, session_id=s.session_id, metadata=s.metadata))]


def test_compute_by_hand() -> None:
    sessions = [
        # task a, two attempts: one solved with 2 ok calls, one failed with a timeout and a bad-param call
        session("a", [("success", None), ("success", None)], True, entities=("#W0", "#W7")),
        session("a", [("timeout", "TIMEOUT"), ("error", "INVALID_PARAMS")], False),
        # task b: the plan had a cycle
        session("b", [], False, rejection="cycle"),
        session("b", [("success", None), ("refused", "DEPENDENCY_UNMET")], True),
    ]
    m = compute(sessions, ks=(1, 2))
    assert (m.n_sessions, m.n_tasks) == (4, 2)
    assert m.success == pytest.approx(2 / 4)
    # a: 1 of 2 solved -> pass^1 = .5, pass^2 = 0; b: same -> mean pass^1 = .5, pass^2 = 0
    assert m.pass_k == {1: pytest.approx(0.5), 2: 0.0}
    # 6 tool calls, 3 succeeded
    assert m.tcsr == pytest.approx(3 / 6)
    # 4 planned sessions (the rejected one included), 3 valid
    assert m.dvr == pytest.approx(3 / 4)
    # only the first session names entities: #W0 used, #W7 not -> 1/2
    assert m.er5 == pytest.approx(0.5)
    # steps: 2 + 2 + 0 + 2 tool calls over 4 sessions
    assert m.spt == pytest.approx(6 / 4)
    assert m.failures == {"bad_params": 1, "cycle": 1, "refused": 1, "timeout": 1}


def test_failure_attribution_separates_plan_reasons() -> None:
    counts = failure_attribution([session("x", [], False, rejection="missing_dependency")])
    assert counts == {"missing_dependency": 1}


def test_correction_uplift_only_counts_corrected_tasks() -> None:
    before = [session("a", [], False), session("b", [], True, rating=5.0), session("c", [], True, rating=2.0)]
    after = [session("a", [], True), session("b", [], False), session("c", [], True)]
    # corrected tasks: a (failed) and c (rating 2 < 4); before 1/2 solved, after 2/2 -> uplift 0.5
    assert correction_uplift(before, after) == pytest.approx(0.5)
    assert correction_uplift([session("b", [], True)], after) is None


def test_metrics_table_renders_every_column() -> None:
    m = compute([session("a", [("success", None)], True)])
    console = Console(width=120, record=True)
    console.print(metrics_table({"sft": m, "rl": m}))
    text = console.export_text()
    assert "task success" in text
    assert text.count("1.000") >= 4  # success and TCSR for both columns


def test_dvr_is_undefined_when_no_session_planned() -> None:
    unplanned = fold([created(SessionCreate(user_query="where is my parcel?", metadata={"task_id": "t"}))])
    assert unplanned.plan is None
    assert dag_validity_rate([unplanned]) is None
    assert compute([unplanned]).as_dict()["dvr"] is None
