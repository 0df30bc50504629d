"""Human takeover: a session parked for a person, and its resumption when the person posts the next step.

Parking writes one `session_patched` event: the tag `needs_human` and `metadata["takeover"]` (when, why,
the trace id). Because it is an event in the store, a parked session stays parked across a restart, and
`sessionrl sessions query --tag needs_human` (or `GET /v1/policies/takeover`) finds it. While parked, no
step asks the policy: each such step fails with a `policy_error` naming the takeover. A person resumes the
session by posting its next step (`POST /v1/policies/takeover/{session_id}/steps`, a plan, a tool call
or a recorded reply, as the session API takes them): the step runs, then the tag comes off.
"""

from __future__ import annotations

from typing import Any

from sessionrl.session.model import Session, SessionPatch, utcnow

NEEDS_HUMAN = "needs_human"
"""The tag of a parked session."""
TAKEOVER_KEY = "takeover"
"""Session metadata key of the takeover's record."""


def is_parked(session: Session) -> bool:
    """Whether the session waits for a person."""
    return NEEDS_HUMAN in session.tags


def park_patch(session: Session, reason: str) -> SessionPatch:
    """The patch that parks `session` (its tags and metadata, with the takeover's record)."""
    record: dict[str, Any] = {
        "parked_at": utcnow().isoformat(),
        "reason": reason,
        "trace_id": session.trace_id,
    }
    tags = (*[t for t in session.tags if t != NEEDS_HUMAN], NEEDS_HUMAN)
    return SessionPatch(tags=tags, metadata={**session.metadata, TAKEOVER_KEY: record})


def resume_patch(session: Session, by: str) -> SessionPatch:
    """The patch that resumes a parked session, noting who took the step."""
    record = dict(session.metadata.get(TAKEOVER_KEY) or {})
    record |= {"resumed_at": utcnow().isoformat(), "resumed_by": by}
    tags = tuple(t for t in session.tags if t != NEEDS_HUMAN)
    return SessionPatch(tags=tags, metadata={**session.metadata, TAKEOVER_KEY: record})
