"""What a session page shows, worked out from the session: the plan DAG laid out in columns, the timeline
of its steps, the guards' verdicts and each piece of feedback's delay. Pure functions of a `Session`, so
the page templates only draw what these return.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sessionrl.session.model import (
    CallStatus,
    Feedback,
    FeedbackType,
    LLMCall,
    Plan,
    Session,
    SessionState,
    ToolCall,
)
from sessionrl.store.summary import judged_failed

GUARD_FEEDBACK = frozenset(
    {
        FeedbackType.PLAN_REJECTION,
        FeedbackType.HALLUCINATION_PENALTY,
        FeedbackType.PROVENANCE_FLAG,
        FeedbackType.SLA_BREACH,
    }
)
"""Feedback that a guard, not a person, gives: marked on the timeline where it lands."""

NODE_W, NODE_H, GAP_X, GAP_Y = 200, 60, 50, 16
CHAR_W = 7.2
"""Width of one character of the DAG's 12 px label font, generously: a label is cut to what fits its box."""

FINAL_STATES = frozenset({SessionState.FINISHED, SessionState.REJECTED, SessionState.ARCHIVED})


@dataclass(frozen=True, slots=True)
class Node:
    """One sub-goal placed on the DAG: its box's top-left corner, its status and the call that served it.
    `title` and `line` are the box's two text lines cut to fit it; `label` is the whole description."""

    id: str
    label: str
    tool: str | None
    x: int
    y: int
    status: str
    call_id: str | None
    title: str = ""
    line: str = ""


