"""`sessionrl rewards queue`: the reward model fitted on a store's rated sessions names the unrated ended
sessions it is least sure of, and a store with too few ratings is a one-line error that says how many."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.rewards.terms import human_rating
from sessionrl.session.lifecycle import TERMINAL
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import ingest

runner = CliRunner()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('queue') / 'sessions.db'}"
    with SessionStore.open(url) as store:
        ingest(store, 160, seed=3)
    return url


def test_queue_lists_unrated_ended_sessions_widest_interval_first(db: str) -> None:
    result = runner.invoke(app, ["rewards", "queue", "--db", db, "--k", "4"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "held out: MAE" in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith(("│", "|"))]
    listed = [row[1] for row in rows if len(row) > 1 and row[1] != "session"]
    assert len(listed) == 4
    with SessionStore.open(db) as store:
        for session_id in listed:
            session = store.get(session_id)
            assert human_rating(session) is None
            assert session.state in TERMINAL
    widths = [float(row[7]) - float(row[5]) for row in rows if len(row) > 7 and row[1] in listed]
    assert len(widths) == 4
    assert widths == sorted(widths, reverse=True)


def test_too_few_ratings_is_one_line_that_says_how_many(db: str) -> None:
    result = runner.invoke(app, ["rewards", "queue", "--db", db, "--min-rated", "100000"], terminal_width=200)
    assert result.exit_code == 1
    assert "rated sessions; need at least 100000" in result.output
