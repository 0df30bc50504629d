"""The session store: an event log with materialised sessions, query tables and a change feed.

Open one with `SessionStore.open("sqlite:///sessions.db")` (or `"sqlite://"` in memory, or
`"postgresql://user@host/db"` for a store several processes share). The URL's scheme
picks the database backend (`sessionrl.store.backend`: the interface a backend implements, and the table
of them); the rest of the store speaks to any backend alike.
"""

from sessionrl.store.consistency import ConsistencyReport, DigestSource, Drift
from sessionrl.store.hot import SessionStore, StoreConfig
from sessionrl.store.query import SessionQuery
from sessionrl.store.records import Change, ChangeBatch, RewardRecord, SessionRow, StoredEvent
from sessionrl.store.writes import EventInput

__all__ = [
    "Change",
    "ChangeBatch",
    "ConsistencyReport",
    "DigestSource",
    "Drift",
    "EventInput",
    "RewardRecord",
    "SessionQuery",
    "SessionRow",
    "SessionStore",
    "StoreConfig",
    "StoredEvent",
]
