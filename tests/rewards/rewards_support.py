"""Sessions built by hand for reward tests: every timestamp is counted in seconds from `T0`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sessionrl.session import (
    Anchor,
    CallStatus,
    Claim,
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
    SessionCreated,
    SessionState,
    StateChanged,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
    fold,
)

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=UTC)

ZH_COMMENT = "诊断正确，但未提及需排除慢性病贫血"
EN_COMMENT = "correct diagnosis, but did not mention excluding anemia of chronic disease"


def at(seconds: float) -> datetime:
    """T0 plus a number of seconds."""
    return T0 + timedelta(seconds=seconds)


def tool(
    call_id: str,
    name: str = "db_query",
    status: CallStatus = CallStatus.SUCCESS,
    *,
    latency_ms: float = 100.0,
    subgoal_id: str | None = None,
    start: float = 1.0,
) -> ToolCall:
    """A tool call starting `start` seconds after T0."""
    return ToolCall(
        call_id=call_id,
        subgoal_id=subgoal_id,
        tool=name,
        status=status,
        error_code=None if status is CallStatus.SUCCESS else status.value,
        latency_ms=latency_ms,
        started_at=at(start),
        finished_at=at(start + latency_ms / 1000.0),
    )


def feedback(
    kind: FeedbackType,
    score: float | None = None,
    comment: str | None = None,
    *,
    anchor: Anchor | None = None,
    occurred: float = 100.0,
    delay: float = 0.0,
    feedback_id: str | None = None,
) -> Feedback:
    """Feedback that happened `occurred` seconds after T0 and reached us `delay` seconds later."""
    return Feedback(
        feedback_id=feedback_id or f"f-{kind.value}-{occurred}",
        type=kind,
        score=score,
        comment=comment,
        anchor=anchor or Anchor(),
        occurred_at=at(occurred),
        received_at=at(occurred + delay),
    )


def events(
    tools: Sequence[ToolCall] = (),
    fb: Sequence[Feedback] = (),
    *,
    llm: Sequence[LLMCall] = (),
    plan: Plan | None = None,
    scenario: str | None = "demo",
    answer: bool = True,
    session_id: str = "s1",
) -> list[Event]:
    """The events of a finished session built from its parts."""
    create = SessionCreate(user_query="q", session_id=session_id, scenario=scenario)
    log: list[Event] = [SessionCreated(session_id=session_id, trace_id="ab" * 16, create=create, at=T0)]
    log.append(StateChanged(state=SessionState.EXECUTING, at=at(0.5)))
    if plan is not None:
        log.append(PlanSet(plan=plan, at=at(0.6)))
    log += [ToolCallRecorded(call=c, at=c.finished_at) for c in tools]
    log += [LLMCallRecorded(call=c, at=c.finished_at) for c in llm]
    if answer:
        log.append(OutputSet(output=FinalOutput(text="a", claims=(Claim(text="a", call_ids=()),)), at=at(50)))
    log.append(StateChanged(state=SessionState.FINISHED, at=at(60)))
    log += [FeedbackAdded(feedback=f, at=f.received_at) for f in fb]
    return log


def build(*args: Any, **kwargs: Any) -> Session:
    """Fold a finished session from its parts (the arguments of `events`)."""
    return fold(events(*args, **kwargs))


def plan_of(*goals: tuple[str, str | None]) -> Plan:
    """A plan whose sub-goals are (id, tool) pairs."""
    return Plan(root_goal="g", subgoals=tuple(SubGoal(id=g, description=g, tool=t) for g, t in goals))
