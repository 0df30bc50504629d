"""The session cache shared by the store and the engine: LRU order, newest view wins, exact versions."""

from __future__ import annotations

import threading

from sessionrl.session import Session, SessionCreate, StateChanged, apply, created
from sessionrl.store.cache import SessionCache


def opened(sid: str) -> Session:
    return apply(None, created(SessionCreate(user_query="q", session_id=sid)))


def test_the_cache_evicts_the_least_recently_used_and_keeps_newer_views() -> None:
    cache = SessionCache(capacity=2)
    views = [opened(f"s{i}") for i in range(3)]
    cache.put(views[0])
    cache.put(views[1])
    assert cache.get("s0") is views[0]  # s0 is now the most recent; s1 goes first
    cache.put(views[2])
    assert cache.get("s1") is None
    assert len(cache) == 2
    newer = apply(views[0], StateChanged(state="executing"))
    cache.put(newer)
    cache.put(views[0])  # an older view arriving late is ignored
    assert cache.get("s0") is newer


def test_a_version_asked_for_is_served_only_when_it_is_the_cached_one() -> None:
    cache = SessionCache(capacity=4)
    first = opened("s0")
    cache.put(first)
    assert cache.get("s0", state_version=1) is first
    assert cache.get("s0", state_version=2) is None  # the store holds a newer version than the cache
    assert cache.get("gone") is None
    assert cache.misses == 2


def test_a_zero_capacity_cache_keeps_nothing() -> None:
    cache = SessionCache(capacity=0)
    cache.put(opened("s0"))
    assert (len(cache), cache.get("s0")) == (0, None)


def test_threads_putting_and_reading_leave_the_cache_within_capacity() -> None:
    cache = SessionCache(capacity=8)
    views = [opened(f"s{i}") for i in range(64)]

    def churn(offset: int) -> None:
        for i in range(2000):
            view = views[(i + offset) % len(views)]
            cache.put(view)
            got = cache.get(view.session_id, state_version=1)
            assert got is None or got is view

    threads = [threading.Thread(target=churn, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 8
