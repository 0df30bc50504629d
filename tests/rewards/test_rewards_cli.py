"""`sessionrl rewards score | explain | rescore` against a file store of generated sessions."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sessionrl.cli.rewards import app
from sessionrl.session import SessionState
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import ingest

runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    with SessionStore.open(url) as store:
        ingest(store, 40, seed=2)
    return url


def test_score_then_explain_then_rescore(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stats = tmp_path / "stats.json"
    with SessionStore.open(db) as store:
        finished = store.session_ids(SessionState.FINISHED)
        ended = len(finished) + len(store.session_ids(SessionState.REJECTED))
    first = runner.invoke(app, ["score", "--db", db, "--stats", str(stats)])
    assert first.exit_code == 0, first.output
    assert f"{ended} sessions: {ended} new reward versions" in first.output
    assert stats.exists()

    monkeypatch.setenv("SESSIONRL_DB", db)  # --db falls back to the environment
    again = runner.invoke(app, ["score", "--stats", str(stats)])
    assert again.exit_code == 0, again.output
    assert "0 new reward versions" in again.output

    explained = runner.invoke(app, ["explain", finished[0]], terminal_width=200)
    assert explained.exit_code == 0, explained.output
    for name in ("tool_failure", "human_rating", "judge_correction", "completion", "session reward"):
        assert name in explained.output

    fresh = runner.invoke(app, ["explain", finished[0], "--fresh", "--stats", str(stats)], terminal_width=200)
    assert fresh.exit_code == 0, fresh.output
    assert "session reward" in fresh.output

    later = runner.invoke(app, ["rescore", "--since", "2025-03-01T00:00:00Z", "--stats", str(stats)])
    assert later.exit_code == 0, later.output
    assert "sessions:" in later.output


def test_explain_unknown_session_and_bad_time_are_clear_errors(db: str, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["explain", "nope", "--db", db])
    assert missing.exit_code != 0
    assert "not found" in missing.output
    bad = runner.invoke(
        app, ["rescore", "--since", "yesterday", "--db", db, "--stats", str(tmp_path / "s.json")]
    )
    assert bad.exit_code != 0
    assert "--since" in bad.output


def test_a_bad_rule_file_stops_before_scoring(db: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("name: x\nrules: []\n", encoding="utf-8")
    result = runner.invoke(app, ["score", "--db", db, "--rules", str(rules)])
    assert result.exit_code != 0
    assert "rules" in result.output
