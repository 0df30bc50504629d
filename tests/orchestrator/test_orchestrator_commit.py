"""Group commit: concurrent units share transactions, and each caller gets its own results."""

from __future__ import annotations

import asyncio

from sessionrl.errors import InvalidTransition, NotFound
from sessionrl.orchestrator.commit import GroupCommitter
from sessionrl.session import Session, SessionCreate, StateChanged, created
from sessionrl.store import SessionStore


async def test_concurrent_units_are_committed_in_fewer_transactions(store: SessionStore) -> None:
    committer = GroupCommitter(store, max_events=1000)
    events = [created(SessionCreate(user_query="q", session_id=f"s{i}")) for i in range(50)]
    results = await asyncio.gather(*(committer.commit([(e.session_id, e, None)]) for e in events))
    await committer.aclose()
    sessions = [r[0] for r in results]
    assert all(isinstance(s, Session) for s in sessions)
    assert [s.session_id for s in sessions if isinstance(s, Session)] == [f"s{i}" for i in range(50)]
    assert committer.events == 50
    # the first unit is written alone while the other 49 queue, then they share the next transaction
    assert committer.batches < 50
    assert len(store.session_ids()) == 50


async def test_each_write_gets_its_own_result_or_error(store: SessionStore) -> None:
    committer = GroupCommitter(store)
    first = created(SessionCreate(user_query="q", session_id="s1"))
    await committer.commit([("s1", first, None)])
    ok, bad, missing = await asyncio.gather(
        committer.commit([("s1", StateChanged(state="executing"), None)]),
        committer.commit([("s1", StateChanged(state="archived"), None)]),
        committer.commit([("nope", StateChanged(state="executing"), None)]),
    )
    await committer.aclose()
    assert isinstance(ok[0], Session)
    assert ok[0].state == "executing"
    assert isinstance(bad[0], InvalidTransition)
    assert isinstance(missing[0], NotFound)


async def test_a_batch_never_exceeds_its_event_limit(store: SessionStore) -> None:
    committer = GroupCommitter(store, max_events=4)
    events = [created(SessionCreate(user_query="q", session_id=f"s{i}")) for i in range(12)]
    await asyncio.gather(*(committer.commit([(e.session_id, e, None)]) for e in events))
    await committer.aclose()
    # 12 events at most 4 per transaction: at least 3 transactions
    assert committer.batches >= 3
    assert committer.events == 12


async def staggered_commits(committer: GroupCommitter, n: int) -> None:
    """`n` units, the k-th sent after k turns of the event loop (steps a little behind one another)."""

    async def send(k: int) -> None:
        for _ in range(k):
            await asyncio.sleep(0)
        event = created(SessionCreate(user_query="q", session_id=f"s{k}"))
        await committer.commit([(event.session_id, event, None)])

    await asyncio.gather(*(send(k) for k in range(n)))


async def test_units_on_their_way_join_the_transaction(store: SessionStore) -> None:
    committer = GroupCommitter(store, gather_s=5.0)
    await staggered_commits(committer, 6)
    await committer.aclose()
    # each turn brings one more unit, so the writer keeps yielding until all six are queued
    assert (committer.batches, committer.events) == (1, 6)


async def test_without_gathering_each_turn_starts_its_own_transaction(store: SessionStore) -> None:
    committer = GroupCommitter(store, gather_s=0.0)
    await staggered_commits(committer, 6)
    await committer.aclose()
    assert committer.batches > 1
    assert committer.events == 6


async def test_gathering_stops_at_the_event_limit(store: SessionStore) -> None:
    committer = GroupCommitter(store, max_events=2, gather_s=5.0)
    await staggered_commits(committer, 6)
    await committer.aclose()
    assert committer.batches >= 3
    assert committer.events == 6
