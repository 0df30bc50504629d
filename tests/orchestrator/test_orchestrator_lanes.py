"""Lanes bound concurrency and waiting; routing is stable."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from sessionrl.orchestrator.config import LaneConfig
from sessionrl.orchestrator.lanes import Lane, Overloaded, route


async def test_a_lane_runs_at_most_its_concurrency_and_refuses_past_its_waiting_room() -> None:
    lane = Lane("tool", LaneConfig(concurrency=2, max_waiting=1))
    release = asyncio.Event()
    peak = 0

    async def hold() -> None:
        nonlocal peak
        async with lane.slot():
            peak = max(peak, lane.running)
            await release.wait()

    holders = [asyncio.create_task(hold()) for _ in range(3)]  # two run, one waits
    await asyncio.sleep(0)
    assert lane.running == 2
    with pytest.raises(Overloaded, match="1 steps already waiting"):
        async with lane.slot():
            pass
    release.set()
    await asyncio.gather(*holders)
    assert peak == 2
    assert lane.running == 0


async def test_a_released_slot_goes_to_the_longest_waiter_and_cancelled_waiters_leak_nothing() -> None:
    lane = Lane("tool", LaneConfig(concurrency=1, max_waiting=8))
    order: list[str] = []
    release = asyncio.Event()

    async def hold(name: str) -> None:
        async with lane.slot():
            order.append(name)
            await release.wait()

    first = asyncio.create_task(hold("first"))
    await asyncio.sleep(0)
    gone = asyncio.create_task(hold("gone"))  # waits, then is cancelled while waiting
    second, third = asyncio.create_task(hold("second")), asyncio.create_task(hold("third"))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, second, third)
    assert gone.cancelled()
    assert order == ["first", "second", "third"]
    assert lane.running == 0
    async with lane.slot():  # the one slot is free again: taken at once
        assert lane.running == 1


async def test_a_waiter_cancelled_after_being_handed_the_slot_passes_it_on() -> None:
    lane = Lane("tool", LaneConfig(concurrency=1, max_waiting=8))
    entered: list[str] = []

    async def hold(name: str) -> None:
        async with lane.slot():
            entered.append(name)

    held = lane.slot()
    await held.__aenter__()
    handed, next_one = asyncio.create_task(hold("handed")), asyncio.create_task(hold("next"))
    await asyncio.sleep(0)
    await held.__aexit__(None, None, None)  # the slot goes to `handed`, which has not run yet
    handed.cancel()
    async with asyncio.timeout(5):  # a lost slot would leave `next` waiting forever
        await asyncio.gather(handed, next_one, return_exceptions=True)
    assert handed.cancelled()
    assert entered == ["next"]
    assert lane.running == 0


async def test_a_cancelled_waiter_leaves_the_waiting_room() -> None:
    lane = Lane("tool", LaneConfig(concurrency=1, max_waiting=1))
    held = lane.slot()
    await held.__aenter__()
    waiter = asyncio.create_task(held_briefly(lane))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    admitted = asyncio.create_task(held_briefly(lane))  # the room has a place again: no Overloaded
    await asyncio.sleep(0)
    await held.__aexit__(None, None, None)
    await admitted
    assert lane.running == 0


async def held_briefly(lane: Lane) -> None:
    async with lane.slot():
        await asyncio.sleep(0)


def test_routing_is_stable_and_spreads_sessions() -> None:
    assert [route("s_abc", 4) for _ in range(3)] == [route("s_abc", 4)] * 3
    counts = Counter(route(f"s_{i}", 4) for i in range(4000))
    # 4000 sessions over 4 backends: about 1000 each; a stable hash stays well within ±20%
    assert all(800 < n < 1200 for n in counts.values())
