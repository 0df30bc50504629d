"""Events: every change to a session is one, and the read view is their fold.

`apply(session, event)` is a pure function; `fold(events)` replays a whole log. The store calls the same
`apply` when it appends, so what is stored and what is replayed can never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from operator import attrgetter
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import Field, TypeAdapter, ValidationError

from sessionrl.errors import InvalidEvent, InvalidTransition
from sessionrl.session.lifecycle import TRANSITIONS, accepts, can_transition
from sessionrl.session.model import (
    Feedback,
    FinalOutput,
    Input,
    LLMCall,
    Plan,
    Session,
    SessionCreate,
    SessionPatch,
    SessionState,
    ShardVersions,
    ToolCall,
    new_id,
    new_trace_id,
    utcnow,
)

CallT = TypeVar("CallT", ToolCall, LLMCall)
_CALL_ID = attrgetter("call_id")


class EventBase(Input):
    """Fields every event carries. `event_id` is the idempotency key."""

    event_id: str = Field(default_factory=lambda: new_id("e"), pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    at: datetime = Field(default_factory=utcnow)


class SessionCreated(EventBase):
    type: Literal["session_created"] = "session_created"
    session_id: str
    trace_id: str
    create: SessionCreate


class SessionPatched(EventBase):
    type: Literal["session_patched"] = "session_patched"
    patch: SessionPatch


class PlanSet(EventBase):
    type: Literal["plan_set"] = "plan_set"
    plan: Plan


class StateChanged(EventBase):
    type: Literal["state_changed"] = "state_changed"
    state: SessionState
    reason: str | None = None


class ToolCallRecorded(EventBase):
    """A tool call; recording the same `call_id` again replaces the earlier record."""

    type: Literal["tool_call"] = "tool_call"
    call: ToolCall


class LLMCallRecorded(EventBase):
    type: Literal["llm_call"] = "llm_call"
    call: LLMCall


class FeedbackAdded(EventBase):
    type: Literal["feedback"] = "feedback"
    feedback: Feedback


class OutputSet(EventBase):
    type: Literal["output_set"] = "output_set"
    output: FinalOutput


Event = Annotated[
    SessionCreated
    | SessionPatched
    | PlanSet
    | StateChanged
    | ToolCallRecorded
    | LLMCallRecorded
    | FeedbackAdded
    | OutputSet,
    Field(discriminator="type"),
]

EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)


def created(create: SessionCreate, *, event_id: str | None = None) -> SessionCreated:
    """The first event of a session, with ids filled in where the caller left them empty."""
    extra = {"event_id": event_id} if event_id else {}
    return SessionCreated(
        session_id=create.session_id or new_id("s"),
        trace_id=create.trace_id or new_trace_id(),
        create=create,
        **extra,
    )


def parse_event(raw: bytes | str | dict[str, Any]) -> Event:
    """Validate raw JSON (or a decoded dict) as an event; errors name the field and the rule."""
    try:
        data = raw if isinstance(raw, dict) else orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent("body", f"malformed JSON: {exc}") from exc
    try:
        return EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise invalid_from(exc) from exc


def invalid_from(exc: ValidationError) -> InvalidEvent:
    """The first problem of a pydantic error as an `InvalidEvent` naming the field and the rule."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "event"
    return InvalidEvent(field, f"{first['msg']} ({first['type']})")


def apply(session: Session | None, event: Event) -> Session:
    """Fold one event into a session and return the new read view (the input is not changed)."""
    if isinstance(event, SessionCreated):
        if session is not None:
            raise InvalidEvent("type", f"session {session.session_id!r} already exists")
        return _created(event)
    if session is None:
        raise InvalidEvent("type", f"{event.type!r} needs an existing session; create it first")
    _check_allowed(session, event)
    update, shard = _changes(session, event)
    versions = session.versions.model_copy(update={shard: getattr(session.versions, shard) + 1})
    update |= {"versions": versions, "state_version": session.state_version + 1, "updated_at": event.at}
    return session.model_copy(update=update)


