"""The guards as pure functions: plan breaker, tool-step refusals, finishing checks."""

from __future__ import annotations

import pytest

from sessionrl.orchestrator.guards import (
    PlanRejection,
    Refusal,
    check_plan,
    check_tool_step,
    missing_citations,
    unverified_subgoals,
)
from sessionrl.session import (
    CallStatus,
    Claim,
    FinalOutput,
    Plan,
    PlanSet,
    SessionCreate,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
    apply,
    created,
)
from sessionrl.session.model import Session

TOOLS = {"find", "refund", "notify", "ship"}


def goal(gid: str, tool: str | None = None, *deps: str) -> SubGoal:
    return SubGoal(id=gid, description=f"do {gid}", tool=tool, depends_on=deps)


def plan(*goals: SubGoal) -> Plan:
    return Plan(root_goal="help the user", subgoals=goals)


def test_a_valid_dag_passes() -> None:
    dag = plan(goal("a", "find"), goal("b", "refund", "a"), goal("c", "notify", "a", "b"), goal("d"))
    assert check_plan(dag, known_tools=TOOLS) is None


def test_more_sub_goals_than_the_limit_are_rejected() -> None:
    eleven = plan(*(goal(f"g{i}") for i in range(11)))
    problem = check_plan(eleven, known_tools=TOOLS)
    assert problem is not None
    assert problem.reason is PlanRejection.TOO_MANY_SUBGOALS
    assert "11 sub-goals exceed the limit of 10" in problem.detail
    assert check_plan(eleven, known_tools=TOOLS, max_subgoals=11) is None


def test_a_repeated_tool_is_rejected_naming_both_sub_goals() -> None:
    problem = check_plan(plan(goal("a", "find"), goal("b", "find")), known_tools=TOOLS)
    assert problem is not None
    assert problem.reason is PlanRejection.REPEATED_TOOL
    assert "'a'" in problem.detail
    assert "'b'" in problem.detail


def test_repeated_tools_pass_when_allowed_but_other_checks_still_hold() -> None:
    # a domain that reads two orders names one tool twice on purpose
    twice = plan(goal("a", "find"), goal("b", "find", "a"))
    assert check_plan(twice, known_tools=TOOLS, allow_repeated_tools=True) is None
    cyclic = plan(goal("a", "find", "b"), goal("b", "find", "a"))
    problem = check_plan(cyclic, known_tools=TOOLS, allow_repeated_tools=True)
    assert problem is not None
    assert problem.reason is PlanRejection.CYCLE


def test_an_unknown_tool_is_rejected() -> None:
    problem = check_plan(plan(goal("a", "teleport")), known_tools=TOOLS)
    assert problem is not None
    assert problem.reason is PlanRejection.UNKNOWN_TOOL
    assert "'teleport'" in problem.detail


def test_a_forbidden_tool_is_rejected_even_when_known() -> None:
    problem = check_plan(plan(goal("a", "refund")), known_tools=TOOLS, forbidden_tools={"refund"})
    assert problem is not None
    assert problem.reason is PlanRejection.FORBIDDEN_TOOL


def test_a_missing_dependency_is_rejected() -> None:
    problem = check_plan(plan(goal("a", "find", "ghost")), known_tools=TOOLS)
    assert problem is not None
    assert problem.reason is PlanRejection.MISSING_DEPENDENCY
    assert "'ghost'" in problem.detail


def test_duplicate_sub_goal_ids_are_rejected() -> None:
    problem = check_plan(plan(goal("a", "find"), goal("a", "refund")), known_tools=TOOLS)
    assert problem is not None
    assert problem.reason is PlanRejection.DUPLICATE_SUBGOAL


@pytest.mark.parametrize(
    ("goals", "loop"),
    [
        ((goal("a", None, "a"),), "a -> a"),
        ((goal("a", None, "b"), goal("b", None, "a")), "a -> b -> a"),
        (
            (goal("x"), goal("a", None, "c", "x"), goal("b", None, "a"), goal("c", None, "b")),
            "a -> c -> b -> a",
        ),
    ],
)
def test_a_cycle_is_rejected_and_spelled_out(goals: tuple[SubGoal, ...], loop: str) -> None:
    problem = check_plan(plan(*goals), known_tools=TOOLS)
    assert problem is not None
    assert problem.reason is PlanRejection.CYCLE
    assert problem.detail == f"dependency cycle {loop}"


def test_a_diamond_is_not_a_cycle() -> None:
    diamond = plan(goal("a"), goal("b", None, "a"), goal("c", None, "a"), goal("d", None, "b", "c"))
    assert check_plan(diamond, known_tools=TOOLS) is None


def session_with(dag: Plan, *calls: ToolCall) -> Session:
    session = apply(None, created(SessionCreate(user_query="q", session_id="s1")))
    session = apply(session, PlanSet(plan=dag))
    for call in calls:
        session = apply(session, ToolCallRecorded(call=call))
    return session


def call(cid: str, subgoal: str, status: CallStatus, tool: str = "find") -> ToolCall:
    return ToolCall(call_id=cid, subgoal_id=subgoal, tool=tool, status=status)


DAG = plan(goal("a", "find"), goal("b", "refund", "a"), goal("c", "notify"))


def test_a_step_waits_until_its_dependencies_succeeded() -> None:
    failed_first = session_with(DAG, call("c1", "a", CallStatus.ERROR))
    refusal = check_tool_step(failed_first, tool="refund", subgoal_id="b", masked=())
    assert refusal is not None
    assert refusal.reason is Refusal.UNMET_DEPENDENCIES
    assert "'a'" in refusal.detail
    succeeded = session_with(DAG, call("c1", "a", CallStatus.ERROR), call("c2", "a", CallStatus.SUCCESS))
    assert check_tool_step(succeeded, tool="refund", subgoal_id="b", masked=()) is None


def test_an_unknown_sub_goal_is_refused() -> None:
    refusal = check_tool_step(session_with(DAG), tool="find", subgoal_id="zz", masked=())
    assert refusal is not None
    assert refusal.reason is Refusal.UNKNOWN_SUBGOAL


def test_a_masked_skill_is_refused() -> None:
    refusal = check_tool_step(session_with(DAG), tool="notify", subgoal_id="c", masked={"notify"})
    assert refusal is not None
    assert refusal.reason is Refusal.MASKED_SKILL
    assert check_tool_step(session_with(DAG), tool="notify", subgoal_id=None, masked=()) is None


def test_unverified_sub_goals_are_those_without_an_executed_call() -> None:
    session = session_with(
        DAG, call("c1", "a", CallStatus.TIMEOUT), call("c2", "b", CallStatus.REFUSED, tool="refund")
    )
    # a was attempted (a timeout still executed); b was only refused; c was never called
    assert unverified_subgoals(session) == ("b", "c")


def test_citations_of_calls_the_session_lacks_are_listed_once_sorted() -> None:
    session = session_with(DAG, call("c1", "a", CallStatus.SUCCESS))
    output = FinalOutput(
        text="answer",
        claims=(Claim(text="x", call_ids=("c1", "zz")), Claim(text="y", call_ids=("aa", "zz"))),
    )
    assert missing_citations(session, output) == ("aa", "zz")
    assert missing_citations(session, FinalOutput(text="plain")) == ()
