"""Guards: small pure checks the engine runs before it plans, executes or finishes.

Each guard looks at a plan or a session and answers with a reason (or nothing); the engine turns the answer
into events. Nothing here touches the store or the clock.

>>> from sessionrl.session.model import Plan, SubGoal
>>> plan = Plan(root_goal="refund", subgoals=(SubGoal(id="a", description="find order", tool="find"),
...     SubGoal(id="b", description="refund it", tool="refund", depends_on=("a",))))
>>> check_plan(plan, known_tools={"find", "refund"}) is None
True
>>> problem = check_plan(plan, known_tools={"find"})
>>> problem.reason.value, problem.detail
('unknown_tool', "sub-goal 'b' names unknown tool 'refund'")
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sessionrl.session.model import CallStatus, FinalOutput, Plan, Session

# the reasons are part of the wire (`StepResult` carries them), so they are defined in `sessionrl.wire`
from sessionrl.wire import PlanRejection as PlanRejection
from sessionrl.wire import Refusal as Refusal


@dataclass(frozen=True, slots=True)
class PlanProblem:
    """The first problem the plan breaker found: a reason code and a sentence naming the culprits."""

    reason: PlanRejection
    detail: str


@dataclass(frozen=True, slots=True)
class StepRefusal:
    """Why a tool step may not run, with a sentence naming the culprits."""

    reason: Refusal
    detail: str


def check_plan(
    plan: Plan,
    *,
    known_tools: Collection[str],
    forbidden_tools: Collection[str] = (),
    max_subgoals: int = 10,
    allow_repeated_tools: bool = False,
) -> PlanProblem | None:
    """The first problem of `plan`, checked in a fixed order (size, ids, tools, dependencies, cycles)."""
    if len(plan.subgoals) > max_subgoals:
        return PlanProblem(
            PlanRejection.TOO_MANY_SUBGOALS,
            f"{len(plan.subgoals)} sub-goals exceed the limit of {max_subgoals}",
        )
    return (
        _duplicate_ids(plan)
        or _tool_problem(plan, known_tools, forbidden_tools, allow_repeated_tools)
        or _missing_dependency(plan)
        or _cycle(plan)
    )


def _duplicate_ids(plan: Plan) -> PlanProblem | None:
    seen: set[str] = set()
    for goal in plan.subgoals:
        if goal.id in seen:
            return PlanProblem(PlanRejection.DUPLICATE_SUBGOAL, f"sub-goal id {goal.id!r} appears twice")
        seen.add(goal.id)
    return None


def _tool_problem(
    plan: Plan, known: Collection[str], forbidden: Collection[str], allow_repeated: bool
) -> PlanProblem | None:
    first_use: dict[str, str] = {}
    for goal in plan.subgoals:
        tool = goal.tool
        if tool is None:
            continue
        if tool in forbidden:
            return PlanProblem(
                PlanRejection.FORBIDDEN_TOOL, f"sub-goal {goal.id!r} names forbidden tool {tool!r}"
            )
        if tool not in known:
            return PlanProblem(
                PlanRejection.UNKNOWN_TOOL, f"sub-goal {goal.id!r} names unknown tool {tool!r}"
            )
        if tool in first_use and not allow_repeated:
            return PlanProblem(
                PlanRejection.REPEATED_TOOL,
                f"tool {tool!r} appears in sub-goals {first_use[tool]!r} and {goal.id!r}",
            )
        first_use[tool] = goal.id
    return None


def _missing_dependency(plan: Plan) -> PlanProblem | None:
    ids = {goal.id for goal in plan.subgoals}
    for goal in plan.subgoals:
        missing = [dep for dep in goal.depends_on if dep not in ids]
        if missing:
            return PlanProblem(
                PlanRejection.MISSING_DEPENDENCY,
                f"sub-goal {goal.id!r} depends on {', '.join(map(repr, missing))}, not in the plan",
            )
    return None


def _cycle(plan: Plan) -> PlanProblem | None:
    """A dependency cycle, found by depth-first search; the detail spells the loop (`a -> b -> a`)."""
    edges: Mapping[str, tuple[str, ...]] = {goal.id: goal.depends_on for goal in plan.subgoals}
    done: set[str] = set()
    for start in edges:
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, int]] = [(start, 0)]
        while stack:
            node, index = stack.pop()
            if index == 0:
                if node in on_path:
                    loop = [*path[path.index(node) :], node]
                    return PlanProblem(PlanRejection.CYCLE, "dependency cycle " + " -> ".join(loop))
                if node in done:
                    continue
                path.append(node)
                on_path.add(node)
            deps = edges.get(node, ())
            if index < len(deps):
                stack.append((node, index + 1))
                stack.append((deps[index], 0))
            else:
                done.add(node)
                on_path.discard(path.pop())
    return None


def succeeded_subgoals(session: Session) -> set[str]:
    """Sub-goals with at least one successful tool call."""
    return {c.subgoal_id for c in session.tool_calls if c.status == CallStatus.SUCCESS and c.subgoal_id}


def check_tool_step(
    session: Session, *, tool: str, subgoal_id: str | None, masked: Collection[str]
) -> StepRefusal | None:
    """Why a tool step may not run now: an unknown sub-goal, unmet dependencies, or a masked skill."""
    if subgoal_id is not None:
        goal = session.plan.subgoal(subgoal_id) if session.plan is not None else None
        if goal is None:
            return StepRefusal(Refusal.UNKNOWN_SUBGOAL, f"the plan has no sub-goal {subgoal_id!r}")
        done = succeeded_subgoals(session)
        unmet = [dep for dep in goal.depends_on if dep not in done]
        if unmet:
            return StepRefusal(
                Refusal.UNMET_DEPENDENCIES,
                f"sub-goal {subgoal_id!r} waits for {', '.join(map(repr, unmet))} to succeed",
            )
    if tool in masked:
        return StepRefusal(Refusal.MASKED_SKILL, f"skill {tool!r} is masked: its circuit breaker is open")
    return None


def unverified_subgoals(session: Session) -> tuple[str, ...]:
    """Sub-goals of the plan that no tool call executed (refused calls do not count), in plan order."""
    if session.plan is None:
        return ()
    executed = {c.subgoal_id for c in session.tool_calls if c.status != CallStatus.REFUSED}
    return tuple(goal.id for goal in session.plan.subgoals if goal.id not in executed)


def missing_citations(session: Session, output: FinalOutput) -> tuple[str, ...]:
    """Call ids cited by the output's claims that the session does not have, sorted, each once."""
    known = session.call_ids()
    return tuple(sorted({cid for claim in output.claims for cid in claim.call_ids if cid not in known}))
