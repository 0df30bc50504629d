"""What a rule's CEL expressions can see: plain views of a session, its calls and its feedback.

Each rule runs in one scope and sees the variables of that scope (`SCOPE_VARIABLES`). Views hold only
CEL-friendly values: strings, booleans, doubles for measured quantities, ints for counts, lists and maps.
CEL does not mix ints and doubles, so scores, latencies and weights are always doubles (write `4.0`, not
`4`) and counts always ints. Absent values are `null`. Tool outputs and LLM messages are left out: they
can be large, and a rule that needs them belongs in a Python term.

>>> sorted(SCOPE_VARIABLES["tool_call"])
['budget_ms', 'call', 'session', 'weight']
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sessionrl.session.model import CallStatus, Feedback, LLMCall, Session, ToolCall


class Scope(StrEnum):
    """What a rule is evaluated over: once per tool call, LLM call, feedback item, or once per session."""

    TOOL_CALL = "tool_call"
    LLM_CALL = "llm_call"
    FEEDBACK = "feedback"
    SESSION = "session"


SCOPE_VARIABLES: dict[Scope, frozenset[str]] = {
    Scope.TOOL_CALL: frozenset({"call", "session", "weight", "budget_ms"}),
    Scope.LLM_CALL: frozenset({"call", "session"}),
    Scope.FEEDBACK: frozenset({"feedback", "session"}),
    Scope.SESSION: frozenset({"session", "best_steps"}),
}
"""Variables each scope defines. `weight` is the tool's weight, `budget_ms` its latency budget (infinite
when none is set), `best_steps` the fewest tool calls a successful session of the scenario has needed
(0 when none is known yet)."""


def tool_call_view(call: ToolCall) -> dict[str, Any]:
    """A tool call as CEL sees it (`call` in the `tool_call` scope)."""
    return {
        "call_id": call.call_id,
        "subgoal_id": call.subgoal_id,
        "tool": call.tool,
        "status": call.status.value,
        "ok": call.status is CallStatus.SUCCESS,
        "error_code": call.error_code,
        "retryable": call.retryable,
        "latency_ms": float(call.latency_ms),
        "attempt": call.attempt,
        "params": call.params,
        "warnings": list(call.warnings),
    }


def llm_call_view(call: LLMCall) -> dict[str, Any]:
    """An LLM call as CEL sees it (`call` in the `llm_call` scope)."""
    return {
        "call_id": call.call_id,
        "purpose": call.purpose,
        "tokens_used": call.tokens_used,
        "latency_ms": (call.finished_at - call.started_at).total_seconds() * 1000.0,
        "policy_version": call.policy_version,
        "response_chars": len(call.response),
    }


def feedback_view(feedback: Feedback) -> dict[str, Any]:
    """A feedback item as CEL sees it (`feedback` in the `feedback` scope)."""
    return {
        "feedback_id": feedback.feedback_id,
        "type": feedback.type.value,
        "score": None if feedback.score is None else float(feedback.score),
        "comment": feedback.comment,
        "annotator": feedback.annotator,
        "anchor_call_id": feedback.anchor.call_id,
        "anchor_subgoal_id": feedback.anchor.subgoal_id,
        "delay_s": (feedback.received_at - feedback.occurred_at).total_seconds(),
        "data": feedback.data,
    }


def session_view(session: Session) -> dict[str, Any]:
    """A summary of the session (`session` in every scope)."""
    calls = session.tool_calls
    claims = session.final_output.claims if session.final_output is not None else ()
    return {
        "session_id": session.session_id,
        "state": session.state.value,
        "scenario": session.scenario,
        "tags": list(session.tags),
        "user_id": session.user_id,
        "n_subgoals": len(session.plan.subgoals) if session.plan is not None else 0,
        "n_tool_calls": len(calls),
        "n_failed_calls": sum(c.status is not CallStatus.SUCCESS for c in calls),
        "n_llm_calls": len(session.llm_calls),
        "tokens_used": session.tokens_reported(),
        "tool_latency_ms": float(sum(c.latency_ms for c in calls)),
        "duration_s": (session.updated_at - session.created_at).total_seconds(),
        "has_output": session.final_output is not None,
        "n_claims": len(claims),
        "n_unsourced_claims": sum(not c.call_ids for c in claims),
        "tools": [c.tool for c in calls],
        "feedback_types": [f.type.value for f in session.feedback],
    }


SAMPLE_VIEWS: dict[str, Any] = {
    "call_tool": {
        "call_id": "c0",
        "subgoal_id": "g1",
        "tool": "db_query",
        "status": "error",
        "ok": False,
        "error_code": "timeout",
        "retryable": True,
        "latency_ms": 120.0,
        "attempt": 2,
        "params": {"q": "x"},
        "warnings": ["clipped"],
    },
    "call_llm": {
        "call_id": "l0",
        "purpose": "final",
        "tokens_used": 300,
        "latency_ms": 900.0,
        "policy_version": 1,
        "response_chars": 42,
    },
    "feedback": {
        "feedback_id": "f0",
        "type": "human_rating",
        "score": 3.0,
        "comment": "ok",
        "annotator": "a",
        "anchor_call_id": "c0",
        "anchor_subgoal_id": "g1",
        "delay_s": 2.0,
        "data": {"reason": "cycle", "passed": True},
    },
    "session": {
        "session_id": "s0",
        "state": "finished",
        "scenario": "demo",
        "tags": ["demo"],
        "user_id": "u0",
        "n_subgoals": 2,
        "n_tool_calls": 3,
        "n_failed_calls": 1,
        "n_llm_calls": 2,
        "tokens_used": 500,
        "tool_latency_ms": 360.0,
        "duration_s": 4.0,
        "has_output": True,
        "n_claims": 2,
        "n_unsourced_claims": 0,
        "tools": ["db_query"],
        "feedback_types": ["human_rating"],
    },
}
"""Typical, fully populated views: every rule is evaluated on them once when its file is loaded, so type
mistakes (an int where a double is needed) are caught before any session is scored."""


def sample_variables(scope: Scope) -> dict[str, Any]:
    """The variables of a scope filled with `SAMPLE_VIEWS`."""
    session = SAMPLE_VIEWS["session"]
    if scope is Scope.TOOL_CALL:
        return {"call": SAMPLE_VIEWS["call_tool"], "session": session, "weight": 1.0, "budget_ms": 100.0}
    if scope is Scope.LLM_CALL:
        return {"call": SAMPLE_VIEWS["call_llm"], "session": session}
    if scope is Scope.FEEDBACK:
        return {"feedback": SAMPLE_VIEWS["feedback"], "session": session}
    return {"session": session, "best_steps": 2}
