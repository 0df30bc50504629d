"""Kill a writer with SIGKILL at a random moment and count what survived (the store's crash test and
`bench/chaos.py` both run these trials).

A forked child appends events to a store (a file, or a PostgreSQL database) and reports each acknowledged
`(session_id, seq)` through a pipe right after the call returns. The parent kills it, reopens the store
and checks that every acknowledged event is there, that every session of the trial folds from its log
to its stored view, and that the store is consistent (`survivors`).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

from sessionrl.errors import NotFound
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
from sessionrl.store.hot import SessionStore

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
            if isinstance(result, Exception):
                raise result
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
    if not receive.poll(timeout=20):
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        raise RuntimeError("the writer acknowledged nothing")
    time.sleep(rng.uniform(0.0, 0.05))
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join()
    if child.exitcode != -signal.SIGKILL:
        raise RuntimeError(f"the writer ended before it was killed (exit code {child.exitcode})")
    acked: list[tuple[str, int]] = []
    while receive.poll():
        try:
            acked.append(receive.recv())
        except EOFError:
            break
    receive.close()
    return acked


@dataclass(frozen=True, slots=True)
class Survival:
    """What one trial's store holds after the kill."""

    acknowledged: int
    """Writes the writer acknowledged before it died."""
    lost: int
    """Acknowledged writes the store does not hold."""
    broken: tuple[str, ...]
    """Sessions of the trial whose log has a gap or does not fold to the stored view."""
    drift: tuple[str, ...]
    """What `consistency_check` found wrong (empty when the store is consistent)."""

    @property
    def intact(self) -> bool:
        return not (self.lost or self.broken or self.drift)


def survivors(url: str, trial: int, acked: list[tuple[str, int]]) -> Survival:
    """Check the store after trial `trial`'s writer was killed, having acknowledged `acked`."""
    with SessionStore.open(url) as store:
        lost = sum(1 for sid, seq in acked if _version(store, sid) < seq)
        broken = []
        for sid in (s for s in store.session_ids() if s.startswith(f"t{trial}.")):
            log = store.events(sid)
            in_order = [e.seq for e in log] == list(range(1, len(log) + 1))
            if not in_order or digest(fold(e.event for e in log)) != digest(store.get(sid)):
                broken.append(sid)
        report = store.consistency_check()
    return Survival(len(acked), lost, tuple(broken), tuple(str(d) for d in report.drift))


def _version(store: SessionStore, session_id: str) -> int:
    """The stored version of a session, 0 when it is not stored."""
    try:
        return store.get(session_id).state_version
    except NotFound:
        return 0
