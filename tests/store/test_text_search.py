"""The trigram text index over feedback comments: same answers as a scan, kept in step, checked, repaired."""

from __future__ import annotations

import sqlite3
import string
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_support import FreshURL

from sessionrl.cli.store_demo import CHRONIC_NEEDLES, CHRONIC_TOOL, chronic_answer
from sessionrl.errors import InvalidQuery
from sessionrl.session import Feedback, FeedbackAdded, FeedbackType, Session, SessionCreate, created
from sessionrl.store import EventInput, SessionQuery, SessionStore, projector
from sessionrl.store.dialect import STORE_SCHEMA, TEXT_INDEX, match_phrase, text_index_problem
from sessionrl.store.query import where
from sessionrl.store.synthetic import ingest

ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def ascii_fold(text: str) -> str:
    """Lower-case ASCII letters only, as SQLite's LIKE compares."""
    return text.translate(ASCII_LOWER)


def add_comments(store: SessionStore, comments: Sequence[str | None]) -> None:
    """Session `s{i}` gets one comment-type feedback carrying `comments[i]`."""
    items: list[tuple[str, EventInput, int | None]] = []
    for i, comment in enumerate(comments):
        sid = f"s{i}"
        feedback = Feedback(type=FeedbackType.COMMENT, comment=comment)
        items += [(sid, created(SessionCreate(user_query="q", session_id=sid)), None)]
        items += [(sid, FeedbackAdded(feedback=feedback), None)]
    assert all(isinstance(r, Session) for r in store.append_batch(items))


def found(store: SessionStore, needle: str) -> set[str]:
    return {r.session_id for r in store.query(SessionQuery(comment_contains=needle, limit=1000))}


