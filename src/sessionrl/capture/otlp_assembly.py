"""Spans to sessions: which session a span belongs to, and the events that build it.

Both ways in use these pure functions: the receiver (`sessionrl.capture.otlp_receiver`) appends the
events of each request as it comes, and the importer (`sessions_from_spans`) folds the events of a
whole file. Event ids derive from the session and the span id, so a span sent twice is stored once.

A session's calls are ordered by `sessionrl.seq` when sessionrl exported them, else by start time,
whatever order the spans arrived in.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sessionrl.capture import otlp_map as m
from sessionrl.capture.documents import STATE_PATH
from sessionrl.capture.otlp_spans import Span, from_ns
from sessionrl.capture.timing import DANGLING
from sessionrl.errors import InvalidEvent, InvalidTransition
from sessionrl.session.events import (
    CallT,
    Event,
    FeedbackAdded,
    LLMCallRecorded,
    OutputSet,
    PlanSet,
    SessionCreated,
    SessionPatched,
    StateChanged,
    ToolCallRecorded,
    apply,
)
from sessionrl.session.lifecycle import ACTIVE
from sessionrl.session.model import FinalOutput, Session, SessionCreate, SessionPatch, SessionState

S = SessionState
REFUSED_EVENT = "refused_event"
"""A warning's kind: an event the session would not take (left out)."""
UNUSABLE = "unusable_span"
"""A warning's kind: a span (or score, feedback) that could be read but not used (left out)."""
MAX_QUERY = 100_000
"""Longest `user_query` a session takes; a longer request is cut (its LLM call keeps it whole)."""
MAPPING_ERRORS = (ValueError, TypeError)
"""What mapping a span with unexpected values raises (pydantic's ValidationError is a ValueError)."""
SAFE_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,120}$")


def digest(text: str, size: int = 10) -> str:
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


# grouping


def group_keys(spans: Sequence[Span], group_by: str | None, known: dict[str, str]) -> list[str]:
    """The session key of each span: sessionrl's session id, else the `group_by` attribute (spans
    without it take their trace's, when another span of the trace has it), else the trace id. `known`
    (trace id -> key) is read and extended, so a receiver keeps it across requests."""
    for span in spans:
        key = _own_key(span, group_by)
        if key is not None:
            known.setdefault(span.trace_id, key)
    return [_own_key(s, group_by) or known.get(s.trace_id) or f"trace:{s.trace_id}" for s in spans]


def _own_key(span: Span, group_by: str | None) -> str | None:
    named = span.attr("sessionrl.session.id")
    if named is not None:
        return f"sessionrl:{named}"
    value = span.attr(group_by) if group_by else None
    return None if value is None else f"attr:{value}"


def session_id_of(key: str) -> str:
    """The session id a key stands for (a valid id: long or odd values are hashed).

    >>> session_id_of("trace:0af7651916cd43dd8448eb211c80319c"), session_id_of("attr:chat 7")
    ('otel-0af7651916cd43dd8448eb211c80319c', 'otel-f67cef2ac9a284c7f6a5')
    """
    kind, _, value = key.partition(":")
    if kind == "sessionrl" and SAFE_ID.match(value):
        return value
    return f"otel-{value}" if SAFE_ID.match(value) else f"otel-{digest(value)}"


def root_of(spans: Iterable[Span]) -> Span | None:
    """The span without a parent (the first, if several claim it)."""
    return next((s for s in spans if s.parent_span_id is None), None)


def ordered(spans: Iterable[Span]) -> list[Span]:
    """Spans in session order: sessionrl's own sequence numbers first, then start times."""
    return sorted(spans, key=lambda s: (s.attributes.get("sessionrl.seq", -1), s.start_ns, s.span_id))


# events


