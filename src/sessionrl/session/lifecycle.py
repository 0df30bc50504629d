"""The session lifecycle in one table, checked in one place.

>>> can_transition(SessionState.EXECUTING, SessionState.FINISHED)
True
>>> can_transition(SessionState.FINISHED, SessionState.EXECUTING)
False
"""

from __future__ import annotations

from sessionrl.session.model import SessionState

S = SessionState

TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    S.CREATED: frozenset({S.PLANNING, S.EXECUTING, S.FINISHED, S.REJECTED}),
    S.PLANNING: frozenset({S.EXECUTING, S.FINISHED, S.REJECTED}),
    S.EXECUTING: frozenset({S.PLANNING, S.FINISHED, S.REJECTED}),
    S.FINISHED: frozenset({S.ARCHIVED}),
    S.REJECTED: frozenset({S.ARCHIVED}),
    S.ARCHIVED: frozenset(),
}
"""Allowed state changes: `TRANSITIONS[current]` holds every state reachable in one step."""

ACTIVE: frozenset[SessionState] = frozenset({S.CREATED, S.PLANNING, S.EXECUTING})
"""States in which the agent still works: plans, calls and outputs are accepted."""

EVERY_STATE: frozenset[SessionState] = frozenset(SessionState)

ACCEPTS: dict[str, frozenset[SessionState]] = {
    "session_patched": EVERY_STATE,
    "plan_set": ACTIVE,
    "tool_call": ACTIVE,
    "llm_call": ACTIVE,
    "output_set": ACTIVE,
    "feedback": EVERY_STATE,
}
"""States in which each event type (other than state changes) is accepted. Feedback is always welcome."""

TERMINAL: frozenset[SessionState] = frozenset({S.FINISHED, S.REJECTED, S.ARCHIVED})


def can_transition(current: SessionState, target: SessionState) -> bool:
    """Whether a session in `current` may move to `target`."""
    return target in TRANSITIONS[current]


def accepts(state: SessionState, event_type: str) -> bool:
    """Whether a session in `state` accepts an event of `event_type` (state changes excluded)."""
    return state in ACCEPTS.get(event_type, frozenset())