def fold(events: Iterable[Event]) -> Session:
    """Replay a whole event log into its read view."""
    session: Session | None = None
    for event in events:
        session = apply(session, event)
    if session is None:
        raise InvalidEvent("events", "an empty event log folds to no session")
    return session


def _created(event: SessionCreated) -> Session:
    c = event.create
    return Session(
        session_id=event.session_id,
        trace_id=event.trace_id,
        scenario=c.scenario,
        tags=c.tags,
        user_id=c.user_id,
        user_query=c.user_query,
        metadata=c.metadata,
        versions=ShardVersions(),
        state_version=1,
        created_at=event.at,
        updated_at=event.at,
    )


def _check_allowed(session: Session, event: Event) -> None:
    if isinstance(event, StateChanged):
        if not can_transition(session.state, event.state):
            allowed = ", ".join(sorted(TRANSITIONS[session.state])) or "none"
            raise InvalidTransition(session.session_id, session.state, f"-> {event.state}", allowed)
    elif not accepts(session.state, event.type):
        raise InvalidTransition(session.session_id, session.state, event.type)


def _changes(session: Session, event: Event) -> tuple[dict[str, Any], str]:
    """The fields an event changes, and the shard whose version it bumps."""
    match event:
        case PlanSet(plan=plan):
            return {"plan": plan}, "plan"
        case StateChanged(state=state):
            return {"state": state}, "execution"
        case ToolCallRecorded(call=call):
            return {"tool_calls": _recorded(session.tool_calls, call)}, "execution"
        case LLMCallRecorded(call=call):
            return {"llm_calls": _recorded(session.llm_calls, call)}, "execution"
        case OutputSet(output=output):
            return {"final_output": output}, "execution"
        case SessionPatched(patch=patch):
            return patch.model_dump(exclude_none=True), "execution"
        case FeedbackAdded(feedback=feedback):
            return {"feedback": _merge_feedback(session, feedback)}, "feedback"
    raise InvalidEvent("type", f"unknown event type {event.type!r}")


def _recorded(calls: tuple[CallT, ...], call: CallT) -> tuple[CallT, ...]:
    """`calls` with `call` last, in place of an earlier record of the same id.

    A new id is the common case: its test runs in C (`in` over a `map`), and only a replaced call pays
    for rebuilding the tuple without the old record.
    """
    if call.call_id in map(_CALL_ID, calls):
        calls = tuple(c for c in calls if c.call_id != call.call_id)
    return calls + (call,)  # noqa: RUF005 (mypy rejects the unpacked form for a constrained type)


def _merge_feedback(session: Session, new: Feedback) -> tuple[Feedback, ...]:
    """Add feedback. Items of the same type on the same anchor from different sources all stay; from
    the same source (`Feedback.source`), the later `occurred_at` replaces the earlier (a tie goes to the
    one that arrived last)."""
    check_anchor(session, new)
    key = new.merge_key
    for i, old in enumerate(session.feedback):
        if old.merge_key == key:
            if new.occurred_at >= old.occurred_at:
                return (*session.feedback[:i], new, *session.feedback[i + 1 :])
            return session.feedback
    return (*session.feedback, new)


def check_anchor(session: Session, feedback: Feedback) -> None:
    """Reject feedback anchored to a call or sub-goal the session does not have."""
    anchor = feedback.anchor
    if anchor.call_id is not None and anchor.call_id not in session.call_ids():
        raise InvalidEvent(
            "feedback.anchor.call_id",
            f"session {session.session_id!r} has no call {anchor.call_id!r}",
        )
    if anchor.subgoal_id is not None and (
        session.plan is None or session.plan.subgoal(anchor.subgoal_id) is None
    ):
        raise InvalidEvent(
            "feedback.anchor.subgoal_id",
            f"session {session.session_id!r} has no sub-goal {anchor.subgoal_id!r}",
        )
