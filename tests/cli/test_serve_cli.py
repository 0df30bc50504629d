"""`sessionrl serve` hands uvicorn the app and its options (uvicorn itself is replaced: nothing listens)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import uvicorn
from typer.testing import CliRunner

from sessionrl.cli import app

runner = CliRunner()


def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> dict[str, Any]:
    """The keyword arguments `sessionrl serve ARGS` passes to `uvicorn.run`, and the app as `app`."""
    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda application, **kw: seen.update(kw, app=application))
    command = ["serve", "--db", str(tmp_path / "s.db"), "--tokens", "t:read,write", "--port", "9123", *args]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    return seen


def test_serve_sends_no_server_or_date_header_and_ignores_forwarded_headers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    options = served(monkeypatch, tmp_path)
    assert (options["port"], options["loop"], options["http"]) == (9123, "uvloop", "httptools")
    headers = (options["server_header"], options["date_header"], options["proxy_headers"])
    assert headers == (False, False, False)


def test_proxy_headers_are_trusted_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert served(monkeypatch, tmp_path, "--proxy-headers")["proxy_headers"] is True


def test_the_session_cache_is_sized_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = served(monkeypatch, tmp_path)["app"].state.config.orchestrator.cache_size
    sized = served(monkeypatch, tmp_path, "--cache-sessions", "50000")["app"].state.config.orchestrator
    assert (default, sized.cache_size) == (10_000, 50_000)
    assert runner.invoke(app, ["serve", "--cache-sessions", "0"]).exit_code == 2


def test_full_collections_are_spaced_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    default = served(monkeypatch, tmp_path)["app"].state.config.full_gc_every_s
    spaced = served(monkeypatch, tmp_path, "--full-gc-every", "60")["app"].state.config.full_gc_every_s
    assert (default, spaced) == (600.0, 60.0)
    assert runner.invoke(app, ["serve", "--full-gc-every", "0"]).exit_code == 2
