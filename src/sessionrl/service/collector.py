"""How a running service schedules Python's cyclic garbage collector.

A service holds many long-lived objects (each cached session's latest version lives until that
session's next step) and makes almost no cyclic garbage: what it frees, reference counting frees. The
collector's default schedule still walks the survivors again and again: each young collection promotes
them, every tenth walks everything promoted since the last, and a full collection walks the whole heap.
Under step load those walks are long, no thread runs Python while they last, and they were the longest
stalls a request saw.

While `tuned_collector()` is open:

- the youngest generation is collected at most every `YOUNG_GC_THRESHOLD` allocations;
- after every collection the survivors are frozen (`gc.freeze`): no later collection walks them again,
  and each is still freed the moment nothing refers to it;
- `full_collection()` thaws them and collects everything, which reclaims any cycle that became garbage
  after it was frozen. A service runs it every `ServiceConfig.full_gc_every_s` seconds
  (`scheduled_collector`): that is then the only long walk, and a rare one.

When the last open block ends (two services in one process may stop in any order), the thresholds
before the first come back and everything frozen is thawed (a freeze made before it, for a fork say,
is thawed too).

Freezing shortens the latency tail without costing throughput (`bench/orchestrator.py` prints the GC
pauses by generation beside the step latencies). Collections while serving find next to no garbage, so
little waits for the full collection; its one walk grows with the number of objects the cached sessions
hold.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

YOUNG_GC_THRESHOLD = 20_000
"""Allocations between collections of the youngest generation while a service runs (Python's default: 700).

A request allocates hundreds of container objects, nearly all freed at once by reference counting. At
the default the collector runs every few requests, which costs server CPU per step and lengthens the
latency tail.
"""


FULL_GC_EVERY_S = 600.0
"""Seconds between a service's full collections, unless configured (`ServiceConfig.full_gc_every_s`)."""


@contextmanager
def tuned_collector(young_threshold: int = YOUNG_GC_THRESHOLD) -> Iterator[None]:
    """Collect the youngest generation at most every `young_threshold` allocations (a higher threshold
    already set is kept) and freeze the survivors of every collection, inside the block."""
    _TUNING.enter(young_threshold)
    try:
        yield
    finally:
        _TUNING.leave()


class _Tuning:
    """The `tuned_collector` blocks open in the process, whose collector they share (two services in one
    process may stop in any order): the first to open saves the thresholds and starts freezing, the last
    to close restores them and thaws everything."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.blocks = 0
        self.saved = gc.get_threshold()

    def enter(self, young_threshold: int) -> None:
        with self.lock:
            if self.blocks == 0:
                self.saved = gc.get_threshold()
                gc.callbacks.append(_freeze_survivors)
            self.blocks += 1
            young, *older = gc.get_threshold()
            gc.set_threshold(max(young_threshold, young), *older)

    def leave(self) -> None:
        with self.lock:
            self.blocks -= 1
            if self.blocks == 0:
                gc.callbacks.remove(_freeze_survivors)
                gc.set_threshold(*self.saved)
                gc.unfreeze()


_TUNING = _Tuning()


def full_collection() -> int:
    """Thaw every frozen object and collect all generations; the number of unreachable objects found.
    (Inside `tuned_collector` the survivors are frozen again as the collection ends.)"""
    gc.unfreeze()
    return gc.collect()


@asynccontextmanager
async def scheduled_collector(full_every_s: float) -> AsyncIterator[None]:
    """`tuned_collector` for the block, and a `full_collection` every `full_every_s` seconds on the
    running event loop."""

    async def every() -> None:
        while True:
            await asyncio.sleep(full_every_s)
            full_collection()

    with tuned_collector():
        task = asyncio.create_task(every())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.wait([task])


def _freeze_survivors(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop":
        gc.freeze()
