"""What only the PostgreSQL backend has to prove: comment search through its trigram index, the change
feed's commit order, and writers of one session in several processes. (Everything else runs on both
backends in the other store tests.)"""

from __future__ import annotations

import multiprocessing
import threading

import pytest
from store_support import RawDB

from sessionrl.errors import InvalidStoreURL, StaleState
from sessionrl.session import Feedback, FeedbackAdded, FeedbackType, SessionCreate, StateChanged
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.postgres import (
    LAYOUT,
    LOCK_BUCKETS,
    LOCK_SPACE,
    MAX_SESSION_LOCKS,
    TEXT_INDEX,
    WRITERS,
    lock_key,
    translate,
)

pytestmark = pytest.mark.parametrize("store_backend", ["postgresql"])


@pytest.fixture
def db(file_store: SessionStore, raw: RawDB) -> tuple[SessionStore, RawDB]:
    """The store under test and plain SQL on its schema."""
    return file_store, raw


def comment(store: SessionStore, sid: str, text: str) -> None:
    store.create(SessionCreate(user_query="q", session_id=sid))
    store.append(sid, FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT, comment=text)))


def found(store: SessionStore, needle: str) -> set[str]:
    return {r.session_id for r in store.query(SessionQuery(comment_contains=needle))}


def test_chinese_comments_are_found_through_the_trigram_index(db: tuple[SessionStore, RawDB]) -> None:
    store, raw = db
    for i, text in enumerate(["未考虑患者的慢性病史", "慢性疲劳", "ÉTÉ Chronic disease", "été chaud"]):
        comment(store, f"s{i}", text)
    assert found(store, "慢性病") == {"s0"}
    assert found(store, "慢性") == {"s0", "s1"}
    assert found(store, "CHRONIC") == {"s2"}
    assert found(store, "été") == {"s3"}  # ASCII case alone is folded, as on SQLite
    with raw.connect() as conn:
        conn.execute("SET LOCAL enable_seqscan = off")  # a few rows: the planner would scan otherwise
        plan = conn.execute(
            "EXPLAIN SELECT session_id FROM feedback WHERE comment ILIKE ?", ("%慢性病%",)
        ).fetchall()
    assert TEXT_INDEX in " ".join(row[0] for row in plan)


def test_a_missing_text_index_is_drift_and_repair_builds_it(db: tuple[SessionStore, RawDB]) -> None:
    store, raw = db
    comment(store, "s0", "chronic disease")
    raw.run(f"DROP INDEX {TEXT_INDEX}")
    report = store.consistency_check()
    assert [(d.session_id, d.kind) for d in report.drift] == [(TEXT_INDEX, "index")]
    assert store.consistency_check(repair=True).repaired == (TEXT_INDEX,)
    assert store.consistency_check().clean
    assert found(store, "chronic") == {"s0"}


def test_a_commit_waiting_behind_an_earlier_cursor_is_not_skipped(
    db: tuple[SessionStore, RawDB], db_url: str
) -> None:
    store, raw = db
    store.create(SessionCreate(user_query="q", session_id="a"))
    start = store.changes().cursor
    with SessionStore.open(db_url) as other:
        later = threading.Thread(target=other.append, args=("a", StateChanged(state="executing")))
        with raw.connect() as early:  # draws the next cursor and keeps its transaction open
            early.execute(
                "INSERT INTO outbox (session_id, seq, type, at) VALUES ('x', 1, 'probe', ?)",
                ("2026-01-01T00:00:00.000000Z",),
            )
            later.start()
            waiting = "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            while raw.rows(waiting) != [(1,)]:
                assert later.is_alive()
            assert store.changes(after=start).changes == []  # the later write waits for the earlier
        later.join()
    changes = store.changes(after=start).changes
    assert [(c.session_id, c.type) for c in changes] == [("x", "probe"), ("a", "state_changed")]


def write_many(url: str, sid: str, n: int) -> None:
    with SessionStore.open(url) as store:
        for i in range(n):
            fb = Feedback(type=FeedbackType.COMMENT, comment=f"{multiprocessing.current_process().name} {i}")
            store.append(sid, FeedbackAdded(feedback=fb))


