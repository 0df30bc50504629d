"""What the engine takes and gives back: step payloads, the one `StepResult`, and finish/feedback answers.

Results are built from the committed session by pure functions (`tool_result`, `plan_result`, ...). The
engine calls the same function after its own commit and when it answers a replayed request from the log,
so a retry with the same idempotency key gets the same answer as the first try.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.orchestrator.guards import PlanRejection, Refusal, missing_citations, unverified_subgoals
from sessionrl.orchestrator.policy import parse_plan
from sessionrl.session.model import (
    CallStatus,
    Input,
    LLMCall,
    Message,
    Plan,
    Session,
    SessionState,
    ToolCall,
)

C = TypeVar("C", ToolCall, LLMCall)


class StepKind(StrEnum):
    """The three kinds of step, each with its own lane."""

    PLAN = "plan"
    TOOL = "tool"
    LLM = "llm"


class StepError(StrEnum):
    """Error codes of failed steps that are the engine's own (tool failures carry the skill's code)."""

    UNPARSEABLE_PLAN = "UNPARSEABLE_PLAN"
    UNPARSEABLE_TOOL_CALL = "UNPARSEABLE_TOOL_CALL"
    PLAN_REJECTED = "PLAN_REJECTED"
    POLICY_ERROR = "POLICY_ERROR"


class PlanPayload(Input):
    """A plan step: give `plan` directly (an expert demonstration), or leave it out to ask the policy."""

    plan: Plan | None = Field(default=None, description="The plan to use as is; none: the policy writes one.")
    messages: tuple[Message, ...] = Field(
        default=(), description="Conversation for the policy; empty: the engine's planning prompt."
    )


class ToolPayload(Input):
    """A tool step: name the skill, or leave `tool` out to let the policy choose (it answers in JSON)."""

    tool: str | None = Field(default=None, max_length=200, description="Skill to call; none: ask the policy.")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters for the skill.")
    subgoal_id: str | None = Field(default=None, max_length=64, description="Sub-goal this call serves.")
    messages: tuple[Message, ...] = Field(
        default=(), description="Conversation for the policy when it chooses the tool."
    )


class LLMPayload(Input):
    """An LLM step: the policy answers the conversation."""

    messages: tuple[Message, ...] = Field(default=(), description="Conversation; empty: the user's query.")
    purpose: str = Field(default="step", min_length=1, max_length=64, description="Why the model is called.")


StepPayload = PlanPayload | ToolPayload | LLMPayload
PAYLOADS: dict[StepKind, type[PlanPayload] | type[ToolPayload] | type[LLMPayload]] = {
    StepKind.PLAN: PlanPayload,
    StepKind.TOOL: ToolPayload,
    StepKind.LLM: LLMPayload,
}


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepResult(_Result):
    """How one step ended. `ok` is false for failed, refused or rejected steps; each is still recorded."""

    ok: bool
    kind: StepKind
    session_id: str
    state: SessionState = Field(description="The session's state right after the step was committed.")
    state_version: int = Field(description="The session's version right after the step was committed.")
    call_id: str | None = Field(default=None, description="The tool call (tool steps) or LLM call recorded.")
    policy_call_id: str | None = Field(default=None, description="The LLM call that chose the tool, if any.")
    tool: str | None = Field(default=None, description="The skill that served the call (a fallback, maybe).")
    status: CallStatus | None = None
    output: Any = None
    text: str | None = Field(default=None, description="What the policy wrote.")
    plan: Plan | None = None
    error_code: str | None = None
    error_message: str | None = None
    retryable: bool = False
    refused: Refusal | None = Field(default=None, description="Why a tool step was refused without running.")
    rejection: PlanRejection | None = Field(
        default=None, description="Why the plan breaker rejected the plan."
    )
    latency_ms: float = 0.0
    attempts: int = 0
    warnings: tuple[str, ...] = ()
    masked: tuple[str, ...] = Field(default=(), description="Skills masked (breaker open) when answered.")


class FinishResult(_Result):
    """How a session was finished, and what the finishing guards found."""

    session_id: str
    state: SessionState
    state_version: int
    unverified_subgoals: tuple[str, ...] = Field(
        description="Sub-goals penalised: no tool call executed them."
    )
    missing_citations: tuple[str, ...] = Field(description="Cited call ids the session does not have.")


class FeedbackResult(_Result):
    """Where a piece of feedback went. `in_force` is false when later-dated feedback of the same kind won."""

    session_id: str
    feedback_id: str
    in_force: bool
    state: SessionState
    state_version: int


@dataclass(frozen=True, slots=True)
class StepIds:
    """Ids of everything one request writes, derived from its idempotency key (see `IdSource` for none).

    >>> ids = StepIds.of("client-1:key-9")
    >>> ids == StepIds.of("client-1:key-9"), ids.call.startswith("c_"), ids.event() != ids.event("state")
    (True, True, True)
    """

    base: str

    @classmethod
    def of(cls, key: str) -> StepIds:
        """Ids derived from `key` (a stable digest of it)."""
        return cls(hashlib.blake2b(key.encode(), digest_size=12).hexdigest())

    @property
    def call(self) -> str:
        """The tool call's id."""
        return f"c_{self.base}"

    @property
    def llm(self) -> str:
        """The LLM call's id."""
        return f"l_{self.base}"

    @property
    def session(self) -> str:
        """A session id, for a create request that names none."""
        return f"s_{self.base}"

    def feedback(self, part: str = "") -> str:
        """A feedback id; `part` tells apart several written by one request."""
        return f"f_{self.base}.{part}" if part else f"f_{self.base}"

    def event(self, part: str = "") -> str:
        """An event id. The request's last event has no `part`: finding it in the log proves a replay."""
        return f"e_{self.base}.{part}" if part else f"e_{self.base}"


