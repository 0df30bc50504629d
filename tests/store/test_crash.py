"""Kill a writer with SIGKILL at random moments: every acknowledged event survives, nothing half-written does.

A forked child appends events to a store (a file, or a PostgreSQL schema) and reports each acknowledged
`(session_id, seq)` through a pipe right after the call returns. The parent kills it at a random moment,
reopens the store and checks what survived. Databases are reused for several trials, so recovery after a
crash is itself crashed into.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from multiprocessing.connection import Connection

import pytest
from store_support import FreshURL

from sessionrl.session import (
    CallStatus,
    Feedback,
    FeedbackAdded,
    FeedbackType,
    SessionCreate,
    SessionState,
    StateChanged,
    ToolCall,
    ToolCallRecorded,
    fold,
)
from sessionrl.session.codec import digest
from sessionrl.store import SessionStore

pytestmark = pytest.mark.slow

TRIALS = {"sqlite": 100, "postgresql": 40}
"""Trials per backend: on PostgreSQL the writer's transactions end in the server, so fewer trials cover
the same ground (a kill leaves an open transaction for the server to roll back, not a file to recover)."""
TRIALS_PER_DB = 5
CHILD_LIMIT_S = 5.0
"""A child that is somehow not killed stops by itself after this long."""


def write_forever(url: str, trial: int, acks: Connection) -> None:
    """The child: open sessions and append to them until killed, acknowledging each write."""
    rng = random.Random(trial)
    deadline = time.monotonic() + CHILD_LIMIT_S
    with SessionStore.open(url) as store:
        n = 0
        while time.monotonic() < deadline:
            sid = f"t{trial}.s{n}"
            acks.send((sid, store.create(SessionCreate(user_query="q", session_id=sid)).state_version))
            acks.send((sid, store.append(sid, StateChanged(state=SessionState.EXECUTING)).state_version))
            for k in range(rng.randint(2, 10)):
                write_one(store, rng, sid, k, acks)
            acks.send((sid, store.append(sid, StateChanged(state=SessionState.FINISHED)).state_version))
            n += 1
    os._exit(0)


def write_one(store: SessionStore, rng: random.Random, sid: str, k: int, acks: Connection) -> None:
    """One random write: a tool call, feedback, a batch of calls, a reward, or a projection run."""
    status = rng.choice(list(CallStatus))
    roll = rng.random()
    if roll < 0.5:
        call = ToolCall(call_id=f"c{k}", tool="crp_test_request", status=status, output={"k": k})
        acks.send((sid, store.append(sid, ToolCallRecorded(call=call)).state_version))
    elif roll < 0.7:
        fb = Feedback(type=FeedbackType.HUMAN_RATING, score=rng.randint(1, 5), comment="chronic disease")
        acks.send((sid, store.append(sid, FeedbackAdded(feedback=fb)).state_version))
    elif roll < 0.85:
        calls = [ToolCall(call_id=f"b{k}.{i}", tool="lab", status=status) for i in range(3)]
        results = store.append_batch([(sid, ToolCallRecorded(call=c), None) for c in calls])
        for result in results:
            assert not isinstance(result, Exception), result
            acks.send((sid, result.state_version))
    elif roll < 0.93:
        store.save_reward(sid, {"session": rng.random()}, "rules-1")
    else:
        store.project()


def run_trial(url: str, trial: int, rng: random.Random) -> list[tuple[str, int]]:
    """Start a writer, kill it after a random delay, return what it acknowledged."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=write_forever, args=(url, trial, send))
    child.start()
    send.close()
    assert receive.poll(timeout=20), "the writer acknowledged nothing"
    time.sleep(rng.uniform(0.0, 0.05))
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join()
    assert child.exitcode == -signal.SIGKILL, "the writer ended before it was killed"
    acked: list[tuple[str, int]] = []
    while receive.poll():
        try:
            acked.append(receive.recv())
        except EOFError:
            break
    receive.close()
    return acked


def check_survivors(url: str, trial: int, acked: list[tuple[str, int]]) -> None:
    """Every acknowledged event is there, every session of the trial folds, the store is consistent."""
    with SessionStore.open(url) as store:
        for sid, seq in acked:
            assert store.get(sid).state_version >= seq, (sid, seq)
        for sid in (s for s in store.session_ids() if s.startswith(f"t{trial}.")):
            log = store.events(sid)
            assert [e.seq for e in log] == list(range(1, len(log) + 1))
            assert digest(fold(e.event for e in log)) == digest(store.get(sid))
        report = store.consistency_check()
        assert report.clean, report.drift


def test_acknowledged_writes_survive_sigkill(store_backend: str, fresh_url: FreshURL) -> None:
    rng = random.Random(2026)
    trials = TRIALS[store_backend]
    total = 0
    for first in range(0, trials, TRIALS_PER_DB):
        with fresh_url() as url:
            for trial in range(first, first + TRIALS_PER_DB):
                acked = run_trial(url, trial, rng)
                total += len(acked)
                check_survivors(url, trial, acked)
    assert total >= trials  # every trial acknowledged at least its first write