def opening(session_id: str, spans: Sequence[Span], key: str) -> SessionCreated:
    """The event that opens a group's session, from what these spans say of it."""
    first = ordered(spans)
    root = root_of(first)
    query = next(
        (q for q in (m.user_query(s) for s in ([root] if root else []) + first) if q is not None), None
    )
    fields = m.session_fields(next((s for s in first if s.attr("sessionrl.session.id")), root))
    metadata = fields.pop("metadata", None)
    if not isinstance(metadata, dict):
        metadata = {
            "imported_from": str(first[0].attr("sessionrl.source") or "otlp"),
            "conventions": conventions(first),
            "token_ids": "none in the trace: training re-tokenises each call's messages and answer",
            "otlp_group": key,
        }
    create = SessionCreate(
        user_query=(query or "")[:MAX_QUERY],
        session_id=session_id,
        trace_id=first[0].trace_id,
        metadata=metadata,
        **fields,
    )
    created_at = _created_at(first)
    return SessionCreated(
        session_id=session_id, trace_id=first[0].trace_id, create=create, at=created_at,
        event_id=f"otlp.{digest(key)}.open",
    )  # fmt: skip


def _created_at(spans: Sequence[Span]) -> datetime:
    named = next(
        (s.attr("sessionrl.session.created_at") for s in spans if s.attr("sessionrl.session.created_at")),
        None,
    )
    return (
        datetime.fromisoformat(named) if isinstance(named, str) else from_ns(min(s.start_ns for s in spans))
    )


def conventions(spans: Iterable[Span]) -> list[str]:
    """Which conventions the spans follow: gen_ai, openinference, or both."""
    found = set()
    for span in spans:
        if "gen_ai.operation.name" in span.attributes:
            found.add("gen_ai")
        if "openinference.span.kind" in span.attributes:
            found.add("openinference")
    return sorted(found)


def span_events(span: Span, key: str, known: Mapping[str, Span]) -> tuple[list[Event], list[Event]]:
    """(the span's call, its feedback): an LLM or tool call event, and its evaluation results, about its
    own call, or for an evaluation span about its parent's call when the parent is among `known`."""
    role = m.role_of(span)
    prefix = f"otlp.{digest(key)}.{span.span_id}"
    calls: list[Event] = []
    if role == m.LLM:
        llm = m.llm_call(span)
        calls.append(LLMCallRecorded(call=llm, at=llm.finished_at, event_id=prefix))
    elif role == m.TOOL:
        tool = m.tool_call(span)
        calls.append(ToolCallRecorded(call=tool, at=tool.finished_at, event_id=prefix))
    anchor = m.call_id_of(span) if role != m.OTHER else None
    parent = known.get(span.parent_span_id or "")
    if anchor is None and parent is not None and m.role_of(parent) != m.OTHER:
        anchor = m.call_id_of(parent)
    found = m.feedback(span, anchor)
    notes: list[Event] = [
        FeedbackAdded(feedback=f, at=f.received_at, event_id=f"{prefix}.f{i}") for i, f in enumerate(found)
    ]
    if span.parent_span_id is None and (plan := m.plan(span)) is not None:
        calls.insert(0, PlanSet(plan=plan, at=from_ns(span.start_ns), event_id=f"{prefix}.plan"))
    return calls, notes


def closing(session: Session, root: Span | None, key: str, reason: str) -> list[Event]:
    """The events that finish a session: its calls put in start order (when they arrived out of it),
    the final output, and the state its root span names (finished when it names none)."""
    prefix = f"otlp.{digest(key)}.close"
    at = session.updated_at
    ours = root is not None and m.exported(root)  # sessionrl's export: calls keep its order, by sessionrl.seq
    events: list[Event] = [] if ours else _reordered(session, prefix)
    output = m.final_output(root) if root else None
    if output is None and not ours:
        output = _last_answer(session)
    if output is not None and session.final_output is None and session.state in ACTIVE:
        events.append(OutputSet(output=output, at=at, event_id=f"{prefix}.output"))
    named = root.attr("sessionrl.session.state") if root else None
    target = SessionState(named) if named else S.FINISHED
    if session.state in ACTIVE and target != session.state:
        path = [s for s in STATE_PATH[target] if s != session.state]
        events += [
            StateChanged(state=s, reason=reason, at=at, event_id=f"{prefix}.state{i}")
            for i, s in enumerate(path)
        ]
    return events


def _reordered(session: Session, prefix: str) -> list[Event]:
    """Re-record the calls that follow one out of start order, so the session lists them in order."""
    at = session.updated_at
    tools = _out_of_order(session.tool_calls)
    llms = _out_of_order(session.llm_calls)
    events: list[Event] = [
        ToolCallRecorded(call=c, at=at, event_id=f"{prefix}.t.{digest(c.call_id)}") for c in tools
    ]
    events += [LLMCallRecorded(call=c, at=at, event_id=f"{prefix}.l.{digest(c.call_id)}") for c in llms]
    return events


