"""The backend boundary: the URL's scheme picks a backend from one table, and the store runs on any
backend that table returns."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sessionrl.errors import InvalidStoreURL, SessionRLError
from sessionrl.session import SessionCreate, StateChanged
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store import backend as backends
from sessionrl.store.dialect import STORE_SCHEMA, SQLiteBackend


def test_an_unknown_scheme_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvalidStoreURL) as err:
        SessionStore.open("mysql://localhost/db")
    assert err.value.url == "mysql://localhost/db"
    assert "known: postgres://, postgresql://, sqlite://" in str(err.value)
    assert isinstance(err.value, SessionRLError)


@pytest.mark.parametrize("url", ["sessions.db", "sqlite:", "sqlite:///"])
def test_a_malformed_url_is_refused(url: str) -> None:
    with pytest.raises(InvalidStoreURL) as err:
        SessionStore.open(url)
    assert err.value.url == url


def test_a_store_of_a_newer_layout_is_refused(db_path: Path) -> None:
    SessionStore.open(f"sqlite:///{db_path}").close()
    with sqlite3.connect(db_path) as raw:
        raw.execute(f"PRAGMA user_version={STORE_SCHEMA + 1}")
    raw.close()
    with pytest.raises(InvalidStoreURL, match="newer than this version"):
        SessionStore.open(f"sqlite:///{db_path}")


def test_a_backend_added_to_the_table_serves_the_whole_store(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []

    def memory(url: str) -> backends.Backend:
        opened.append(url)
        return SQLiteBackend.from_url("sqlite://")

    monkeypatch.setitem(backends.BACKENDS, "test-memory", memory)
    with SessionStore.open("test-memory://anything") as store:
        store.create(SessionCreate(user_query="q", session_id="s1"))
        store.append("s1", StateChanged(state="executing"), expected_version=1)
        assert store.get("s1").state_version == 2
        assert store.count(SessionQuery(state="executing")) == 1
        assert store.consistency_check().clean
        assert isinstance(store.backend, SQLiteBackend)
    assert opened == ["test-memory://anything"]


def test_the_sqlite_backend_spells_the_feedback_text_filter() -> None:
    backend = SQLiteBackend.from_url("sqlite://")
    try:
        assert backend.feedback_conditions(None, None) == ([], [])
        short, params = backend.feedback_conditions("comment", "ok")
        assert (short[0], params) == ("type = ?", ["comment", "%ok%"])
        indexed, params = backend.feedback_conditions("comment", "chronic")
        assert indexed[0] == "+type = ?"  # keeps the planner on the text index's rows
        assert params == ["comment", '"chronic"', "%chronic%"]
    finally:
        backend.close()


def test_a_new_file_store_gets_its_folder(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs' / 'deep' / 'sessions.db'}"
    with SessionStore.open(url) as store:
        store.create(SessionCreate(user_query="q", session_id="s1"))
    with SessionStore.open(url) as store:
        assert store.session_ids() == ["s1"]
