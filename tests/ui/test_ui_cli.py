"""`sessionrl ui`: the dashboard alone, on a store that must exist."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
from typer.testing import CliRunner
from ui_support import READER, TOKENS, free_port

from sessionrl.cli import app
from sessionrl.store import SessionStore, synthetic

BIN = Path(sys.executable).parent


def test_a_store_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["ui", "--db", str(tmp_path / "none.db")])
    assert result.exit_code == 1
    assert "no session store at" in result.output
    assert not (tmp_path / "none.db").exists()


def test_the_command_serves_the_pages_and_the_docs(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with SessionStore.open(f"sqlite:///{db}") as store:
        synthetic.ingest(store, 3, seed=1)
    port = free_port()
    command = [str(BIN / "sessionrl"), "ui", "--db", str(db), "--runs", str(tmp_path), "--port", str(port)]
    server = subprocess.Popen([*command, "--tokens", TOKENS], stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                login = httpx.get(f"{base}/ui/login")
                break
            except httpx.ConnectError:
                assert server.poll() is None, server.stderr.read() if server.stderr else ""
                assert time.monotonic() < deadline, "sessionrl ui did not start in 60 s"
                time.sleep(0.2)
        assert login.status_code == 200
        page = httpx.get(f"{base}/ui/sessions", headers={"Authorization": f"Bearer {READER}"})
        assert '<b id="found">3</b>' in page.text
        assert httpx.get(f"{base}/docs").status_code == 200
        assert httpx.post(f"{base}/v1/sessions", json={"user_query": "x"}).status_code == 404  # no step API
    finally:
        server.terminate()
        server.wait(10)
        if server.stderr:
            server.stderr.close()
