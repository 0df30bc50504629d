"""`SessionCache`: a bounded LRU of sessions' latest committed views, used by the store and the engine.

Both put only what was committed; a view older than the cached one (a slower concurrent commit) never
replaces it. The store asks for an exact `state_version` (the one it just read), so a stale entry is never
served; the engine asks for whatever is cached and builds on it, and the store refuses what it builds if
another writer has moved the session on since (see `sessionrl.store.writes.OwnWrites`).

>>> from sessionrl.session.model import SessionCreate
>>> from sessionrl.session.events import apply, created
>>> cache = SessionCache(capacity=1)
>>> session = apply(None, created(SessionCreate(user_query="q", session_id="s1")))
>>> cache.put(session)
>>> cache.get("s1") is session, cache.get("s1", state_version=2), cache.misses
(True, None, 1)
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from sessionrl.session.model import Session


class SessionCache:
    """Latest views of up to `capacity` sessions, least recently used out first. Thread-safe.

    `misses` counts the reads it could not answer (absent, or not at the version asked for).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.misses = 0
        self._items: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, session_id: str, state_version: int | None = None) -> Session | None:
        """The cached view (only if it is at `state_version`, when given), marked as recently used."""
        with self._lock:
            session = self._items.get(session_id)
            if session is None or (state_version is not None and session.state_version != state_version):
                self.misses += 1
                return None
            self._items.move_to_end(session_id)
            return session

    def put(self, session: Session) -> None:
        """Keep `session` unless a newer version is cached; evict the least recently used past capacity."""
        if self.capacity == 0:
            return
        with self._lock:
            sid = session.session_id
            old = self._items.get(sid)
            if old is None or old.state_version <= session.state_version:
                self._items[sid] = session
            self._items.move_to_end(sid)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def drop(self, session_id: str) -> None:
        """Forget a session (it will be read from the database next time)."""
        with self._lock:
            self._items.pop(session_id, None)
