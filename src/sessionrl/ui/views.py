"""What a session page shows, worked out from the session: the plan DAG laid out in columns, the timeline
of its steps, the guards' verdicts and each piece of feedback's delay. Pure functions of a `Session`, so
the page templates only draw what these return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sessionrl.session.model import CallStatus, Feedback, FeedbackType, LLMCall, Plan, Session, ToolCall

GUARD_FEEDBACK = frozenset(
    {
        FeedbackType.PLAN_REJECTION,
        FeedbackType.HALLUCINATION_PENALTY,
        FeedbackType.PROVENANCE_FLAG,
        FeedbackType.SLA_BREACH,
    }
)
"""Feedback that a guard, not a person, gives: marked on the timeline where it lands."""

NODE_W, NODE_H, GAP_X, GAP_Y = 180, 46, 60, 18


@dataclass(frozen=True, slots=True)
class Node:
    """One sub-goal placed on the DAG: its box's top-left corner, its status and the call that served it."""

    id: str
    label: str
    tool: str | None
    x: int
    y: int
    status: str
    call_id: str | None


@dataclass(frozen=True, slots=True)
class Edge:
    """A dependency drawn from the right side of `start` to the left side of `end` (x1, y1, x2, y2)."""

    start: str
    end: str
    points: tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class Dag:
    """A laid-out plan: nodes, edges and the drawing's size."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


def depths(plan: Plan) -> dict[str, int]:
    """Each sub-goal's column: the length of its longest chain of dependencies (unknown ones ignored,
    cycles cut where they close).

    >>> from sessionrl.session.model import SubGoal
    >>> depths(Plan(root_goal="g", subgoals=(SubGoal(id="a", description=""),
    ...     SubGoal(id="b", description="", depends_on=("a",)))))
    {'a': 0, 'b': 1}
    """
    by_id = {g.id: g for g in plan.subgoals}
    memo: dict[str, int] = {}

    def depth(goal_id: str, seen: frozenset[str]) -> int:
        if goal_id not in memo:
            parents = [p for p in by_id[goal_id].depends_on if p in by_id and p not in seen]
            memo[goal_id] = 1 + max((depth(p, seen | {goal_id}) for p in parents), default=-1)
        return memo[goal_id]

    return {g.id: depth(g.id, frozenset()) for g in plan.subgoals}


def serving_call(calls: Sequence[ToolCall], subgoal_id: str) -> ToolCall | None:
    """The call that served a sub-goal: its last successful one, else its last one."""
    mine = [c for c in calls if c.subgoal_id == subgoal_id]
    done = [c for c in mine if c.status == CallStatus.SUCCESS]
    chosen = done or mine
    return chosen[-1] if chosen else None


def layout(session: Session) -> Dag:
    """The plan as columns of boxes by depth, each box coloured by the status of the call that served it
    (`pending` when none did)."""
    if session.plan is None or not session.plan.subgoals:
        return Dag((), (), 0, 0)
    column = depths(session.plan)
    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for goal in session.plan.subgoals:
        col = column[goal.id]
        row = rows.get(col, 0)
        rows[col] = row + 1
        call = serving_call(session.tool_calls, goal.id)
        nodes[goal.id] = Node(
            id=goal.id,
            label=goal.description or goal.id,
            tool=goal.tool,
            x=10 + col * (NODE_W + GAP_X),
            y=10 + row * (NODE_H + GAP_Y),
            status=call.status.value if call is not None else "pending",
            call_id=call.call_id if call is not None else None,
        )
    edges = tuple(
        Edge(parent, goal.id, _edge_points(nodes[parent], nodes[goal.id]))
        for goal in session.plan.subgoals
        for parent in goal.depends_on
        if parent in nodes
    )
    width = 20 + (max(column.values()) + 1) * (NODE_W + GAP_X) - GAP_X
    height = 20 + max(rows.values()) * (NODE_H + GAP_Y) - GAP_Y
    return Dag(tuple(nodes.values()), edges, width, height)


def _edge_points(a: Node, b: Node) -> tuple[int, int, int, int]:
    return (a.x + NODE_W, a.y + NODE_H // 2, b.x, b.y + NODE_H // 2)


@dataclass(frozen=True, slots=True)
class Bar:
    """One step on the timeline: where it starts and how long it ran, both as % of the session's span."""

    anchor: str
    kind: str
    label: str
    status: str
    latency_ms: float
    left: float
    width: float
    marks: tuple[str, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every plan, tool and LLM step in start order, and the span they cover."""

    bars: tuple[Bar, ...]
    span_ms: float


def step_anchor(call_id: str) -> str:
    """The HTML id of a step on the session page (reward terms link to it)."""
    return f"step-{call_id}"


def timeline(session: Session, plan_at: datetime | None = None) -> Timeline:
    """The Gantt rows of a session: the plan (when `plan_at` is known), then every tool and LLM call,
    ordered by start, with retries, faults, refusals and the guards' verdicts about the call as marks."""
    verdicts = _verdicts_by_call(session.feedback)
    steps: list[tuple[datetime, datetime, Bar]] = []
    if plan_at is not None and session.plan is not None:
        plan = Bar("plan", "plan", f"plan: {session.plan.root_goal}", "success", 0.0, 0.0, 0.0)
        steps.append((plan_at, plan_at, plan))
    for t in session.tool_calls:
        marks = _tool_marks(t) + verdicts.get(t.call_id, ())
        bar = Bar(t.call_id, "tool", t.tool, t.status.value, _latency(t), 0.0, 0.0, marks)
        steps.append((t.started_at, t.finished_at, bar))
    for c in session.llm_calls:
        marks = verdicts.get(c.call_id, ())
        bar = Bar(c.call_id, "llm", f"llm {c.purpose}", c.status.value, _latency(c), 0.0, 0.0, marks)
        steps.append((c.started_at, c.finished_at, bar))
    if not steps:
        return Timeline((), 0.0)
    steps.sort(key=lambda s: s[0])
    t0 = steps[0][0]
    span = max(1.0, max(_ms(end - t0) for _, end, _ in steps))
    bars = []
    for start, end, bar in steps:
        left = _ms(start - t0) / span * 100
        width = min(max(0.4, _ms(end - start) / span * 100), 100 - left)
        bars.append(dataclasses.replace(bar, left=left, width=width))
    return Timeline(tuple(bars), span)


def _ms(delta: timedelta) -> float:
    return delta.total_seconds() * 1000


def _latency(call: ToolCall | LLMCall) -> float:
    """The call's reported latency, else the time between its start and end."""
    return call.latency_ms or _ms(call.finished_at - call.started_at)


def _tool_marks(call: ToolCall) -> tuple[str, ...]:
    marks = []
    if call.attempt > 1:
        marks.append(f"{call.attempt - 1} retr{'y' if call.attempt == 2 else 'ies'}")
    if call.status == CallStatus.REFUSED:
        marks.append(f"refused: {call.error_code or 'guard'}")
    elif call.status != CallStatus.SUCCESS:
        marks.append(f"fault: {call.error_code or call.status.value}")
    return tuple(marks)


def _verdicts_by_call(feedback: Sequence[Feedback]) -> Mapping[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for f in feedback:
        if f.type in GUARD_FEEDBACK and f.anchor.call_id is not None:
            out[f.anchor.call_id] = (*out.get(f.anchor.call_id, ()), f.type.value)
    return out


def session_verdicts(session: Session) -> list[Feedback]:
    """The guards' verdicts that are not about one call (plan rejections, say): shown above the timeline."""
    return [f for f in session.feedback if f.type in GUARD_FEEDBACK and f.anchor.call_id is None]


def delay_s(feedback: Feedback) -> float:
    """How long the feedback took to reach us: received − occurred, in seconds."""
    return (feedback.received_at - feedback.occurred_at).total_seconds()
