"""A session document as the events whose fold gives it, in the order things happened.

`document_events` is how `sessionrl sessions import` stores a session document (its own, or one an
importer made from another shape): the session's creation and plan first, then its calls and its
feedback merged by their own times (a call by when it ended, feedback by when it was received), the
output and the state changes at the session's end, and the feedback that arrived after it. Each list
of the document (tool calls, LLM calls, feedback) keeps its own order, which is the order its session
recorded them (the importers put their calls in time order); the merge interleaves the lists. Calls
that claim to end after the session did still come before its end (a finished session takes no call).
"""

from __future__ import annotations

import hashlib
import heapq
from datetime import datetime

from sessionrl.session.events import (
    Event,
    FeedbackAdded,
    LLMCallRecorded,
    OutputSet,
    PlanSet,
    SessionCreated,
    StateChanged,
    ToolCallRecorded,
)
from sessionrl.session.model import Session, SessionCreate, SessionState

S = SessionState
STATE_PATH: dict[SessionState, tuple[SessionState, ...]] = {
    S.CREATED: (),
    S.PLANNING: (S.PLANNING,),
    S.EXECUTING: (S.EXECUTING,),
    S.FINISHED: (S.FINISHED,),
    S.REJECTED: (S.REJECTED,),
    S.ARCHIVED: (S.FINISHED, S.ARCHIVED),
}
"""State changes that bring an imported document from `created` to its state."""


def document_events(s: Session) -> list[Event]:
    """Events whose fold has the content of a session document, in time order (see the module doc).

    Versions are renumbered by the fold, and an archived session is taken through `finished`. Event ids
    are derived from the session id, so importing the same document twice stores it once.
    """
    create = SessionCreate(
        user_query=s.user_query, session_id=s.session_id, trace_id=s.trace_id, scenario=s.scenario,
        tags=s.tags, user_id=s.user_id, metadata=s.metadata,
    )  # fmt: skip
    head: list[Event] = [
        SessionCreated(session_id=s.session_id, trace_id=s.trace_id, create=create, at=s.created_at)
    ]
    if s.plan is not None:
        head.append(PlanSet(plan=s.plan, at=s.created_at))
    tools: list[tuple[datetime, Event]] = [
        (c.finished_at, ToolCallRecorded(call=c, at=c.finished_at)) for c in s.tool_calls
    ]
    llms: list[tuple[datetime, Event]] = [
        (c.finished_at, LLMCallRecorded(call=c, at=c.finished_at)) for c in s.llm_calls
    ]
    ended = s.state in (S.FINISHED, S.REJECTED, S.ARCHIVED)
    early: list[tuple[datetime, Event]] = []
    after: list[tuple[datetime, Event]] = []
    for f in s.feedback:
        (after if ended and f.received_at > s.updated_at else early).append(
            (f.received_at, FeedbackAdded(feedback=f, at=f.received_at))
        )
    during = heapq.merge(tools, llms, early, key=lambda pair: pair[0])
    end: list[Event] = []
    if s.final_output is not None:
        end.append(OutputSet(output=s.final_output, at=s.updated_at))
    end += [StateChanged(state=state, at=s.updated_at) for state in STATE_PATH[s.state]]
    events = [*head, *(e for _, e in during), *end, *(e for _, e in after)]
    key = hashlib.sha256(s.session_id.encode()).hexdigest()[:24]
    return [e.model_copy(update={"event_id": f"imp_{key}_{i}"}) for i, e in enumerate(events)]
