"""Helpers the store tests share: plain SQL beside a store, on either backend."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

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

FreshURL = Callable[[], AbstractContextManager[str]]
"""`with fresh_url() as url:` an empty store's URL on the test's backend (the `fresh_url` fixture)."""


class RawDB:
    """Plain SQL (`?` parameters) on a store's database, beside the store, each statement committed."""

    def __init__(self, url: str) -> None:
        self.url = url

    @contextmanager
    def connect(self) -> Iterator[Any]:
        """A connection in one transaction, committed when the block ends."""
        if self.url.startswith("sqlite:///"):
            conn = sqlite3.connect(self.url[len("sqlite:///") :])
            with conn:
                yield conn
            conn.close()
            return
        import psycopg

        from sessionrl.store.postgres import PostgresConnection

        with psycopg.connect(self.url) as raw:
            yield PostgresConnection(raw)

    def rows(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        """The rows of one statement."""
        with self.connect() as conn:
            cursor = conn.execute(sql, params)
            return [tuple(r) for r in cursor.fetchall()] if cursor.description else []

    def run(self, sql: str, *params: object) -> int:
        """Run one statement; how many rows it changed."""
        with self.connect() as conn:
            return int(conn.execute(sql, params).rowcount)


def start_session(store: SessionStore, sid: str = "s1") -> None:
    """Create `sid`, give it a one-step plan, start executing and record tool call `c1` (version 4)."""
    store.create(SessionCreate(user_query="Hb 9.1, MCV 72", session_id=sid, scenario="clinic", tags=("lab",)))
    plan = Plan(root_goal="triage", subgoals=(SubGoal(id="g1", description="parse", tool="lab_parser"),))
    store.append(sid, PlanSet(plan=plan))
    store.append(sid, StateChanged(state=SessionState.EXECUTING))
    call = ToolCall(call_id="c1", subgoal_id="g1", tool="lab_parser", status=CallStatus.SUCCESS)
    store.append(sid, ToolCallRecorded(call=call))
