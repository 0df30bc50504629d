"""Group commit: concurrent appends share transactions, and each caller still gets its own answer."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from sessionrl.errors import StaleState
from sessionrl.session import (
    CallStatus,
    SessionCreate,
    SessionState,
    StateChanged,
    ToolCall,
    ToolCallRecorded,
)
from sessionrl.session import created as created_event
from sessionrl.store import SessionStore
from sessionrl.store.group_commit import GroupCommitter


def call(call_id: str) -> ToolCallRecorded:
    return ToolCallRecorded(call=ToolCall(call_id=call_id, tool="t", status=CallStatus.SUCCESS))


def test_appends_waiting_together_share_one_commit(running: SessionStore) -> None:
    with GroupCommitter(running) as committer:
        with running._db.lock:  # the committer cannot commit while we hold the writer
            futures = [committer.submit("s1", call(f"c{i}")) for i in range(2, 52)]
        versions = [f.result(timeout=10).state_version for f in futures]
        # at most the first append went alone; everything queued behind it went in one batch
        assert committer.batches <= 2
    assert versions == list(range(5, 55))
    assert len(running.get("s1").tool_calls) == 51


def test_each_caller_gets_its_own_error(running: SessionStore) -> None:
    with GroupCommitter(running) as committer:
        with running._db.lock:
            ok = committer.submit("s1", call("c2"), expected_version=4)
            stale = committer.submit("s1", call("c3"), expected_version=4)
            also_ok = committer.submit("s1", call("c4"))
        assert ok.result(timeout=10).state_version == 5
        with pytest.raises(StaleState):
            stale.result(timeout=10)
        assert also_ok.result(timeout=10).state_version == 6


def test_threads_lose_nothing(file_store: SessionStore) -> None:
    with GroupCommitter(file_store) as committer:

        def work(n: int) -> None:
            sid = f"t{n}"
            committer.append(sid, created_event(SessionCreate(user_query="q", session_id=sid)))
            committer.append(sid, StateChanged(state=SessionState.EXECUTING))
            for k in range(20):
                committer.append(sid, call(f"c{k}"))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # created (1) + executing (2) + 20 calls
    assert [file_store.get(f"t{n}").state_version for n in range(6)] == [22] * 6


async def test_coroutines_append_without_blocking_the_loop(store: SessionStore) -> None:
    with GroupCommitter(store) as committer:
        sessions = await asyncio.gather(
            *(
                committer.append_async(
                    f"a{i}", created_event(SessionCreate(user_query="q", session_id=f"a{i}"))
                )
                for i in range(20)
            )
        )
    assert sorted(s.session_id for s in sessions) == sorted(f"a{i}" for i in range(20))
    assert len(store.session_ids()) == 20


def test_close_commits_what_was_submitted_then_refuses_more(running: SessionStore) -> None:
    committer = GroupCommitter(running)
    futures = [committer.submit("s1", call(f"c{i}")) for i in range(2, 12)]
    committer.close()
    assert all(f.done() for f in futures)
    assert running.get("s1").state_version == 14  # 4 + 10 calls
    with pytest.raises(RuntimeError):
        committer.submit("s1", call("late"))


def test_a_failed_transaction_fails_every_waiter(db_url: str) -> None:
    store = SessionStore.open(db_url)
    store.close()
    with GroupCommitter(store) as committer:
        future = committer.submit("s1", call("c1"))
        with pytest.raises(sqlite3.ProgrammingError):
            future.result(timeout=10)
    assert committer.batches == 0
