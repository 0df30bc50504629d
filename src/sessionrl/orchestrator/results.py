"""What the engine takes and gives back: step payloads, the one `StepResult`, and finish/feedback answers.

The models themselves live in `sessionrl.wire`, the HTTP API's wire models; this module builds them.

Results are built from the committed session by pure functions (`tool_result`, `plan_result`, ...). The
engine calls the same function after its own commit and when it answers a replayed request from the log,
so a retry with the same idempotency key gets the same answer as the first try.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass
from typing import Any, TypeVar

from sessionrl.errors import SessionRLError
from sessionrl.orchestrator.guards import missing_citations, unverified_subgoals
from sessionrl.orchestrator.policy import parse_plan
from sessionrl.session.model import CallStatus, LLMCall, Session, ToolCall

# the wire models are defined in `sessionrl.wire` (so a client can import them alone) and named here too
from sessionrl.wire import FeedbackResult as FeedbackResult
from sessionrl.wire import FinishResult as FinishResult
from sessionrl.wire import LLMPayload as LLMPayload
from sessionrl.wire import PlanPayload as PlanPayload
from sessionrl.wire import PlanRejection, Refusal
from sessionrl.wire import StepError as StepError
from sessionrl.wire import StepKind as StepKind
from sessionrl.wire import StepPayload as StepPayload
from sessionrl.wire import StepResult as StepResult
from sessionrl.wire import ToolPayload as ToolPayload

C = TypeVar("C", ToolCall, LLMCall)


PAYLOADS: dict[StepKind, type[PlanPayload] | type[ToolPayload] | type[LLMPayload]] = {
    StepKind.PLAN: PlanPayload,
    StepKind.TOOL: ToolPayload,
    StepKind.LLM: LLMPayload,
}


class KeyReused(SessionRLError):
    """An idempotency key already served a different request (another body, kind or session)."""

    def __init__(self, key: str | None, detail: str = "a different request") -> None:
        super().__init__(
            f"this Idempotency-Key was already used for {detail}; use a new key for a new request"
        )
        self.key = key


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


def tool_result(
    session: Session, ids: StepIds, masked: tuple[str, ...], call_id: str | None = None
) -> StepResult:
    """The result of a committed tool step (its call, and the policy call that chose it, if any); the call
    is `call_id` when the request named it. Neither call in the session: the store already held the
    request's events, written by another request with the same key (`KeyReused`)."""
    base = _base(session, StepKind.TOOL, masked)
    chooser = _llm_call(session, ids.llm)
    call = _by_id(session.tool_calls, call_id or ids.call)
    if call is None and chooser is None:
        raise KeyReused(None, "a request of another kind")
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


def llm_result(
    session: Session, ids: StepIds, masked: tuple[str, ...], call_id: str | None = None
) -> StepResult:
    """The result of a committed LLM step (a recorded failed call is `ok: false`). No such call in the
    session: the store already held the request's events, from another request with the same key."""
    call = _llm_call(session, call_id or ids.llm)
    if call is None:
        raise KeyReused(None, "a request of another kind")
    failed = call.status is not CallStatus.SUCCESS
    return StepResult(
        ok=not failed,
        **_base(session, StepKind.LLM, masked),
        call_id=call.call_id,
        text=call.response,
        error_code=StepError.POLICY_ERROR if failed else None,
        error_message=call.error_message,
        latency_ms=call.latency_ms,
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


def may_be_replay(session: Session, kind: StepKind, ids: StepIds, payload: StepPayload) -> bool:
    """Whether the session shows a trace of the request of `ids` (then the log is checked to be sure)."""
    if kind is StepKind.PLAN and session.plan is not None:
        return True
    calls = session.call_ids()
    named = getattr(payload, "call_id", None)
    return ids.call in calls or ids.llm in calls or named in calls


def call_ids(payload: StepPayload, ids: StepIds) -> tuple[str, str]:
    """The ids a step's tool call and LLM call have: the ones the request named, or those of its key."""
    named = getattr(payload, "call_id", None)
    tool_id = named if isinstance(payload, ToolPayload) and named else ids.call
    llm_id = named if isinstance(payload, LLMPayload) and named else ids.llm
    return tool_id, llm_id


def replayed_result(
    kind: StepKind, session: Session, ids: StepIds, masked: tuple[str, ...], payload: StepPayload
) -> StepResult:
    """The answer to a step replayed from the log: the result the first try was given."""
    if kind is StepKind.PLAN:
        return plan_result(session, ids, masked)
    tool_id, llm_id = call_ids(payload, ids)
    if kind is StepKind.TOOL:
        return tool_result(session, ids, masked, tool_id)
    return llm_result(session, ids, masked, llm_id)
