"""Both ways of serving the dashboard project a store's pending changes before they serve, so that the
first page neither waits for them nor misses them: `sessionrl ui` projects at start, and `sessionrl serve`
drains the outbox at start through the OTLP receiver's first query (it adopts the trace groups a restart
left open)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from fastapi.testclient import TestClient
from ui_support import TOKENS

from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session.model import SessionCreate
from sessionrl.store import SessionStore
from sessionrl.ui import UIConfig, create_ui_app


def unprojected(db: Path) -> int:
    """Outbox rows past the projector's cursor, read without the store (any query of it drains them)."""
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT position FROM cursors WHERE name = 'projector'").fetchone()
        done = 0 if row is None else int(row[0])
        return int(conn.execute("SELECT COUNT(*) FROM outbox WHERE cursor > ?", (done,)).fetchone()[0])


def written(db: Path, n: int = 30) -> Path:
    with SessionStore.open(f"sqlite:///{db}") as store:
        for k in range(n):
            store.create(SessionCreate(user_query=f"where is order {k}?", session_id=f"s{k}"))
    assert unprojected(db) == n
    return db


def test_the_dashboard_alone_projects_before_it_serves(tmp_path: Path) -> None:
    db = written(tmp_path / "s.db")
    app = create_ui_app(f"sqlite:///{db}", UIConfig(runs_dir=tmp_path), parse_tokens(TOKENS))
    with TestClient(app):
        assert unprojected(db) == 0


def test_serve_with_the_dashboard_projects_before_it_serves(tmp_path: Path) -> None:
    db = written(tmp_path / "s.db")
    app = create_app(ServiceConfig(db_url=f"sqlite:///{db}", tokens=parse_tokens(TOKENS)), skills=[])
    with TestClient(app, headers={"Authorization": "Bearer " + TOKENS.split(":")[0]}) as client:
        assert unprojected(db) == 0
        page = client.get("/ui/sessions?q=order+17").text
        assert '<b id="found">1</b>' in page  # the full-text index holds the sessions written before
