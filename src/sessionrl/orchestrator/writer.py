"""The engine's side of the store: the views steps are built on, and units committed whole, retried.

A step's events form one unit. A unit of one event is appended to whatever the store holds (tool calls
commute); a longer unit is checked by folding it locally, then appended with chained expected versions,
so it is written whole or not at all. A unit that lost a race (`StaleState`) is rebuilt on the fresh
session and tried again.

Several engines may serve one store (`sessionrl serve` processes sharing a PostgreSQL database, or
engines in one process), and any of them any session: per-session serialisation is versions with
retry. A step is built on the cached view, and its unit names the version it was built on (its
`basis`); the store, inside the transaction that writes it and holding the session's lock, refuses it
(`StaleState`) if any other writer appended since, and the step is rebuilt on the session read afresh.
The engine's own concurrent steps do not refuse each other (the committer remembers which versions it
wrote), so tool calls still commute. Nothing is held while a tool runs, and only the store's
transaction-scoped locks order writers, so a process that dies holds up nobody. Reads made for a
caller (`session`) come from the store, checked against its version, not from the cache.

Active sessions are kept in an LRU whose entries are only ever sessions the store returned after a
commit. A session leaves it when it ends (finished, rejected, archived): feedback that arrives later is
rare, and reads the store.

Idempotency: a caller may pass `key`. Every id the request writes is derived from it (`StepIds`), the
store ignores an event id it already holds, and a request whose last event is already in the log is
answered from the log without running anything again (`replayed`); the same request arriving while
the first is still running shares its answer (`once`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sessionrl.errors import SessionRLError, StaleState
from sessionrl.orchestrator.commit import GroupCommitter, Write
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.results import StepIds
from sessionrl.session.events import Event, apply, fold
from sessionrl.session.lifecycle import TERMINAL
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.store.cache import SessionCache

T = TypeVar("T")
Build = Callable[[Session], list[Event]]
"""Builds a step's unit of events on the session as it stands (called again after a lost race)."""


