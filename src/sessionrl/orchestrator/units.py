"""What each step writes: its events and records, built by pure functions on the session as it stands.

The engine decides what to run and asks the policy and the tools; these functions turn the answers
into the events of one unit (see `writer`), so the same request rebuilt on a fresher session after a
lost race writes the same ids.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.guards import (
    StepRefusal,
    check_plan,
    missing_citations,
    unverified_subgoals,
)
from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.orchestrator.results import StepIds
from sessionrl.session.events import (
    Event,
    FeedbackAdded,
    OutputSet,
    PlanSet,
    SessionPatched,
    StateChanged,
)
from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackType,
    FinalOutput,
    LLMCall,
    Message,
    Plan,
    Session,
    SessionPatch,
    SessionState,
    ToolCall,
)
from sessionrl.skills.skill import SkillResult

FINISHED_BY = "finished_by"
"""The session metadata key naming what ended it (`Orchestrator.finish`'s `reason`)."""


def enter(session: Session, state: SessionState, ids: StepIds) -> list[Event]:
    """A state change to `state`, unless the session is there already."""
    return [] if session.state == state else [StateChanged(state=state, event_id=ids.event("enter"))]


def plan_unit(
    session: Session,
    plan: Plan,
    ids: StepIds,
    *,
    by_policy: bool,
    known_tools: Collection[str],
    config: OrchestratorConfig,
) -> list[Event]:
    """Record the plan; then either start executing, or reject it with a `plan_rejection` feedback
    (anchored to the policy's call when the policy wrote the plan)."""
    problem = check_plan(
        plan,
        known_tools=known_tools,
        forbidden_tools=config.forbidden_tools,
        max_subgoals=config.max_subgoals,
        allow_repeated_tools=config.repeated_tools,
    )
    events: list[Event] = [PlanSet(plan=plan, event_id=ids.event("plan"))]
    if problem is None:
        return [*events, *enter(session, SessionState.EXECUTING, ids)]
    rejection = Feedback(
        feedback_id=ids.feedback(),
        type=FeedbackType.PLAN_REJECTION,
        comment=problem.detail,
        annotator="plan_breaker",
        anchor=Anchor(call_id=ids.llm) if by_policy else Anchor(),
        data={"reason": problem.reason.value, "detail": problem.detail},
    )
    return [
        *events,
        FeedbackAdded(feedback=rejection, event_id=ids.event("reject")),
        StateChanged(state=SessionState.REJECTED, reason=problem.reason, event_id=ids.event("state")),
    ]


def finish_unit(
    session: Session, output: FinalOutput, ids: StepIds, *, penalty: float, reason: str | None = None
) -> list[Event]:
    """The output, a penalty per unverified sub-goal, a flag for missing citations, then `finished`; with
    a `reason` (what ended the session), the session's metadata names it as `finished_by` too."""
    events: list[Event] = [OutputSet(output=output, event_id=ids.event("out"))]
    if reason is not None:
        named = SessionPatch(metadata={**session.metadata, FINISHED_BY: reason})
        events.append(SessionPatched(patch=named, event_id=ids.event("by")))
    for i, subgoal_id in enumerate(unverified_subgoals(session)):
        hallucination = Feedback(
            feedback_id=ids.feedback(f"h{i}"),
            type=FeedbackType.HALLUCINATION_PENALTY,
            score=penalty,
            comment=f"no tool call executed sub-goal {subgoal_id!r}",
            annotator="finish_guard",
            anchor=Anchor(subgoal_id=subgoal_id),
        )
        events.append(FeedbackAdded(feedback=hallucination, event_id=ids.event(f"h{i}")))
    missing = missing_citations(session, output)
    if missing:
        flag = Feedback(
            feedback_id=ids.feedback("p"),
            type=FeedbackType.PROVENANCE_FLAG,
            comment=f"the output cites calls the session does not have: {', '.join(missing)}",
            annotator="finish_guard",
            data={"missing_call_ids": list(missing)},
        )
        events.append(FeedbackAdded(feedback=flag, event_id=ids.event("flag")))
    return [*events, StateChanged(state=SessionState.FINISHED, reason=reason, event_id=ids.event("state"))]


def ran_call(
    call_id: str,
    params: dict[str, Any],
    subgoal_id: str | None,
    result: SkillResult,
    started: datetime,
    finished: datetime,
) -> ToolCall:
    """The record of a skill the engine ran; a timeout (the skill's or the sandbox's) is its own status."""
    status = CallStatus.SUCCESS if result.ok else CallStatus.ERROR
    if result.error_code in ("TIMEOUT", "SANDBOX_TIMEOUT"):
        status = CallStatus.TIMEOUT
    return ToolCall(
        call_id=call_id,
        subgoal_id=subgoal_id,
        tool=result.skill,
        params=params,
        output=result.output,
        status=status,
        error_code=result.error_code,
        error_message=result.error_message,
        retryable=result.retryable,
        latency_ms=result.latency_ms,
        attempt=max(result.attempts, 1),
        warnings=result.warnings,
        started_at=started,
        finished_at=finished,
    )


def refused_call(
    call_id: str, tool: str, params: dict[str, Any], subgoal_id: str | None, refusal: StepRefusal
) -> ToolCall:
    """The record of a tool step the guards refused: nothing ran, and the reason is its error."""
    return ToolCall(
        call_id=call_id,
        subgoal_id=subgoal_id,
        tool=tool,
        params=params,
        status=CallStatus.REFUSED,
        error_code=refusal.reason.value,
        error_message=refusal.detail,
    )


def llm_record(call_id: str, purpose: str, messages: Sequence[Message], reply: PolicyReply) -> LLMCall:
    """The record of a policy call the engine made."""
    return LLMCall(
        call_id=call_id,
        purpose=purpose,
        messages=tuple(messages),
        response=reply.text,
        prompt_token_ids=reply.prompt_token_ids,
        token_ids=reply.token_ids,
        logprobs=reply.logprobs,
        policy_version=reply.policy_version,
        tokens_used=reply.tokens_used,
    )