def index_check(path: Path) -> str | None:
    """FTS5's integrity check of the text index against `feedback`, on a connection of its own."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return text_index_problem(conn)
    finally:
        conn.close()


def raw(path: Path, sql: str, *params: object) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def indexed_rows(path: Path) -> int:
    """Rows the index holds (one `docsize` row per indexed feedback row)."""
    return int(raw(path, f"SELECT COUNT(*) FROM {TEXT_INDEX}_docsize")[0][0])


# the same answers as a scan

ALPHABET = 'aAbBéÉ%_\\" 慢性病'
"""Few letters, so that needles often occur; ASCII and non-ASCII case pairs, LIKE wildcards, the phrase
quote, a space, and the three characters of 慢性病."""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    comments=st.lists(st.none() | st.text(ALPHABET, max_size=12), min_size=1, max_size=8),
    needles=st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=4),
)
def test_comment_search_is_an_ascii_case_insensitive_substring_test(
    fresh_url: FreshURL, comments: list[str | None], needles: list[str]
) -> None:
    with fresh_url() as url, SessionStore.open(url) as store:
        add_comments(store, comments)
        for needle in needles:
            expected = {
                f"s{i}"
                for i, c in enumerate(comments)
                if c is not None and ascii_fold(needle) in ascii_fold(c)
            }
            assert found(store, needle) == expected, needle


@pytest.mark.parametrize("store_backend", ["sqlite"])  # FTS5 internals
def test_non_ascii_case_is_not_folded_although_the_index_folds_it(store: SessionStore) -> None:
    add_comments(store, ["ÉTÉ chaud", "été chaud", "été CHAUD"])
    # the index alone finds every spelling: it folds case beyond ASCII
    hits = store.sql(f"SELECT rowid FROM {TEXT_INDEX} WHERE {TEXT_INDEX} MATCH ?", (match_phrase("été"),))
    assert len(hits) == 3
    # LIKE re-checks what it found, so the answer is the one a LIKE scan gives
    assert found(store, "été chaud") == {"s1", "s2"}  # "chaud" / "CHAUD" differ in ASCII case only
    assert found(store, "ÉTÉ") == {"s0"}
    assert found(store, "té") == {"s1", "s2"}  # two characters: scanned with LIKE


@pytest.mark.parametrize("store_backend", ["sqlite"])  # FTS5 internals
def test_three_characters_use_the_index_and_shorter_needles_scan(
    file_store: SessionStore, db_path: Path
) -> None:
    add_comments(file_store, ["未考虑患者的慢性病史", "慢性疲劳", "Chronic disease (COPD)", None])
    assert found(file_store, "慢性病") == {"s0"}
    assert found(file_store, "慢性") == {"s0", "s1"}
    assert found(file_store, "CHRONIC DISEASE") == {"s2"}

    def plan(q: SessionQuery) -> str:
        conds, params = where(q, file_store.backend)
        sql = f"EXPLAIN QUERY PLAN SELECT COUNT(*) FROM sessions s WHERE {' AND '.join(conds)}"
        return " | ".join(str(row[3]) for row in raw(db_path, sql, *params))

    assert f"{TEXT_INDEX} VIRTUAL TABLE" in plan(SessionQuery(comment_contains="慢性病"))
    assert "VIRTUAL TABLE" not in plan(SessionQuery(comment_contains="慢性"))
    typed = plan(SessionQuery(comment_contains="chronic", feedback_type=FeedbackType.COMMENT))
    assert f"{TEXT_INDEX} VIRTUAL TABLE" in typed
    assert "INTEGER PRIMARY KEY" in typed  # the rows the index found are fetched by key, not scanned


@pytest.fixture(scope="module")
def traffic() -> Iterator[SessionStore]:
    """A store holding 300 generated sessions, whose clinic feedback mentions chronic disease in two
    languages."""
    with SessionStore.open("sqlite://") as store:
        ingest(store, 300, seed=5)
        yield store


@pytest.mark.parametrize("needle", CHRONIC_NEEDLES)
def test_the_chronic_question_agrees_typed_in_sql_and_in_the_sessions(
    traffic: SessionStore, needle: str
) -> None:
    sessions = list(traffic.iter_sessions())
    whole = [s for s in sessions if any(needle in ascii_fold(f.comment or "") for f in s.feedback)]
    part = [s for s in whole if any(c.tool == CHRONIC_TOOL for c in s.tool_calls)]
    assert 0 < len(part) < len(whole)  # not degenerate for this seed
    answer = chronic_answer(traffic, needle)
    assert (answer.typed_matched, answer.sql_matched) == (len(whole), len(whole))
    assert answer.typed_fraction == answer.sql_fraction == len(part) / len(whole)


# kept in step by the projector


@pytest.mark.parametrize("store_backend", ["sqlite"])  # FTS5 internals
def test_the_index_follows_projection_reprojection_and_late_feedback(
    file_store: SessionStore, db_path: Path
) -> None:
    add_comments(file_store, ["chronic disease", None, "慢性病患者"])
    file_store.project()
    assert indexed_rows(db_path) == 3  # one per feedback row, a missing comment included
    raw(db_path, "UPDATE cursors SET position = 0 WHERE name = 'projector'")
    file_store.project()  # every outbox row again: nothing re-indexed twice
    late = Feedback(type=FeedbackType.HUMAN_RATING, score=2.0, comment="also chronic DISEASE")
    file_store.append(
        "s1", FeedbackAdded(feedback=late)
    )  # s1 and s0 are projected again, with a new row each
    file_store.append("s0", FeedbackAdded(feedback=Feedback(type=FeedbackType.HUMAN_RATING, score=2.0)))
    assert found(file_store, "chronic disease") == {"s0", "s1"}
    # 5 = s0's comment and rating + s1's empty comment and rating + s2's comment
    assert indexed_rows(db_path) == 5 == raw(db_path, "SELECT COUNT(*) FROM feedback")[0][0]
    assert index_check(db_path) is None


@pytest.mark.parametrize("store_backend", ["sqlite"])  # FTS5 internals
def test_read_only_sql_can_search_first_thing_and_still_cannot_write(
    file_store: SessionStore, db_url: str
) -> None:
    add_comments(file_store, ["chronic disease"])
    with SessionStore.open(db_url) as fresh:  # a new reader whose first statement opens the index
        sql = (
            f"SELECT f.session_id FROM {TEXT_INDEX} t JOIN feedback f ON f.id = t.rowid"
            f" WHERE {TEXT_INDEX} MATCH :phrase"
        )
        assert fresh.sql(sql, {"phrase": match_phrase("disease")}) == [{"session_id": "s0"}]
        for statement in (
            f"WITH x AS (SELECT 1) INSERT INTO {TEXT_INDEX} ({TEXT_INDEX}) VALUES ('rebuild')",
            f"SELECT * FROM {TEXT_INDEX}_data; DELETE FROM {TEXT_INDEX}_data",
        ):
            with pytest.raises(InvalidQuery):
                fresh.sql(statement)
        assert found(fresh, "chronic") == {"s0"}


# checked and repaired


@pytest.mark.parametrize("store_backend", ["sqlite"])  # FTS5 internals
def test_a_tampered_index_is_found_and_rebuilt(file_store: SessionStore, db_path: Path) -> None:
    add_comments(file_store, ["chronic disease", "fine"])
    file_store.project()
    assert file_store.consistency_check().clean
    # an index entry with no feedback row behind it
    raw(db_path, f"INSERT INTO {TEXT_INDEX} (rowid, comment) VALUES (1000000, 'chronic disease')")
    report = file_store.consistency_check()
    assert [(d.session_id, d.kind) for d in report.drift] == [(TEXT_INDEX, "index")]
    assert file_store.consistency_check(repair=True).repaired == (TEXT_INDEX,)
    assert file_store.consistency_check().clean
    assert index_check(db_path) is None
    assert found(file_store, "chronic disease") == {"s0"}


@pytest.mark.parametrize("store_backend", ["sqlite"])  # FTS5 internals
def test_repairing_a_tampered_comment_repairs_its_index_entry(
    file_store: SessionStore, db_path: Path
) -> None:
    add_comments(file_store, ["chronic disease", "fine"])
    file_store.project()
    raw(db_path, "UPDATE feedback SET comment = 'chronic disease too' WHERE session_id = 's1'")
    assert found(file_store, "disease too") == {"s1"}  # the index followed the edit
    report = file_store.consistency_check(repair=True)
    assert [(d.session_id, d.kind) for d in report.drift] == [("s1", "query")]
    assert report.repaired == ("s1",)
    assert found(file_store, "disease too") == set()
    assert found(file_store, "fine") == {"s1"}
    assert file_store.consistency_check().clean


# an older layout


FEEDBACK_V1 = """
CREATE TABLE feedback (
    session_id TEXT NOT NULL, position INTEGER NOT NULL, feedback_id TEXT NOT NULL, type TEXT NOT NULL,
    score REAL, comment TEXT, annotator TEXT, anchor_call_id TEXT, anchor_subgoal_id TEXT, anchor_at TEXT,
    occurred_at TEXT NOT NULL, received_at TEXT NOT NULL, PRIMARY KEY (session_id, position)
)
"""
"""The feedback table of store layout 1, before the text index."""

V1_COLUMNS = ", ".join(projector.COLUMNS["feedback"])


def make_layout_1(path: Path) -> None:
    """Turn a layout-2 store back into layout 1: no text index, feedback keyed by (session_id, position)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    for trigger in ("insert", "delete", "update"):
        conn.execute(f"DROP TRIGGER {TEXT_INDEX}_{trigger}")
    conn.execute(f"DROP TABLE {TEXT_INDEX}")
    conn.execute("DROP INDEX feedback_type")
    conn.execute("ALTER TABLE feedback RENAME TO feedback_v2")
    conn.execute(FEEDBACK_V1)
    conn.execute("CREATE INDEX feedback_type ON feedback (type, session_id)")
    conn.execute(f"INSERT INTO feedback SELECT {V1_COLUMNS} FROM feedback_v2")
    conn.execute("DROP TABLE feedback_v2")
    conn.execute("PRAGMA user_version = 1")
    conn.execute("COMMIT")
    conn.close()


@pytest.mark.parametrize("store_backend", ["sqlite"])  # FTS5 internals
def test_a_layout_1_store_gets_its_text_index_on_open(db_url: str, db_path: Path) -> None:
    with SessionStore.open(db_url) as store:
        add_comments(store, ["chronic disease", None, "慢性病", "CHRONIC DISEASE again"])
        store.project()
        before = store.sql("SELECT session_id, position, comment FROM feedback ORDER BY 1, 2")
    make_layout_1(db_path)
    assert raw(db_path, "PRAGMA user_version") == [(1,)]
    with SessionStore.open(db_url) as store:
        assert raw(db_path, "PRAGMA user_version") == [(STORE_SCHEMA,)]
        assert store.sql("SELECT session_id, position, comment FROM feedback ORDER BY 1, 2") == before
        assert found(store, "chronic disease") == {"s0", "s3"}
        assert found(store, "慢性病") == {"s2"}
        assert store.consistency_check().clean
    assert indexed_rows(db_path) == 4
