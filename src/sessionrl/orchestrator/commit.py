"""Group commit: the writes of concurrent steps share one store transaction, and so one durable sync.

Each step hands the committer a unit (its events, in order) and waits. One writer task takes every unit
queued so far (up to `max_events` events), appends them with `SessionStore.append_units` in a worker
thread, and wakes each step with its own results. A unit is written whole or not at all. The committer
keeps the record of its own appends (`OwnWrites`) that a unit's basis is checked against, so a unit
built on a session that another writer (another process, another engine) has changed since is refused
with `StaleState` instead of written on a view that is out of date. While one batch is being made
durable the next one gathers, so under load the cost of the sync is spread over many steps; alone, a
step pays it once.

Before it takes a batch, the writer also lets the units already on their way join it (`_gather`): it
yields to the event loop for as long as new units keep arriving. A transaction has a fixed cost besides
its events (its statements, the log append and the sync, and the hand-over to the worker thread), and on
a busy service the steps just behind the first are a few loop turns from the committer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from sessionrl.errors import SessionRLError
from sessionrl.session.events import Event
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.store.writes import OwnWrites, Unit

Write = tuple[str, Event, int | None]
"""One event to append: session id, event, expected version (None: append to whatever is stored)."""

Outcome = list[Session | SessionRLError]


class CommitterClosed(SessionRLError):
    """The committer was closed; nothing more is written."""


class GroupCommitter:
    """Batches units of writes from concurrent callers into single store transactions."""

    def __init__(
        self, store: SessionStore, *, max_events: int = 256, gather_s: float = 0.002, sessions: int = 10_000
    ) -> None:
        self._store = store
        self._max_events = max_events
        self._gather_s = gather_s
        self.own = OwnWrites(sessions)
        """The versions this committer appended itself, per session (up to `sessions` of them)."""
        self._pending: deque[tuple[Unit, asyncio.Future[Outcome]]] = deque()
        self._queued = 0
        """Events in `_pending`."""
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessionrl-commit")
        self.batches = 0
        """Transactions committed so far."""
        self.events = 0
        """Events handed to the store so far."""

    async def commit(self, writes: Sequence[Write], *, basis: int | None = None) -> Outcome:
        """Append `writes` as one unit (in order, all or none) and return one result per write.

        `basis`: the version of the first write's session the unit was built on; the unit is refused with
        `StaleState` if any writer but this committer appended to that session since."""
        if self._closed:
            raise CommitterClosed("the orchestrator is closed")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sessionrl-group-commit")
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append((Unit(writes, basis), future))
        self._queued += len(writes)
        self._wake.set()
        return await future

    async def aclose(self) -> None:
        """Write what is queued, then stop the writer task and its thread."""
        self._closed = True
        self._wake.set()
        if self._task is not None:
            await self._task
        self._thread.shutdown(wait=True)

    def _take(self) -> list[tuple[Unit, asyncio.Future[Outcome]]]:
        """Queued units, oldest first, up to `max_events` events (always at least one unit)."""
        taken = [self._pending.popleft()]
        size = len(taken[0][0].writes)
        while self._pending and size + len(self._pending[0][0].writes) <= self._max_events:
            unit = self._pending.popleft()
            size += len(unit[0].writes)
            taken.append(unit)
        self._queued -= size
        return taken

    async def _gather(self) -> None:
        """Yield to the loop while units keep arriving: until two turns in a row bring none, a batch's worth
        is queued, the committer is closing, or `gather_s` has passed. Alone, a unit waits two loop turns."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._gather_s
        quiet = 0
        while quiet < 2 and self._queued < self._max_events and not self._closed and loop.time() < deadline:
            before = self._queued
            await asyncio.sleep(0)
            quiet = quiet + 1 if self._queued == before else 0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not (self._closed and not self._pending):
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                await self._gather()
                taken = self._take()
                units = [unit for unit, _ in taken]
                append = self._store.append_units
                try:
                    results = await loop.run_in_executor(self._thread, append, units, self.own)
                except Exception as exc:  # the store failed as a whole (disk, closed): every caller learns it
                    for _, future in taken:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.batches += 1
                self.events += sum(len(unit.writes) for unit in units)
                for (_, future), outcome in zip(taken, results, strict=True):
                    if not future.done():
                        future.set_result(outcome)
