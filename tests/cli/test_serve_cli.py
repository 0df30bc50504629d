"""`sessionrl serve` hands uvicorn the app and its options (the server's run is replaced: nothing listens),
and its server says where it listens once it does."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import uvicorn
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.cli.serve import ListeningServer
from sessionrl.cli.sessions import DEFAULT_DB

runner = CliRunner()


def refusal(*args: str) -> str:
    """What `sessionrl serve --tokens t:read ARGS` says as it refuses them (exit code 2), as one line of
    words: rich's error box and its line breaks taken out."""
    result = runner.invoke(app, ["serve", "--tokens", "t:read", *args])
    assert result.exit_code == 2, result.output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.output).split())


def served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> dict[str, Any]:
    """The uvicorn options `sessionrl serve ARGS` runs its server with, the app as `app`."""
    seen: dict[str, Any] = {}

    def run(server: ListeningServer) -> None:
        c = server.config
        seen.update(port=c.port, loop=c.loop, http=c.http, app=c.app, proxy_headers=c.proxy_headers)
        seen.update(server_header=c.server_header, date_header=c.date_header)

    monkeypatch.setattr(ListeningServer, "run", run)
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


def test_a_config_file_sets_what_no_flag_does_and_flags_override_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = tmp_path / "service.yaml"
    settings.write_text("rate_per_s: 50\norchestrator: {free_form_tools: true, cache_size: 7}\n")
    config = served(monkeypatch, tmp_path, "--config", str(settings))["app"].state.config
    assert (config.rate_per_s, config.orchestrator.free_form_tools, config.orchestrator.cache_size) == (
        50,
        True,
        7,
    )
    flagged = served(monkeypatch, tmp_path, "--config", str(settings), "--rate", "9", "--cache-sessions", "8")
    config = flagged["app"].state.config
    assert (config.rate_per_s, config.orchestrator.free_form_tools, config.orchestrator.cache_size) == (
        9,
        True,
        8,
    )
    settings.write_text("- not a mapping\n")
    assert "must hold a mapping" in refusal("--config", str(settings))


def test_every_service_flag_is_typed_described_and_defaulted_by_its_field() -> None:
    from sessionrl.cli.config_flags import field_info
    from sessionrl.cli.serve import SERVICE_FLAGS
    from sessionrl.service import ServiceConfig

    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    helps = {param.opts[0]: str(param.help) for param in command.params}
    for flag in SERVICE_FLAGS:
        assert str(field_info(ServiceConfig, flag.path).description) in helps[flag.flag], flag
    assert helps["--rate"].endswith("[default: 2000.0]")
    assert helps["--cache-sessions"].endswith("[default: 10000]")
    untyped = refusal("--time-factor", "fast")
    assert "--time-factor" in untyped
    assert "valid number" in untyped


def test_a_refused_setting_is_named_by_the_flag_that_gave_it_or_by_the_config_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    flagged = refusal("--rate", "-3")
    assert "--rate" in flagged
    assert "rate_per_s" in flagged
    settings = tmp_path / "service.yaml"
    settings.write_text("orchestrator: {cache_size: 0}\n")
    filed = refusal("--config", str(settings))
    assert "--config" in filed
    assert "orchestrator.cache_size" in filed


def test_a_token_may_burst_to_twice_its_rate_unless_the_burst_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    rated = served(monkeypatch, tmp_path, "--rate", "9")["app"].state.config
    assert (rated.rate_per_s, rated.burst) == (9, 18)
    settings = tmp_path / "service.yaml"
    settings.write_text("rate_burst: 5\n")
    assert (
        served(monkeypatch, tmp_path, "--config", str(settings), "--rate", "9")["app"].state.config.burst == 5
    )


def test_ops_settings_come_from_a_yaml_file_merged_over_the_config_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = tmp_path / "service.yaml"
    settings.write_text("ops: {policy: agent}\n")
    ops = tmp_path / "ops.yaml"
    ops.write_text("webhook_timeout_s: 0.5\n")
    config = served(monkeypatch, tmp_path, "--config", str(settings), "--ops", str(ops))["app"].state.config
    assert (config.ops.policy, config.ops.webhook_timeout_s) == ("agent", 0.5)
    ops.write_text("[1, 2]\n")
    refused = refusal("--ops", str(ops))
    assert "--ops" in refused
    assert "must hold a mapping" in refused


def test_db_takes_a_path_or_a_url_and_defaults_to_the_store_the_other_commands_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    urls: list[str] = []
    monkeypatch.setattr(
        ListeningServer, "run", lambda server: urls.append(server.config.app.state.config.db_url)
    )
    monkeypatch.delenv("SESSIONRL_DB", raising=False)
    for db in ([], ["--db", "runs/sessions.db"], ["--db", "sqlite:///runs/sessions.db"]):
        result = runner.invoke(app, ["serve", *db, "--tokens", "t:read,write"])
        assert result.exit_code == 0, result.output
    monkeypatch.setenv("SESSIONRL_DB", "/srv/s.db")
    assert runner.invoke(app, ["serve", "--tokens", "t:read,write"]).exit_code == 0
    assert urls == [DEFAULT_DB] * 3 + ["sqlite:////srv/s.db"]


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest ASGI app: every request gets an empty 204."""
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_the_server_says_where_it_listens(capsys: pytest.CaptureFixture[str]) -> None:
    server = ListeningServer(
        uvicorn.Config(hello, host="127.0.0.1", port=0, lifespan="off", log_level="error")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    server.should_exit = True
    await task
    (line,) = capsys.readouterr().err.splitlines()
    assert re.fullmatch(r"listening on http://127\.0\.0\.1:\d+", line)
    assert not line.endswith(":0")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_port_serves_the_metrics_without_a_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port = free_port()
    answers: list[httpx.Response] = []

    def run(server: ListeningServer) -> None:  # while serving: a scrape with no token, and the API's own
        answers.append(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10))
        with TestClient(server.config.app) as api:
            answers.append(api.get("/metrics"))

    monkeypatch.setattr(ListeningServer, "run", run)
    command = ["serve", "--db", str(tmp_path / "s.db"), "--tokens", "t:read", "--metrics-port", str(port)]
    result = runner.invoke(app, command)
    assert result.exit_code == 0, result.output
    assert f"metrics on http://127.0.0.1:{port}/metrics (no token)" in result.output
    scrape, api = answers
    assert scrape.status_code == 200
    assert "sessionrl_http_requests" in scrape.text
    assert api.status_code == 401
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)  # closed when the service stops