class IdSource:
    """Ids for requests without a key: a random prefix per source and a counter, so making one needs no
    system call (the engine makes several per step).

    >>> source = IdSource()
    >>> first, second = source.ids(None), source.ids(None)
    >>> first != second, len(first.base), source.ids("k") == StepIds.of("k")
    (True, 24, True)
    """

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex()
        self._count = itertools.count()

    def ids(self, key: str | None) -> StepIds:
        """The ids of a request: derived from its key, or fresh."""
        if key is not None:
            return StepIds.of(key)
        return StepIds(f"{self._prefix}{next(self._count):012x}")


def _llm_call(session: Session, call_id: str) -> LLMCall | None:
    return _by_id(session.llm_calls, call_id)


def _by_id(calls: tuple[C, ...], call_id: str) -> C | None:
    """The call with this id (ids are unique in a session), looked for from the end: a step's result is
    built right after its call was appended, so the search does not grow with the session."""
    return next((c for c in reversed(calls) if c.call_id == call_id), None)


def _base(session: Session, kind: StepKind, masked: tuple[str, ...]) -> dict[str, Any]:
    return {
        "kind": kind,
        "session_id": session.session_id,
        "state": session.state,
        "state_version": session.state_version,
        "masked": masked,
    }


def tool_result(session: Session, ids: StepIds, masked: tuple[str, ...]) -> StepResult:
    """The result of a committed tool step (its call, and the policy call that chose it, if any)."""
    base = _base(session, StepKind.TOOL, masked)
    chooser = _llm_call(session, ids.llm)
    call = _by_id(session.tool_calls, ids.call)
    if call is None:
        text = chooser.response if chooser is not None else None
        return StepResult(
            ok=False,
            **base,
            policy_call_id=ids.llm,
            text=text,
            error_code=StepError.UNPARSEABLE_TOOL_CALL,
            error_message='the policy did not answer with a JSON tool call {"tool": ..., "params": {...}}',
        )
    refused = Refusal(call.error_code) if call.status == CallStatus.REFUSED and call.error_code else None
    return StepResult(
        ok=call.status == CallStatus.SUCCESS,
        **base,
        call_id=call.call_id,
        policy_call_id=chooser.call_id if chooser is not None else None,
        tool=call.tool,
        status=call.status,
        output=call.output,
        text=chooser.response if chooser is not None else None,
        error_code=call.error_code,
        error_message=call.error_message,
        retryable=call.retryable,
        refused=refused,
        latency_ms=call.latency_ms,
        attempts=call.attempt if call.status != CallStatus.REFUSED else 0,
        warnings=call.warnings,
    )


def llm_result(session: Session, ids: StepIds, masked: tuple[str, ...]) -> StepResult:
    """The result of a committed LLM step."""
    call = _llm_call(session, ids.llm)
    if call is None:
        raise LookupError(f"session {session.session_id!r} has no LLM call {ids.llm!r}")
    return StepResult(
        ok=True, **_base(session, StepKind.LLM, masked), call_id=call.call_id, text=call.response
    )


def plan_result(session: Session, ids: StepIds, masked: tuple[str, ...]) -> StepResult:
    """The result of a committed plan step: accepted, rejected by the breaker, or unreadable."""
    base = _base(session, StepKind.PLAN, masked)
    call = _llm_call(session, ids.llm)
    text = call.response if call is not None else None
    call_id = call.call_id if call is not None else None
    if call is not None and parse_plan(call.response) is None:
        return StepResult(
            ok=False,
            **base,
            call_id=call_id,
            text=text,
            error_code=StepError.UNPARSEABLE_PLAN,
            error_message='the policy did not answer with a JSON plan {"root_goal": ..., "subgoals": [...]}',
        )
    rejection = next((f for f in session.feedback if f.feedback_id == ids.feedback()), None)
    if rejection is not None:
        return StepResult(
            ok=False,
            **base,
            call_id=call_id,
            text=text,
            plan=session.plan,
            error_code=StepError.PLAN_REJECTED,
            error_message=str(rejection.data.get("detail", "")),
            rejection=PlanRejection(str(rejection.data["reason"])),
        )
    return StepResult(ok=True, **base, call_id=call_id, text=text, plan=session.plan)


def finish_result(session: Session) -> FinishResult:
    """The result of a committed finish: the guards re-run on the finished session give the same lists."""
    output = session.final_output
    return FinishResult(
        session_id=session.session_id,
        state=session.state,
        state_version=session.state_version,
        unverified_subgoals=unverified_subgoals(session),
        missing_citations=missing_citations(session, output) if output is not None else (),
    )


def feedback_result(session: Session, feedback_id: str) -> FeedbackResult:
    """Where a committed piece of feedback stands."""
    return FeedbackResult(
        session_id=session.session_id,
        feedback_id=feedback_id,
        in_force=any(f.feedback_id == feedback_id for f in session.feedback),
        state=session.state,
        state_version=session.state_version,
    )