def fit(text: str, width: int = NODE_W - 16) -> str:
    """`text` cut (with an ellipsis) to what fits `width` pixels of the DAG's label font.

    >>> fit("lookup_order_status_for_customer", 100)
    'lookup_order…'
    """
    room = int(width // CHAR_W)
    return text if len(text) <= room else text[: max(1, room - 1)] + "…"


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


def goal_status(session: Session, goal_id: str) -> tuple[str, str | None]:
    """A sub-goal's status and the call that served it: its tool call; else the LLM call an import named
    for it (metadata `sub_goal_llm_calls`; `not recorded` when the record lacks that call); else
    `pending` while the session runs and `not run` once it has ended."""
    call = serving_call(session.tool_calls, goal_id)
    if call is not None:
        return call.status.value, call.call_id
    named = session.metadata.get("sub_goal_llm_calls")
    llm_id = named.get(goal_id) if isinstance(named, Mapping) else None
    if llm_id is not None:
        llm = next((c for c in session.llm_calls if c.call_id == llm_id), None)
        if llm is None:
            return "not recorded", None
        return judged(session).get(llm.call_id, llm.status.value), llm.call_id
    return ("not run" if session.state in FINAL_STATES else "pending"), None


def judged(session: Session) -> dict[str, str]:
    """LLM calls a verdict judged failed (a reply the action parser refused, say), with its code
    (`sessionrl.store.summary.judged_failed`: the list's failed-call count reads the same)."""
    return judged_failed({"feedback": [f.model_dump(mode="json") for f in session.feedback]})


def layout(session: Session) -> Dag:
    """The plan as columns of boxes by depth, each box coloured by the status of the call that served it
    (see `goal_status`), its text cut to fit (the whole of it in the box's tooltip)."""
    if session.plan is None or not session.plan.subgoals:
        return Dag((), (), 0, 0)
    column = depths(session.plan)
    rows: dict[int, int] = {}
    nodes: dict[str, Node] = {}
    for goal in session.plan.subgoals:
        col = column[goal.id]
        row = rows.get(col, 0)
        rows[col] = row + 1
        status, call_id = goal_status(session, goal.id)
        nodes[goal.id] = Node(
            id=goal.id,
            label=goal.description or goal.id,
            tool=goal.tool,
            x=10 + col * (NODE_W + GAP_X),
            y=10 + row * (NODE_H + GAP_Y),
            status=status,
            call_id=call_id,
            title=fit(f"{goal.id}: {goal.tool}" if goal.tool else goal.id),
            line=fit(goal.description or ""),
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
class Tick:
    """One piece of feedback on the timeline: where it arrived, as % of the steps' span (100 when it
    arrived after the last step ended, `after_ms` later)."""

    feedback_id: str
    label: str
    left: float
    after_ms: float


@dataclass(frozen=True, slots=True)
class Timeline:
    """Every plan, tool and LLM step in start order, the span they cover, and the feedback (guards'
    verdicts excepted: they are marks on their steps) by the time it arrived."""

    bars: tuple[Bar, ...]
    span_ms: float
    feedback: tuple[Tick, ...] = ()


def step_anchor(call_id: str) -> str:
    """The HTML id of a step on the session page (reward terms link to it)."""
    return f"step-{call_id}"


def timeline(session: Session, plan_at: datetime | None = None) -> Timeline:
    """The Gantt rows of a session: the plan (when `plan_at` is known), then every tool and LLM call,
    ordered by start, with retries, faults, refusals and the guards' verdicts about the call as marks.
    A bar is as long as the duration its label gives (`_latency`), so widths and labels agree."""
    verdicts = _verdicts_by_call(session.feedback)
    failed = judged(session)
    steps: list[tuple[datetime, Bar]] = []
    if plan_at is not None and session.plan is not None:
        steps.append(
            (plan_at, Bar("plan", "plan", f"plan: {session.plan.root_goal}", "success", 0.0, 0.0, 0.0))
        )
    for t in session.tool_calls:
        marks = _tool_marks(t) + verdicts.get(t.call_id, ())
        steps.append(
            (t.started_at, Bar(t.call_id, "tool", t.tool, t.status.value, _latency(t), 0.0, 0.0, marks))
        )
    for c in session.llm_calls:
        code = failed.get(c.call_id)
        marks = ((f"judged: {code}",) if code else ()) + verdicts.get(c.call_id, ())
        status = "error" if code else c.status.value
        steps.append(
            (c.started_at, Bar(c.call_id, "llm", f"llm {c.purpose}", status, _latency(c), 0.0, 0.0, marks))
        )
    if not steps:
        return Timeline((), 0.0, _ticks(session, None, 1.0))
    steps.sort(key=lambda s: s[0])
    t0 = steps[0][0]
    span = max(1.0, max(_ms(start - t0) + bar.latency_ms for start, bar in steps))
    bars = []
    for start, bar in steps:
        left = _ms(start - t0) / span * 100
        bars.append(dataclasses.replace(bar, left=left, width=max(0.4, bar.latency_ms / span * 100)))
    return Timeline(tuple(bars), span, _ticks(session, t0, span))


def _ticks(session: Session, t0: datetime | None, span: float) -> tuple[Tick, ...]:
    """The feedback (not the guards') at the time it arrived; what arrived after the steps, at the end."""
    ticks = []
    for f in sorted(session.feedback, key=lambda f: f.received_at):
        if f.type in GUARD_FEEDBACK:
            continue
        at = 0.0 if t0 is None else _ms(f.received_at - t0)
        score = "" if f.score is None else f" {f.score:g}"
        label = f"{f.type.value}{score}" + (f" by {f.annotator}" if f.annotator else "")
        ticks.append(Tick(f.feedback_id, label, min(100.0, max(0.0, at / span * 100)), max(0.0, at - span)))
    return tuple(ticks)


def later(ms: float) -> str:
    """A delay in words for the timeline: `+850 ms`, `+12.5 s`, `+3 min`, `+2 h 5 min`, `+4 d 3 h`.

    >>> [later(x) for x in (850, 12_500, 180_000, 7_500_000, 356_400_000)]
    ['+850 ms', '+12.5 s', '+3 min', '+2 h 5 min', '+4 d 3 h']
    """
    if ms < 1000:
        return f"+{ms:.0f} ms"
    if ms < 60_000:
        return f"+{ms / 1000:.1f} s"
    minutes = int(ms // 60_000)
    if minutes < 60:
        return f"+{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"+{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"+{days} d {hours} h"


def tokens(call: LLMCall) -> str:
    """What a call used, in words: the server's usage when it sent one (its total, else prompt plus
    completion), otherwise `tokens_used`; never a bare 0 beside a usage that says otherwise.

    >>> tokens(LLMCall(call_id="c", tokens_used=0, usage={"prompt_tokens": 40, "completion_tokens": 12}))
    '52 tokens (prompt 40, completion 12)'
    >>> tokens(LLMCall(call_id="c"))
    'tokens unknown'
    """
    usage = call.usage or {}
    parts = [(k.removesuffix("_tokens"), v) for k, v in usage.items() if k != "total_tokens"]
    total = usage.get("total_tokens") or sum(v for _, v in parts) or call.tokens_used
    if total is None:
        return "tokens unknown"
    detail = ", ".join(f"{k} {v}" for k, v in parts)
    return f"{total} tokens" + (f" ({detail})" if detail else "")


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