class SessionWriter:
    """Commits the engine's units and keeps the views they are built on (see the module doc)."""

    def __init__(self, store: SessionStore, config: OrchestratorConfig) -> None:
        self.store = store
        self.retries = config.commit_retries
        self.cache = SessionCache(config.cache_size)
        self.committer = GroupCommitter(
            store,
            max_events=config.commit_batch,
            gather_s=config.commit_gather_s,
            sessions=config.cache_size,
        )
        self.chained: dict[str, list[asyncio.Future[None]]] = {}
        """Sessions with a unit of several events being committed, and the steps waiting for it to end."""
        self._inflight: dict[str, asyncio.Future[Any]] = {}

    async def aclose(self) -> None:
        """Commit what is queued and stop the writer."""
        await self.committer.aclose()

    async def session(self, session_id: str) -> Session:
        """The session's current read view, as stored (another process may have written it since this
        engine last did); the cache is brought up to date with it."""
        session = await asyncio.to_thread(self.store.get, session_id)
        self.remember(session)
        return session

    async def commit(self, session_id: str, build: Build, ids: StepIds) -> Session:
        """Commit the unit `build` makes, rebuilding it on the fresh session after a lost race.

        A unit of several events carries chained expected versions, so any write to its session that
        lands first makes it stale. While one is in flight, the engine's other units of that session
        wait for it (`_settled`) and are built on the session it leads to, instead of losing a race to
        it: concurrent first steps of a session then enter `executing` once, not once per loser.
        """
        for attempt in range(self.retries):
            session = await self._settled(session_id)
            events = _seal(build(session), ids)
            waiters: list[asyncio.Future[None]] | None = [] if len(events) > 1 else None
            if waiters is not None:
                self.chained[session_id] = waiters
            try:
                committed = await self._commit_unit(session, events)
                self.remember(committed)
            except StaleState:
                if attempt + 1 == self.retries:
                    raise
                self.cache.drop(session_id)
                continue
            finally:
                if waiters is not None:
                    del self.chained[session_id]
                    for waiter in waiters:
                        if not waiter.done():  # a cancelled waiter is done
                            waiter.set_result(None)
            return committed
        raise AssertionError("unreachable: the loop returns or raises")

    async def _settled(self, session_id: str) -> Session:
        """The session once no chained unit of it is in flight here (see `commit`)."""
        while True:
            waiters = self.chained.get(session_id)
            if waiters is not None:
                waiter = asyncio.get_running_loop().create_future()
                waiters.append(waiter)  # its own future: cancelling one waiter cancels no other
                await waiter
                continue
            session = await self.view(session_id)
            if session_id not in self.chained:  # none began while the session was read from the store
                return session

    async def _commit_unit(self, session: Session, events: list[Event]) -> Session:
        """One event goes on whatever is stored if only this engine wrote since `session` (its basis);
        several carry chained expected versions (see the module doc)."""
        sid = session.session_id
        if len(events) == 1:
            commit = self.committer.commit([(sid, events[0], None)], basis=session.state_version)
            return raise_first(await commit)
        local = session
        for event in events:  # raises (writing nothing) if the unit is not allowed as a whole
            local = apply(local, event)
        version = session.state_version
        writes: list[Write] = [(sid, event, version + i) for i, event in enumerate(events)]
        return raise_first(await self.committer.commit(writes))

    def remember(self, session: Session) -> None:
        """Cache an active session's latest view; an ended one leaves the cache."""
        if session.state in TERMINAL:
            self.cache.drop(session.session_id)
        else:
            self.cache.put(session)

    async def view(self, session_id: str) -> Session:
        """The session as this engine last saw it (the cache), or as stored when it is not cached. It
        may be behind the store; a unit built on it says so (see `_commit_unit`)."""
        cached = self.cache.get(session_id)
        if cached is not None:
            return cached
        return await self.session(session_id)

    async def checked(self, session_id: str, expected: int | None, *, fresh: bool = False) -> Session:
        """The view a request starts from; read afresh when it is not at the version the caller expects
        (the caller may have seen a version another process wrote), or when the step asks the policy
        (whose prompt should show every step so far; the call costs far more than the read)."""
        session = await self.view(session_id)
        if fresh or (expected is not None and session.state_version != expected):
            session = await self.session(session_id)
        return session

    async def exists(self, session_id: str) -> bool:
        try:
            await self.view(session_id)
        except SessionRLError:
            return False
        return True

    async def replayed(self, session_id: str, ids: StepIds) -> Session | None:
        """The session right after the request of `ids` was first committed, or None if it never was."""
        first = await self.logged(session_id, ids)
        return None if first is None else first[0]

    async def logged(self, session_id: str, ids: StepIds) -> tuple[Session, list[Event]] | None:
        """The session right after the request of `ids` was first committed, and the events that request
        wrote (those whose ids `ids` made); None if it never was."""
        events = await asyncio.to_thread(self.store.events, session_id)
        last = next((i for i, e in enumerate(events) if e.event_id == ids.event()), None)
        if last is None:
            return None
        mark = ids.event()
        written = [e.event for e in events[: last + 1] if e.event_id.partition(".")[0] == mark]
        return fold(e.event for e in events[: last + 1]), written

    async def once(self, key: str | None, run: Callable[[], Awaitable[T]]) -> T:
        """Run `run`, unless a request with the same key is in flight: then share its answer."""
        if key is None:
            return await run()
        if key in self._inflight:
            return await asyncio.shield(self._inflight[key])
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            result = await run()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # marked as retrieved: nobody may be waiting
            raise
        else:
            future.set_result(result)
            return result
        finally:
            del self._inflight[key]


def check_version(session: Session, expected: int | None) -> None:
    """Raise `StaleState` unless the session is at the version the caller expects (if it expects one)."""
    if expected is not None and session.state_version != expected:
        raise StaleState(session.session_id, expected, session.state_version)


def raise_first(results: list[Session | SessionRLError]) -> Session:
    """The session after the last write, or the first error among the results."""
    for result in results:
        if isinstance(result, SessionRLError):
            raise result
    last = results[-1]
    assert isinstance(last, Session)
    return last


def _seal(events: list[Event], ids: StepIds) -> list[Event]:
    """Name a unit's last event `ids.event()`, the mark a replay looks for (the others carry their role)."""
    return [*events[:-1], events[-1].model_copy(update={"event_id": ids.event()})]
