"""The garbage collector's schedule while a service runs: young collections less often, survivors frozen
until the next full collection."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest
from service_support import make_app, serving

from sessionrl.service.collector import (
    YOUNG_GC_THRESHOLD,
    full_collection,
    scheduled_collector,
    tuned_collector,
)


class Node:
    """A container that can refer to itself."""

    def __init__(self) -> None:
        self.ref: Node | None = None


@pytest.fixture
def defaults() -> Iterator[tuple[int, int, int]]:
    """Python's thresholds and no frozen objects for the test, whatever the process had; the process's
    own thresholds restored after."""
    before = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*before)


def cycle() -> weakref.ref[Node]:
    """A self-referencing node no one else holds, alive until a collection walks it."""
    node = Node()
    node.ref = node
    return weakref.ref(node)


async def test_a_running_service_tunes_the_collector_and_restores_it(defaults: tuple[int, int, int]) -> None:
    callbacks = list(gc.callbacks)
    async with serving(make_app()) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert gc.get_threshold() == (YOUNG_GC_THRESHOLD, 10, 10)
        gc.collect(0)
        assert gc.get_freeze_count() > 0  # the survivors of that collection
        metrics = (await client.get("/metrics")).text
        assert "sessionrl_gc_frozen_objects " in metrics
    assert gc.get_threshold() == defaults
    assert gc.get_freeze_count() == 0
    assert gc.callbacks == callbacks


def test_a_higher_threshold_is_kept_and_the_old_ones_come_back(defaults: tuple[int, int, int]) -> None:
    with tuned_collector(5_000):
        assert gc.get_threshold() == (5_000, 10, 10)
        with tuned_collector(1_000):
            assert gc.get_threshold() == (5_000, 10, 10)
        assert gc.get_threshold() == (5_000, 10, 10)
    assert gc.get_threshold() == defaults


def test_a_frozen_cycle_waits_for_the_full_collection(defaults: tuple[int, int, int]) -> None:
    node = Node()
    node.ref = node
    dropped = weakref.ref(node)
    with tuned_collector():
        gc.collect()  # the node survives (it is still held) and is frozen
        del node
        gc.collect()
        assert dropped() is not None  # garbage now, but frozen: no ordinary collection walks it
        assert full_collection() >= 1
        assert dropped() is None
        garbage = cycle()
        gc.collect(0)  # what is garbage at a collection is reclaimed as usual
        assert garbage() is None


async def test_the_scheduled_full_collection_reclaims_frozen_cycles(defaults: tuple[int, int, int]) -> None:
    node = Node()
    node.ref = node
    dropped = weakref.ref(node)
    async with scheduled_collector(full_every_s=0.01):
        gc.collect()
        del node
        async with asyncio.timeout(30):
            while dropped() is not None:
                await asyncio.sleep(0.01)
    assert gc.get_freeze_count() == 0


def test_blocks_closed_out_of_order_restore_the_collector_when_the_last_one_closes(
    defaults: tuple[int, int, int],
) -> None:
    callbacks = list(gc.callbacks)
    first, second = tuned_collector(1_000), tuned_collector(5_000)
    first.__enter__()
    second.__enter__()
    assert gc.get_threshold() == (5_000, 10, 10)
    first.__exit__(None, None, None)  # the first service stops while the second still runs
    gc.collect(0)
    assert gc.get_threshold() == (5_000, 10, 10)
    assert gc.get_freeze_count() > 0
    second.__exit__(None, None, None)
    assert gc.get_threshold() == defaults
    assert gc.get_freeze_count() == 0
    assert gc.callbacks == callbacks
