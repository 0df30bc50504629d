"""Fixtures for the store tests: an in-memory store, a file store, and a session that is running."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from sessionrl.session import (
    CallStatus,
    Plan,
    PlanSet,
    SessionCreate,
    SessionState,
    StateChanged,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
)
from sessionrl.store import SessionStore


@pytest.fixture
def store() -> Iterator[SessionStore]:
    with SessionStore.open("sqlite://") as s:
        yield s


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
def db_url(db_path: Path) -> str:
    return f"sqlite:///{db_path}"


@pytest.fixture
def file_store(db_url: str) -> Iterator[SessionStore]:
    with SessionStore.open(db_url) as s:
        yield s


def start_session(store: SessionStore, sid: str = "s1") -> None:
    """Create `sid`, give it a one-step plan, start executing and record tool call `c1` (version 4)."""
    store.create(SessionCreate(user_query="Hb 9.1, MCV 72", session_id=sid, scenario="clinic", tags=("lab",)))
    plan = Plan(root_goal="triage", subgoals=(SubGoal(id="g1", description="parse", tool="lab_parser"),))
    store.append(sid, PlanSet(plan=plan))
    store.append(sid, StateChanged(state=SessionState.EXECUTING))
    call = ToolCall(call_id="c1", subgoal_id="g1", tool="lab_parser", status=CallStatus.SUCCESS)
    store.append(sid, ToolCallRecorded(call=call))


@pytest.fixture
def running(store: SessionStore) -> SessionStore:
    """The in-memory store holding session `s1`, executing, at state_version 4, with tool call `c1`."""
    start_session(store)
    return store


@pytest.fixture
def file_running(file_store: SessionStore) -> SessionStore:
    """The file store holding session `s1` as in `running`."""
    start_session(file_store)
    return file_store


V1_AT = "2024-05-01T10:00:00Z"


def write_v1_session(path: Path, sid: str, root_goal: str, subgoals: list[str]) -> None:
    """Write, with plain SQL, a session as a schema-v1 store held it: plan sub-goals as bare strings.

    The log has the session's creation and its v1 plan; the materialised document is v1 throughout.
    """
    create: dict[str, Any] = {"user_query": "old question", "session_id": sid, "tags": [], "metadata": {}}
    created: dict[str, Any] = {
        "type": "session_created",
        "event_id": f"{sid}.e1",
        "at": V1_AT,
        "session_id": sid,
    }
    created |= {"trace_id": "0" * 31 + "1", "create": create}
    plan: dict[str, Any] = {"root_goal": root_goal, "subgoals": subgoals}
    plan_set: dict[str, Any] = {"type": "plan_set", "event_id": f"{sid}.e2", "at": V1_AT, "plan": plan}
    head: dict[str, Any] = {
        "session_id": sid,
        "trace_id": created["trace_id"],
        "scenario": None,
        "tags": [],
        "user_id": None,
    }
    head |= {"user_query": "old question", "metadata": {}, "created_at": V1_AT, "updated_at": V1_AT}
    shards = {
        "plan": {"plan": plan},
        "execution": {"tool_calls": [], "llm_calls": [], "final_output": None},
        "feedback": {"feedback": []},
    }
    with sqlite3.connect(path) as conn:
        for seq, event in ((1, created), (2, plan_set)):
            conn.execute(
                "INSERT INTO events (session_id, seq, event_id, type, schema_version, at, payload)"
                " VALUES (?, ?, ?, ?, 1, ?, ?)",
                (sid, seq, event["event_id"], event["type"], V1_AT, orjson.dumps(event).decode()),
            )
            conn.execute(
                "INSERT INTO outbox (session_id, seq, type, at) VALUES (?, ?, ?, ?)",
                (sid, seq, event["type"], V1_AT),
            )
        conn.execute(
            "INSERT INTO session_head VALUES (?, 1, 'created', 2, 1, 0, 0, ?)",
            (sid, orjson.dumps(head).decode()),
        )
        conn.executemany(
            "INSERT INTO session_shard VALUES (?, ?, ?)",
            [(sid, name, orjson.dumps(doc).decode()) for name, doc in shards.items()],
        )
    conn.close()


@pytest.fixture
def write_v1() -> Callable[[Path, str, str, list[str]], None]:
    """`write_v1(db_path, session_id, root_goal, subgoals)` writes a schema-v1 session with plain SQL."""
    return write_v1_session
