"""The glossary's SQL views (`glossary`, `comment_terms`) are there, and current, once a store is open,
on both backends: a store made before they existed, or before the glossary changed, gets them on open."""

from __future__ import annotations

import logging

import pytest
from store_support import RawDB

from sessionrl.session import SessionCreate
from sessionrl.session.events import FeedbackAdded
from sessionrl.session.model import Feedback, FeedbackType
from sessionrl.store import SessionStore, glossary
from sessionrl.store.glossary import DROP_VIEWS
from sessionrl.store.postgres_server import LocalPostgres

COMMENT = "诊断正确，但未提及需排除慢性病贫血"


def terms_of(store: SessionStore) -> set[str]:
    """The terms `comment_terms` finds in session s1's comments."""
    return {r["term"] for r in store.sql("SELECT term FROM comment_terms WHERE session_id = 's1'")}


def drop_views(raw: RawDB) -> None:
    """Leave the store as one made before the views existed."""
    for statement in DROP_VIEWS:
        raw.run(statement)
    if not raw.url.startswith("sqlite"):
        raw.run("DELETE FROM store_meta WHERE key = 'views'")


def test_a_store_without_the_views_gets_them_on_open(db_url: str, raw: RawDB) -> None:
    with SessionStore.open(db_url) as store:
        store.create(SessionCreate(user_query="Hb 9.1", session_id="s1"))
        store.append("s1", FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT, comment=COMMENT)))
    drop_views(raw)
    with SessionStore.open(db_url) as store:
        found = terms_of(store)
    assert {"chronic disease", "慢性病", "anemia", "anaemia", "贫血", "diagnosis", "诊断"} <= found


def test_a_changed_glossary_reaches_an_existing_store_on_open(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SessionStore.open(db_url) as store:
        store.create(SessionCreate(user_query="Hb 9.1", session_id="s1"))
        store.append("s1", FeedbackAdded(feedback=Feedback(type=FeedbackType.COMMENT, comment=COMMENT)))
        assert "exclusion" not in terms_of(store)
    monkeypatch.setattr(glossary, "TERMS", (*glossary.TERMS, ("exclusion", "排除")))
    with SessionStore.open(db_url) as store:
        assert {"exclusion", "排除"} <= terms_of(store)


@pytest.mark.parametrize("store_backend", ["postgresql"])  # SQLite remakes its views on every open
def test_opening_a_store_whose_views_are_current_leaves_them_alone(db_url: str, raw: RawDB) -> None:
    oids = "SELECT to_regclass('glossary')::oid, to_regclass('comment_terms')::oid"
    SessionStore.open(db_url).close()
    made = raw.rows(oids)
    SessionStore.open(db_url).close()
    assert raw.rows(oids) == made


@pytest.mark.parametrize("store_backend", ["postgresql"])
def test_a_role_that_may_only_read_opens_a_store_without_views_saying_so(
    db_url: str, raw: RawDB, pg_server: LocalPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    SessionStore.open(db_url).close()
    drop_views(raw)
    raw.run(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'glossary_reader')"
        " THEN CREATE ROLE glossary_reader LOGIN; END IF; END $$"
    )
    schema = raw.rows("SELECT current_schema()")[0][0]
    raw.run(f"GRANT USAGE ON SCHEMA {schema} TO glossary_reader")
    raw.run(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO glossary_reader")
    reader = db_url.replace(f"user={pg_server.os_user}", "user=glossary_reader")
    with (
        caplog.at_level(logging.WARNING, logger="sessionrl.store.postgres"),
        SessionStore.open(reader) as store,
    ):
        assert store.session_ids() == []
    assert "glossary views could not be brought up to date" in caplog.text
    assert raw.rows("SELECT to_regclass('comment_terms')") == [(None,)]
