"""Sessions as OpenTelemetry spans in the GenAI conventions, with what no standard carries under
`sessionrl.*`, so that importing the export gives the same session back.

One trace per session (its own trace id): a root `invoke_agent` span for the session (its state, plan,
final output, reward and feedback), one `chat` span per LLM call and one `execute_tool` span per tool
call under it. The session's descriptive fields ride on the resource (`sessionrl.session.*`), so every
span of the session names it, whichever arrives first at a receiver. Feedback is a
`gen_ai.evaluation.result` event on the root span, at the time it happened, with the time it arrived and
the delay between them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import orjson

from sessionrl.capture.otlp import encode
from sessionrl.capture.otlp_spans import STATUS_ERROR, STATUS_UNSET, Span, SpanEvent, to_ns
from sessionrl.session.model import CallStatus, Feedback, LLMCall, Message, Session, SessionState, ToolCall
from sessionrl.store import SessionStore
from sessionrl.store.records import RewardRecord

EVALUATION_EVENT = "gen_ai.evaluation.result"


def span_id(session_id: str, *parts: str) -> str:
    """A stable 16-hex-digit span id for one part of a session."""
    return hashlib.blake2b("/".join((session_id, *parts)).encode(), digest_size=8).hexdigest()


def session_spans(session: Session, reward: RewardRecord | None = None) -> list[Span]:
    """The spans of one session: the root first, then its tool and LLM calls."""
    resource = _resource(session)
    root = _root(session, resource, reward)
    calls = [_tool_span(session, root, resource, i, c) for i, c in enumerate(session.tool_calls)]
    calls += [_llm_span(session, root, resource, i, c) for i, c in enumerate(session.llm_calls)]
    return [root, *calls]


def _resource(s: Session) -> dict[str, Any]:
    found = {
        "service.name": "sessionrl",
        "sessionrl.session.id": s.session_id,
        "sessionrl.session.user_query": s.user_query,
        "sessionrl.session.scenario": s.scenario,
        "sessionrl.session.tags": list(s.tags),
        "sessionrl.session.user_id": s.user_id,
        "sessionrl.session.metadata": _json(s.metadata),
        "sessionrl.session.created_at": s.created_at.isoformat(),
    }
    return {k: v for k, v in found.items() if v is not None}


def _root(s: Session, resource: dict[str, Any], reward: RewardRecord | None) -> Span:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": s.session_id,
        "sessionrl.session.state": s.state.value,
        "sessionrl.plan": _json(s.plan.model_dump(mode="json") if s.plan else None),
        "sessionrl.final_output": _json(s.final_output.model_dump(mode="json") if s.final_output else None),
    }
    if s.final_output is not None:
        attributes["gen_ai.output.messages"] = _json(
            [{"role": "assistant", "parts": [{"type": "text", "content": s.final_output.text}]}]
        )
    if reward is not None:
        attributes |= {
            "sessionrl.reward.version": reward.version,
            "sessionrl.reward.ruleset_version": reward.ruleset_version,
            "sessionrl.reward.vector": _json(reward.vector),
        }
    return Span(
        trace_id=s.trace_id,
        span_id=span_id(s.session_id, "root"),
        parent_span_id=None,
        name="invoke_agent sessionrl",
        start_ns=to_ns(s.created_at),
        end_ns=to_ns(s.updated_at),
        attributes=attributes,
        events=tuple(_feedback_event(f) for f in s.feedback),
        resource=resource,
    )


def _feedback_event(f: Feedback) -> SpanEvent:
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": f.annotator or f.type.value,
        "gen_ai.evaluation.score.value": f.score,
        "gen_ai.evaluation.explanation": f.comment,
        "sessionrl.feedback.id": f.feedback_id,
        "sessionrl.feedback.type": f.type.value,
        "sessionrl.feedback.annotator": f.annotator,
        "sessionrl.feedback.anchor": _json(f.anchor.model_dump(mode="json", exclude_none=True)),
        "sessionrl.feedback.occurred_at": f.occurred_at.isoformat(),
        "sessionrl.feedback.received_at": f.received_at.isoformat(),
        "sessionrl.feedback.delay_s": (f.received_at - f.occurred_at).total_seconds(),
        "sessionrl.feedback.data": _json(f.data),
    }
    return SpanEvent(EVALUATION_EVENT, to_ns(f.occurred_at), attributes)


def _child(s: Session, root: Span, resource: dict[str, Any], kind: str, call_id: str) -> dict[str, Any]:
    return {
        "trace_id": s.trace_id,
        "span_id": span_id(s.session_id, kind, call_id),
        "parent_span_id": root.span_id,
        "resource": resource,
    }


def _tool_span(s: Session, root: Span, resource: dict[str, Any], seq: int, c: ToolCall) -> Span:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": c.tool,
        "gen_ai.tool.call.id": c.call_id,
        "gen_ai.tool.call.arguments": _json(c.params),
        "gen_ai.tool.call.result": _json(c.output),
        "error.type": c.error_code,
        "sessionrl.call_id": c.call_id,
        "sessionrl.seq": seq,
        "sessionrl.status": c.status.value,
        "sessionrl.subgoal_id": c.subgoal_id,
        "sessionrl.error_code": c.error_code,
        "sessionrl.error_message": c.error_message,
        "sessionrl.retryable": c.retryable,
        "sessionrl.latency_ms": c.latency_ms,
        "sessionrl.attempt": c.attempt,
        "sessionrl.warnings": list(c.warnings),
        "sessionrl.recorded": c.recorded,
        "sessionrl.free_form": c.free_form,
    }
    failed = c.status is not CallStatus.SUCCESS
    return Span(
        name=f"execute_tool {c.tool}",
        start_ns=to_ns(c.started_at),
        end_ns=to_ns(c.finished_at),
        attributes=attributes,
        status_code=STATUS_ERROR if failed else STATUS_UNSET,
        status_message=(c.error_message or "") if failed else "",
        **_child(s, root, resource, "tool", c.call_id),
    )


def _llm_span(s: Session, root: Span, resource: dict[str, Any], seq: int, c: LLMCall) -> Span:
    usage = c.usage or {}
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": c.model,
        "gen_ai.input.messages": _json([_message(m) for m in c.messages]),
        "gen_ai.output.messages": _json([_message(_answer(c))]),
        "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
        "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
        "sessionrl.call_id": c.call_id,
        "sessionrl.seq": seq,
        "sessionrl.purpose": c.purpose,
        "sessionrl.status": c.status.value,
        "sessionrl.model": c.model,
        "sessionrl.prompt_token_ids": _list(c.prompt_token_ids),
        "sessionrl.token_ids": _list(c.token_ids),
        "sessionrl.logprobs": _list(c.logprobs),
        "sessionrl.policy_version": c.policy_version,
        "sessionrl.tokens_used": c.tokens_used,
        "sessionrl.usage": _json(c.usage),
        "sessionrl.latency_ms": c.latency_ms,
        "sessionrl.error_message": c.error_message,
        "sessionrl.recorded": c.recorded,
    }
    failed = c.status is not CallStatus.SUCCESS
    return Span(
        name=f"chat {c.model or 'model'}",
        start_ns=to_ns(c.started_at),
        end_ns=to_ns(c.finished_at),
        attributes=attributes,
        status_code=STATUS_ERROR if failed else STATUS_UNSET,
        status_message=(c.error_message or "") if failed else "",
        **_child(s, root, resource, "llm", c.call_id),
    )


def _answer(c: LLMCall) -> Message:
    return Message(role="assistant", content=c.response, tool_calls=c.tool_calls)


def _message(m: Message) -> dict[str, Any]:
    """A message in the GenAI conventions: a role and typed parts."""
    if m.role == "tool":
        answer = {"type": "tool_call_response", "id": m.tool_call_id, "response": m.content}
        return {"role": "tool", "parts": [answer]}
    parts: list[dict[str, Any]] = [{"type": "text", "content": m.content}] if m.content else []
    parts += [
        {"type": "tool_call", "id": t.id, "name": t.name, "arguments": t.arguments} for t in m.tool_calls
    ]
    return {"role": m.role, "parts": parts}


def _list(values: tuple[Any, ...] | None) -> list[Any] | None:
    return None if values is None else list(values)


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def otlp_lines(store: SessionStore, *, state: SessionState | None) -> Iterator[bytes]:
    """Every session of the store (in `state`, if given) with its latest reward, as OTLP/JSON lines."""
    for session in store.iter_sessions(state):
        rewards = store.rewards(session.session_id)
        yield encode(session_spans(session, rewards[-1] if rewards else None), json=True)
