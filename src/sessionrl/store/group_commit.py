"""Group commit: many concurrent writers share one durable commit.

An acknowledged append costs one `fsync`, which dominates its latency. `GroupCommitter` lets threads and
coroutines submit appends to one committer thread that takes every append waiting at that moment and
writes them with a single `append_batch` (one transaction, one fsync). Nothing waits on a timer: while
one batch commits, the next one gathers, so batches grow exactly when the load does.

>>> from sessionrl.session import SessionCreate, created
>>> with SessionStore.open("sqlite://") as store, GroupCommitter(store) as committer:
...     event = created(SessionCreate(user_query="q", session_id="s1"))
...     committer.append("s1", event).state_version
1
"""

from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future
from types import TracebackType
from typing import Self

from sessionrl.errors import SessionRLError
from sessionrl.session.model import Session
from sessionrl.store.hot import SessionStore
from sessionrl.store.writes import EventInput

Item = tuple[str, EventInput, int | None]


class GroupCommitter:
    """Funnels appends from any thread or event loop into batched transactions on one store."""

    def __init__(self, store: SessionStore, *, max_batch: int = 512) -> None:
        self.store = store
        self.max_batch = max_batch
        self.batches = 0
        """Transactions committed so far (fewer than appends when commits were shared)."""
        self._queue: queue.SimpleQueue[tuple[Item, Future[Session]] | None] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sessionrl-group-commit", daemon=True)
        self._thread.start()

    def submit(
        self, session_id: str, event: EventInput, expected_version: int | None = None
    ) -> Future[Session]:
        """Queue an append; the future resolves to the session, or to the error that rejected the event."""
        future: Future[Session] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            self._queue.put(((session_id, event, expected_version), future))
        return future

    def append(self, session_id: str, event: EventInput, expected_version: int | None = None) -> Session:
        """Append and wait for the shared commit (same contract as `SessionStore.append`)."""
        return self.submit(session_id, event, expected_version).result()

    async def append_async(
        self, session_id: str, event: EventInput, expected_version: int | None = None
    ) -> Session:
        """Append from a coroutine without blocking its event loop."""
        return await asyncio.wrap_future(self.submit(session_id, event, expected_version))

    def close(self) -> None:
        """Commit everything already submitted, then stop the committer thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(None)
        self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            waiting = [first]
            stop = False
            while len(waiting) < self.max_batch and not self._queue.empty():
                nxt = self._queue.get()
                if nxt is None:
                    stop = True
                    break
                waiting.append(nxt)
            self._commit(waiting)
            if stop:
                return

    def _commit(self, waiting: list[tuple[Item, Future[Session]]]) -> None:
        waiting = [(item, future) for item, future in waiting if future.set_running_or_notify_cancel()]
        if not waiting:
            return
        try:
            results = self.store.append_batch([item for item, _ in waiting])
        except Exception as exc:  # the whole transaction failed: every waiter learns why
            for _, future in waiting:
                future.set_exception(exc)
            return
        self.batches += 1
        for (_, future), result in zip(waiting, results, strict=True):
            if isinstance(result, SessionRLError):
                future.set_exception(result)
            else:
                future.set_result(result)
