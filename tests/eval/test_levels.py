"""Capability levels, the RL gate they make, the curriculum and auto-pause, on small hand-built sessions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sessionrl.envs import build
from sessionrl.envs.base import Split
from sessionrl.eval.autopause import REPORT, AutoPause, AutoPauseConfig
from sessionrl.eval.curriculum import Curriculum
from sessionrl.eval.levels import Level, LevelsConfig, assess, dag_faults
from sessionrl.eval.metrics import compute
from sessionrl.eval.report import levels_table
from sessionrl.session import (
    Feedback,
    FeedbackAdded,
    FeedbackType,
    Plan,
    PlanSet,
    Session,
    SessionCreate,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
    created,
    fold,
)

Call = tuple[str, dict[str, Any], str | None]  # tool, params, error code (None: success)


def session(
    query: str,
    calls: list[Call],
    solved: bool,
    *,
    entities: tuple[str, ...] = (),
    plan: Plan | None = None,
    rejected: str | None = None,
    pattern: bool | None = None,
    **metadata: Any,
) -> Session:
    meta = {"task_id": query, "expected_entities": list(entities), **metadata}
    events: list[Any] = [created(SessionCreate(user_query=query, metadata=meta))]
    if plan is not None:
        events.append(PlanSet(plan=plan))
    if rejected is not None:
        rejection = Feedback(type=FeedbackType.PLAN_REJECTION, data={"reason": rejected})
        events.append(FeedbackAdded(feedback=rejection))
    for i, (tool, params, code) in enumerate(calls):
        status = "success" if code is None else "error"
        call = ToolCall(call_id=f"c{i}", tool=tool, params=params, status=status, error_code=code)
        events.append(ToolCallRecorded(call=call))
    checks = {} if pattern is None else {"pattern": pattern}
    verdict = Feedback(type=FeedbackType.TASK_OUTCOME, score=float(solved), data={"checks": checks})
    events.append(FeedbackAdded(feedback=verdict))
    return fold(events)


def chain(n: int, *, cycle: bool = False) -> Plan:
    goals = [SubGoal(id=f"g{i}", description="d", depends_on=(f"g{i - 1}",) if i else ()) for i in range(n)]
    if cycle:
        goals[0] = SubGoal(id="g0", description="d", depends_on=(f"g{n - 1}",))
    return Plan(root_goal="r", subgoals=tuple(goals))


def test_l1_needs_the_rate_and_three_kinds_of_tool() -> None:
    ok = [session("q", [("a", {}, None), ("b", {}, None), ("c", {}, None)], True)]
    two_kinds = [session("q", [("a", {}, None), ("b", {}, None)], True)]
    one_error = [session("q", [("a", {}, None), ("b", {}, None), ("c", {}, "UNAVAILABLE")], True)]
    assert assess(ok)[Level.L1].passed is True
    assert assess(two_kinds)[Level.L1].passed is False  # 100% success but only two kinds
    result = assess(one_error)[Level.L1]
    assert result.value == pytest.approx(2 / 3)
    assert result.passed is False
    assert assess(one_error, LevelsConfig(l1_tcsr=0.6))[Level.L1].passed is True


def test_l2_counts_requests_whose_fields_reached_the_tools_without_misreads() -> None:
    sessions = [
        # order named and used: read right
        session("order O-1", [("get", {"order_id": "O-1"}, None)], True, entities=("O-1",)),
        # order named, tool called with another id that was not found: misread
        session("order O-2", [("get", {"order_id": "O-9"}, "ORDER_NOT_FOUND")], False, entities=("O-2",)),
        # request names nothing: not judged
        session("hello", [("get", {}, None)], True),
    ]
    result = assess(sessions)[Level.L2]
    assert (result.value, result.n, result.passed) == (0.5, 2, False)


def test_l3_judges_long_tasks_by_dag_and_pattern() -> None:
    sessions = [
        session("a", [], True, plan=chain(5), pattern=True),  # long, valid, pattern held
        session("b", [], True, plan=chain(5, cycle=True), pattern=True),  # a cycle: wrong
        session("c", [], False, plan=chain(6), pattern=False),  # the checker's pattern failed
        session("d", [], False, plan=chain(2), pattern=False),  # short: not judged
        session("e", [], False, rejected="missing_dependency"),  # no plan, no known length: not judged
    ]
    result = assess(sessions)[Level.L3]
    assert (result.value, result.n) == (pytest.approx(1 / 3), 3)
    # a plan-less session counts when its steps are known from elsewhere (the env's expert)
    steps = assess([session("f", [], True, pattern=True)], steps_of=lambda s: 7)[Level.L3]
    assert (steps.value, steps.n, steps.passed) == (1.0, 1, True)


def test_dag_faults_finds_missing_dependencies() -> None:
    plan = Plan(root_goal="r", subgoals=(SubGoal(id="a", description="", depends_on=("zz",)),))
    assert dag_faults(plan) == {"missing_dependency": ["a->zz"], "duplicate_id": [], "cycle": []}


def test_l4_is_forgetting_of_entities_the_request_does_not_name() -> None:
    remembered = ("O-7", "SF70001")  # an earlier turn's order and waybill; the follow-up names neither
    kept = session(
        "it is me again", [("trace", {"waybill": "SF70001", "order": "O-7"}, None)], True, entities=remembered
    )
    lost = session(
        "it is me again", [("trace", {"waybill": "?"}, "WAYBILL_NOT_FOUND")], False, entities=remembered
    )
    far = session("me again", [], False, entities=("O-8",), turn_gap=11)  # beyond the window: not counted
    assert assess([kept])[Level.L4].passed is True
    result = assess([kept, lost, far])[Level.L4]
    assert (result.value, result.n, result.passed) == (0.5, 4, False)
    assert assess([session("O-1", [], True, entities=("O-1",))])[Level.L4].passed is None


def test_l5_is_uplift_of_retries_with_reflection() -> None:
    retries = [
        session("a", [], True, retry_of="x1", reflected=True),
        session("b", [], True, retry_of="x2", reflected=True),
        session("a", [], False, retry_of="x1", reflected=False),
        session("b", [], True, retry_of="x2", reflected=False),
    ]
    result = assess(retries)[Level.L5]
    assert result.value == pytest.approx(0.5)
    assert result.passed is True
    assert assess(retries[:2])[Level.L5].passed is None  # nothing to pair against


def test_gate_and_reached_and_table() -> None:
    good = session(
        "order O-1", [("a", {"id": "O-1"}, None), ("b", {}, None), ("c", {}, None)], True, entities=("O-1",)
    )
    report = assess([good])
    assert report.passed([Level.L1, Level.L2])
    assert not report.passed([Level.L1, Level.L3])  # L3 unmeasured: a gate needs evidence
    assert report.reached is Level.L2
    console = Console(width=120, record=True)
    console.print(levels_table({"sft": report}))
    text = console.export_text()
    assert "L1 execution" in text
    assert "pass" in text
    assert json.loads(json.dumps(report.as_dict()))["reached"] == "L2"


def test_curriculum_promotes_by_level() -> None:
    env = build("orders", train=12, dev=1, test=1, time_factor=0)
    curriculum = Curriculum.of(env, env.tasks(Split.TRAIN))
    counts = curriculum.counts()
    assert counts["L2"] > 0
    assert counts["L3"] > 0
    # nothing reached: the easiest level present (L2; orders has no L1 task) is the pool
    first = curriculum.pool(None)
    assert len(first) == counts["L2"]
    good = session(
        "order O-1", [("a", {"id": "O-1"}, None), ("b", {}, None), ("c", {}, None)], True, entities=("O-1",)
    )
    promoted = curriculum.pool(assess([good]))  # L2 reached: L3 tasks join
    assert len(promoted) == counts["L2"] + counts["L3"]


def test_auto_pause_after_three_falls_writes_the_report(tmp_path: Path) -> None:
    valid = session("v", [("a", {}, None)], True, plan=chain(2))
    cyclic = session("x", [("a", {}, "TIMEOUT")], False, plan=chain(3, cycle=True), rejected="cycle")
    watch = AutoPause(AutoPauseConfig(metric="dvr", patience=3), tmp_path)
    # DVR 1.0, then 0.75, 0.5, 0.25: three falls in a row
    evaluations = [[valid] * 4, [valid] * 3 + [cyclic], [valid] * 2 + [cyclic] * 2, [valid] + [cyclic] * 3]
    paused = [watch.observe(f"e{i}", compute(s), s) for i, s in enumerate(evaluations)]
    assert paused == [False, False, False, True]
    report = json.loads((tmp_path / REPORT).read_text())
    assert [h["value"] for h in report["history"]] == [1.0, 0.75, 0.5, 0.25]
    assert report["tool_errors"] == {"TIMEOUT": 3}
    assert report["plan_faults"][0]["rejected"] == ["cycle"]
    assert report["plan_faults"][0]["cycle"] == ["g0", "g1", "g2"]


def test_auto_pause_resets_when_the_metric_recovers(tmp_path: Path) -> None:
    watch = AutoPause(AutoPauseConfig(metric="success", patience=2), tmp_path)
    wins, loss = session("w", [], True), session("l", [], False)
    for batch in ([wins], [wins, loss], [wins], [wins, loss], [wins, loss, loss]):
        watch.observe("e", compute(batch), batch)
    # 1, .5 (fall), 1 (recovers), .5 (fall), .33 (fall): paused at the last
    assert watch.paused
    assert (tmp_path / REPORT).is_file()
