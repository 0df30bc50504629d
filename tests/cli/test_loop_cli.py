"""`sessionrl loop` says each cycle's decision with its reason, and when the next cycle comes."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.store import SessionStore

ROOT = Path(__file__).resolve().parents[2]


def test_each_cycle_says_its_decision_and_when_the_next_one_runs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'sessions.db'}"
    SessionStore.open(db).close()
    config = tmp_path / "loop.yaml"
    train = ROOT / "examples" / "orders-sft.yaml"
    config.write_text(yaml.safe_dump({"db": db, "train": str(train), "interval_s": 0}))
    result = CliRunner().invoke(app, ["loop", str(config), "--cycles", "2"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("cycle 1: 0 changed, 0 re-scored, failures: none attributed; no_production")
    assert lines[1] == "next cycle in 0 s (Ctrl-C stops)"
    assert lines[2].startswith("cycle 2:")
    assert len(lines) == 3  # no promise of a third cycle after the last
