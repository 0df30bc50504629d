"""`sessionrl store postgres`: a throwaway PostgreSQL server a person can point `--db` at, gone on Ctrl-C."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pg_support import unavailable
from sessionrl.session import SessionCreate
from sessionrl.store import SessionStore
from sessionrl.store.postgres_server import OS_USER, find_bin_dir

pytestmark = pytest.mark.slow


def test_the_server_takes_a_store_and_is_gone_after_ctrl_c() -> None:
    if find_bin_dir() is None:
        unavailable("PostgreSQL is not installed: no initdb on PATH or under /usr/lib/postgresql/*/bin")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(OS_USER)
        except KeyError:
            unavailable(f"PostgreSQL refuses to run as root and there is no {OS_USER!r} user to run it as")
    command = [str(Path(sys.executable).parent / "sessionrl"), "store", "postgres"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert server.stdout is not None
    assert server.stderr is not None
    try:
        url = server.stdout.readline().strip()
        said = server.stderr.readline()
        assert url.startswith("postgresql:///"), (url, said)
        folder = Path(said.split(" in ", 1)[1].split(";", 1)[0])
        assert folder.is_dir()
        with SessionStore.open(url) as store:
            sid = store.create(SessionCreate(user_query="stored on PostgreSQL")).session_id
        with SessionStore.open(url) as store:
            assert store.get(sid).user_query == "stored on PostgreSQL"
    finally:
        server.send_signal(signal.SIGINT)
        _, rest = server.communicate(timeout=60)
    assert server.returncode == 0, rest
    assert "stopped; its data is gone" in rest
    assert not folder.exists()
