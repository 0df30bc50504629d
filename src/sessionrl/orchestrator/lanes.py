"""Lanes and backend routing: how the engine shares one process between many sessions.

Each step kind has its own lane (a bounded semaphore with a bounded waiting room), so a burst of slow tool
calls fills the tool lane and never delays an LLM step. `route` pins a session to one policy backend.

>>> route("s_1", 4) == route("s_1", 4)
True
>>> sorted({route(f"s_{i}", 3) for i in range(100)})
[0, 1, 2]
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque

from sessionrl.errors import SessionRLError
from sessionrl.orchestrator.config import LaneConfig


class Overloaded(SessionRLError):
    """A lane's waiting room is full; the caller should retry later."""

    def __init__(self, lane: str, waiting: int) -> None:
        super().__init__(f"the {lane} lane is full ({waiting} steps already waiting); retry later")
        self.lane = lane
        self.waiting = waiting


class Lane:
    """At most `concurrency` holders at once, at most `max_waiting` waiting; more are refused at once.

    Waiters are served first come, first served: a released slot passes straight to the longest waiter.
    The lane keeps its own count and queue instead of an `asyncio.Semaphore`, whose `locked()` builds a
    generator on every acquire; a step takes a free slot without suspending.
    """

    def __init__(self, name: str, config: LaneConfig) -> None:
        self.name = name
        self._config = config
        self._free = config.concurrency
        self._queue: deque[asyncio.Future[None]] = deque()
        self.running = 0
        """Holders right now (for metrics and tests)."""

    def slot(self) -> _Held:
        """Hold one slot of the lane for an `async with` block; raise `Overloaded` if none can be had."""
        return _Held(self)

    async def _acquire(self) -> None:
        if self._free and not self._queue:
            self._free -= 1
            return
        if len(self._queue) >= self._config.max_waiting:
            raise Overloaded(self.name, len(self._queue))
        future = asyncio.get_running_loop().create_future()
        self._queue.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.cancelled():  # still queued, unless a release already skipped it
                with contextlib.suppress(ValueError):
                    self._queue.remove(future)
            else:  # handed a slot while being cancelled: pass it on
                self._release()
            raise

    def _release(self) -> None:
        while self._queue:
            future = self._queue.popleft()
            if not future.done():  # a cancelled waiter is done
                future.set_result(None)
                return
        self._free += 1


class _Held:
    """One slot of a lane, held for an `async with` block."""

    __slots__ = ("_lane",)

    def __init__(self, lane: Lane) -> None:
        self._lane = lane

    async def __aenter__(self) -> None:
        await self._lane._acquire()
        self._lane.running += 1

    async def __aexit__(self, *exc_info: object) -> None:
        self._lane.running -= 1
        self._lane._release()


def route(session_id: str, n_backends: int) -> int:
    """Index of the backend that serves `session_id`: a stable hash, the same in every process."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % n_backends
