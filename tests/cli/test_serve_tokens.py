"""Several `sessionrl serve` processes accept the same tokens: `--tokens-file` (or $SESSIONRL_TOKENS_FILE)
names one file that the first process creates with a new token and the others read."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.cli.serve import ListeningServer
from sessionrl.service.config import ServiceConfig, shared_tokens

runner = CliRunner()


def serve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """The tokens `sessionrl serve ARGS` would accept (its server does not run), and what it printed."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(ListeningServer, "run", lambda s: seen.update(s.config.app.state.config.tokens))
    result = runner.invoke(app, ["serve", "--db", str(tmp_path / "s.db"), *args])
    assert result.exit_code == 0, result.output
    return seen, result.output


def test_two_processes_given_one_tokens_file_accept_the_same_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SESSIONRL_TOKENS", raising=False)
    path = tmp_path / "secrets" / "tokens"
    first, said_first = serve(monkeypatch, tmp_path, "--tokens-file", str(path))
    second, said_second = serve(monkeypatch, tmp_path, "--tokens-file", str(path))
    assert first == second
    assert len(first) == 1
    assert f"wrote a new read-write token to {path}" in said_first
    assert "wrote" not in said_second
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner alone


def test_the_environment_names_the_file_and_an_explicit_token_list_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "tokens"
    path.write_text("# ours\nalpha:read,write\nbeta:read  # the dashboard's\n")
    monkeypatch.delenv("SESSIONRL_TOKENS", raising=False)
    monkeypatch.setenv("SESSIONRL_TOKENS_FILE", str(path))
    tokens, _ = serve(monkeypatch, tmp_path)
    assert {t: sorted(s) for t, s in tokens.items()} == {"alpha": ["read", "write"], "beta": ["read"]}
    assert set(ServiceConfig.from_env().tokens) == {"alpha", "beta"}  # the library reads it too
    monkeypatch.setenv("SESSIONRL_TOKENS", "gamma:read")
    assert set(serve(monkeypatch, tmp_path)[0]) == {"gamma"}
    assert set(serve(monkeypatch, tmp_path, "--tokens", "delta:read")[0]) == {"delta"}


def test_a_tokens_file_without_a_token_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SESSIONRL_TOKENS", raising=False)
    path = tmp_path / "tokens"
    path.write_text("# nothing yet\n")
    result = runner.invoke(app, ["serve", "--db", str(tmp_path / "s.db"), "--tokens-file", str(path)])
    assert result.exit_code == 2
    said = " ".join(result.output.replace("│", " ").split())  # the error box wraps
    assert "holds no token" in said


def test_processes_starting_together_share_one_new_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: shared_tokens(path), range(16)))
    assert len({frozenset(tokens) for tokens, _ in answers}) == 1
    assert sum(created for _, created in answers) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["tokens"]  # nothing left aside
