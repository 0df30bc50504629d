"""What every command shares: the `--db` option, refusing to read a store that does not exist, and help
that shows flags as flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.cli.sessions import store_url

runner = CliRunner()

READS = [
    ["sessions", "list"],
    ["sessions", "show", "s-1"],
    ["sessions", "query", "--tool", "crp_test_request"],
    ["sessions", "query", "--sql", "SELECT 1"],
    ["sessions", "export", "out.jsonl"],
    ["store", "check"],
    ["store", "archive", "archive"],
    ["rewards", "score"],
    ["rewards", "explain", "s-1"],
    ["rewards", "rescore", "--since", "2026-01-01T00:00:00Z"],
]
"""Commands that only read sessions (`archive` and `score` write about sessions that must exist)."""


@pytest.mark.parametrize("command", READS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize("db", ["typo/sesions.db", "sqlite:///typo/sesions.db"])
def test_reading_a_store_that_does_not_exist_says_so_and_creates_nothing(
    command: list[str], db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, [*command, "--db", db])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: no session store at typo/sesions.db")
    assert "--db" in line
    assert list(tmp_path.iterdir()) == []


def test_the_default_store_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SESSIONRL_DB", "elsewhere/s.db")
    result = runner.invoke(app, ["sessions", "list"])
    assert result.exit_code == 1
    assert "no session store at elsewhere/s.db" in result.output


def test_writing_creates_the_store_and_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SESSIONRL_DB", raising=False)
    dump = tmp_path / "empty.jsonl"
    dump.write_bytes(b"")
    assert runner.invoke(app, ["sessions", "import", str(dump)]).exit_code == 0
    assert (tmp_path / "runs" / "sessions.db").exists()
    listed = runner.invoke(app, ["sessions", "list", "--db", "runs/sessions.db"])
    assert listed.exit_code == 0, listed.output
    assert "0 most recent sessions" in listed.output


def test_a_db_value_is_a_path_or_a_url() -> None:
    assert store_url("runs/sessions.db") == "sqlite:///runs/sessions.db"
    assert store_url("/srv/sessions.db") == "sqlite:////srv/sessions.db"
    assert store_url("sqlite:///runs/sessions.db") == "sqlite:///runs/sessions.db"
    assert store_url("sqlite://") == "sqlite://"


def commands(group: TyperGroup, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The path of every command under `group`."""
    found: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        found += commands(command, path) if isinstance(command, TyperGroup) else [path]
    return found


def test_help_shows_flags_without_a_value_type() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, TyperGroup)
    paths = commands(group)
    assert ("sessions", "list") in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], terminal_width=120)
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, path
        assert "--help " in result.output, path
    listed = runner.invoke(app, ["sessions", "list", "--help"], terminal_width=120).output
    assert "<int range>" in listed  # options that take a value still show its type