def test_processes_appending_to_one_session_take_turns(db: tuple[SessionStore, RawDB], db_url: str) -> None:
    store, _ = db
    store.create(SessionCreate(user_query="q", session_id="shared"))
    ctx = multiprocessing.get_context("fork")
    writers = [ctx.Process(target=write_many, args=(db_url, "shared", 25)) for _ in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    assert [w.exitcode for w in writers] == [0, 0, 0]
    log = store.events("shared")
    assert [e.seq for e in log] == list(range(1, 77))
    assert store.get("shared").state_version == 76
    assert store.consistency_check().clean
    assert store.count(SessionQuery(comment_contains="Process")) == 1


def test_a_reader_polling_the_feed_while_processes_write_sees_every_change_once(
    db: tuple[SessionStore, RawDB], db_url: str
) -> None:
    store, _ = db
    ctx = multiprocessing.get_context("fork")
    for sid in ("p0", "p1", "p2"):
        store.create(SessionCreate(user_query="q", session_id=sid))
    writers = [ctx.Process(target=write_many, args=(db_url, sid, 40)) for sid in ("p0", "p1", "p2")]
    for w in writers:
        w.start()
    seen: list[int] = []
    cursor = 0
    while any(w.is_alive() for w in writers) or (batch := store.changes(after=cursor)).changes:
        batch = store.changes(after=cursor, limit=7)
        seen += [c.cursor for c in batch.changes]
        cursor = batch.cursor
    assert [w.exitcode for w in writers] == [0, 0, 0]
    every = [c.cursor for c in store.changes(limit=10_000).changes]
    assert len(every) == 3 + 120
    assert seen == every  # nothing skipped, nothing twice, in cursor order


def test_a_stale_version_from_another_process_is_refused(db: tuple[SessionStore, RawDB], db_url: str) -> None:
    store, _ = db
    store.create(SessionCreate(user_query="q", session_id="s1"))
    with SessionStore.open(db_url) as other:
        other.append("s1", StateChanged(state="executing"), expected_version=1)
    with pytest.raises(StaleState):
        store.append("s1", StateChanged(state="executing"), expected_version=1)
    assert store.get("s1").state_version == 2


def test_user_sql_takes_parameters_as_on_sqlite_and_cannot_write(db: tuple[SessionStore, RawDB]) -> None:
    store, _ = db
    comment(store, "s0", "50% off")
    assert store.sql("SELECT session_id FROM feedback WHERE comment LIKE '50%' AND type = ?", ("comment",))
    assert store.sql("SELECT :n::int + 1 AS m", {"n": 1}) == [{"m": 2}]
    assert translate("SELECT ':x', :x", named=True) == "SELECT ':x', %(x)s"


def test_a_store_carries_on_after_the_server_dropped_its_connections(db: tuple[SessionStore, RawDB]) -> None:
    store, raw = db
    store.create(SessionCreate(user_query="q", session_id="s1"))
    dropped = raw.rows(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )
    assert len(dropped) >= 2  # the store's writer and reader
    assert store.append("s1", StateChanged(state="executing")).state_version == 2
    assert store.get("s1").state_version == 2


def test_a_store_of_a_newer_layout_is_refused(db: tuple[SessionStore, RawDB], db_url: str) -> None:
    _, raw = db
    raw.run("UPDATE store_meta SET value = ? WHERE key = 'layout'", LAYOUT + 1)
    with pytest.raises(InvalidStoreURL, match="newer than this version"):
        SessionStore.open(db_url)


ADVISORY = (
    "SELECT objid::int, mode FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    " AND classid::int = ? ORDER BY objid::int"
)


def test_a_transaction_over_many_sessions_holds_one_lock_the_others_wait_for(
    db: tuple[SessionStore, RawDB],
) -> None:
    """A transaction over more sessions than MAX_SESSION_LOCKS holds the writers' lock alone, exclusively;
    a smaller one holds it shared and one exclusive lock per bucket, so each waits for the other."""
    store, _ = db
    backend = store.backend
    space = LOCK_SPACE  # the key halves, oids in pg_locks, read back as signed by ::int
    with backend.atomic() as conn:
        backend.serialise(conn, [f"session:s{i}" for i in range(20_000)])
        held = conn.execute(ADVISORY, (space,)).fetchall()
    assert held == [(WRITERS, "ExclusiveLock")]
    keys = [f"session:s{i}" for i in range(MAX_SESSION_LOCKS)]
    with backend.atomic() as conn:
        backend.serialise(conn, keys)
        held = conn.execute(ADVISORY, (space,)).fetchall()
    buckets = sorted({lock_key(k) % LOCK_BUCKETS for k in keys})
    assert held == [(WRITERS, "ShareLock"), *((b, "ExclusiveLock") for b in buckets)]


def test_a_second_call_in_a_transaction_keeps_the_writers_lock_as_the_first_took_it(
    db: tuple[SessionStore, RawDB],
) -> None:
    """After a small first call (the writers' lock shared), a large second one takes its buckets, never
    the writers' lock exclusively, which could wait on a writer waiting on this transaction."""
    store, _ = db
    backend = store.backend
    with backend.atomic() as conn:
        backend.serialise(conn, ["session:first"])
        many = [f"session:s{i}" for i in range(MAX_SESSION_LOCKS + 1)]
        backend.serialise(conn, many)
        held = conn.execute(ADVISORY, (LOCK_SPACE,)).fetchall()
    expected = {lock_key(k) % LOCK_BUCKETS for k in ["session:first", *many]}
    assert held[0] == (WRITERS, "ShareLock")
    assert sorted(b for b, _ in held[1:]) == sorted(expected)