def _out_of_order(calls: tuple[CallT, ...]) -> list[CallT]:
    """The calls from the first one out of start order on, in start order (none when all are in order)."""
    want = sorted(calls, key=lambda c: c.started_at)
    first = next((i for i, (a, b) in enumerate(zip(calls, want, strict=True)) if a is not b), None)
    return [] if first is None else want[first:]


def _last_answer(session: Session) -> FinalOutput | None:
    """The last LLM response that asked for no tool: the agent's answer, when its trace names none."""
    last = max(session.llm_calls, key=lambda c: c.started_at, default=None)
    if last is None or last.tool_calls or not last.response:
        return None
    return FinalOutput(text=last.response)


def warnings_patch(session: Session, warnings: Sequence[str], key: str) -> list[Event]:
    """A metadata patch keeping what went wrong while assembling, in the session itself."""
    if not warnings:
        return []
    metadata = {**session.metadata, "otlp_warnings": [*session.metadata.get("otlp_warnings", []), *warnings]}
    patch = SessionPatched(patch=SessionPatch(metadata=metadata), event_id=f"otlp.{digest(key)}.warnings")
    return [patch]


# whole files


@dataclass
class Assembled:
    """Sessions built from a set of spans, and warnings: (span, what was wrong, its kind)."""

    sessions: list[Session] = field(default_factory=list)
    members: list[list[str]] = field(default_factory=list)
    """The span ids of each session."""
    warnings: list[tuple[Span | None, str, str]] = field(default_factory=list)


def sessions_from_spans(spans: Sequence[Span], group_by: str | None = None) -> Assembled:
    """Every session a complete set of spans holds (the importer's path). A span whose parent is not in
    the set is kept, with a warning; an event its session refuses is left out, with a warning."""
    out = Assembled()
    groups: dict[str, dict[str, Span]] = defaultdict(dict)
    for span, key in zip(spans, group_keys(spans, group_by, {}), strict=True):
        groups[key].setdefault(span.span_id, span)  # a span listed twice counts once
    for key, members in groups.items():
        try:
            out.sessions.append(_fold_group(key, list(members.values()), out.warnings))
        except MAPPING_ERRORS as exc:
            out.warnings.append((None, f"session {session_id_of(key)} left out: {exc}", UNUSABLE))
            continue
        out.members.append(list(members))
    return out


def _fold_group(key: str, spans: list[Span], warnings: list[tuple[Span | None, str, str]]) -> Session:
    ids = {s.span_id for s in spans}
    notes: list[str] = []
    for span in spans:
        if span.parent_span_id is not None and span.parent_span_id not in ids:
            notes.append(
                f"span {span.span_id} ({span.name}): parent {span.parent_span_id} is not in the file"
            )
            warnings.append((span, notes[-1], DANGLING))
    session = apply(None, opening(session_id_of(key), spans, key))
    calls: list[Event] = []
    feedback: list[Event] = []
    known = {s.span_id: s for s in spans}
    for span in ordered(spans):
        try:
            c, f = span_events(span, key, known)
        except MAPPING_ERRORS as exc:
            notes.append(f"span {span.span_id} ({span.name}) left out: {exc}")
            warnings.append((span, notes[-1], UNUSABLE))
            continue
        calls += c
        feedback += f
    for event in calls:
        session = _apply_or_warn(session, event, warnings, notes)
    root = root_of(spans)
    reason = "root span ended" if root is not None else "imported without a root span"
    for event in closing(session, root, key, reason) + feedback:
        session = _apply_or_warn(session, event, warnings, notes)
    for event in warnings_patch(session, notes, key):
        session = apply(session, event)
    return session


def _apply_or_warn(
    session: Session, event: Event, warnings: list[tuple[Span | None, str, str]], notes: list[str]
) -> Session:
    try:
        return apply(session, event)
    except (InvalidEvent, InvalidTransition) as exc:
        notes.append(f"event {event.event_id} left out: {exc}")
        warnings.append((None, notes[-1], REFUSED_EVENT))
        return session
