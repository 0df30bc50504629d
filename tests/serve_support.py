"""`sessionrl serve` as a real process on a free loopback port, for tests that need one (or several)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve_process(db: str | Path, skills: Path, token: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`sessionrl serve` on `db` with `token` (read and write); its base URL and process once it answers
    `/healthz`. The process is stopped at the end if it still runs."""
    port = free_port()
    entry = "import sys; from sessionrl.cli import app; sys.argv[0] = 'sessionrl'; app()"
    command = [sys.executable, "-c", entry, "serve", "--db", str(db), "--skills", str(skills)]
    command += ["--port", str(port), "--tokens", f"{token}:read,write", "--rate", "1000000"]
    proc = subprocess.Popen(command)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "sessionrl serve exited"
            assert time.monotonic() < deadline, "sessionrl serve did not start"
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
