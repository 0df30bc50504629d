"""What the store hands back besides sessions: logged events, changes, rewards and query rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sessionrl.session.events import Event
from sessionrl.session.model import SessionState


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event of a session's log, with where and when it was stored.

    `schema_version` is the version the event was written under; `event` is always the current form.
    """

    session_id: str
    seq: int
    event_id: str
    type: str
    schema_version: int
    at: datetime
    event: Event


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the change feed.

    For events, `seq` is the event's sequence number in its session (its state_version). For a saved
    reward (`type == "reward"`), `seq` is the new reward version.
    """

    cursor: int
    session_id: str
    seq: int
    type: str
    at: datetime


@dataclass(frozen=True, slots=True)
class ChangeBatch:
    """Changes after a cursor, and the cursor to pass next time (unchanged when there were none)."""

    changes: list[Change]
    cursor: int


@dataclass(frozen=True, slots=True)
class RewardRecord:
    """One saved reward vector. Versions count 1, 2, ... per session; older ones are kept."""

    session_id: str
    version: int
    ruleset_version: str
    session_version: int
    """The session's state_version when the reward was saved (later feedback makes it stale)."""
    vector: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SessionRow:
    """One row of the `sessions` query table: a session's summary, as of its last projection."""

    session_id: str
    trace_id: str
    state: SessionState
    scenario: str | None
    tags: tuple[str, ...]
    user_id: str | None
    user_query: str
    root_goal: str | None
    n_subgoals: int
    n_tool_calls: int
    n_llm_calls: int
    n_feedback: int
    final_output: str | None
    state_version: int
    created_at: datetime
    updated_at: datetime
