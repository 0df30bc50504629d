"""A throwaway PostgreSQL server in a temporary folder (`LocalPostgres`): `sessionrl store postgres` for a
person trying the PostgreSQL store, and the tests and benchmarks.

It listens on a Unix socket inside its folder only (no TCP port), trusts local connections, and is
tuned for speed over durability (`fsync=off`) unless started `durable` (as a benchmark that compares it
with SQLite's synchronous commits must): it is for data that may be lost with the machine, never for a
store that matters. PostgreSQL refuses to run as root, so when this process is root the server
runs as the `postgres` user, who is given the folder.

    with LocalPostgres(find_bin_dir()) as server:
        store = SessionStore.open(server.url())
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import quote

SETTINGS = ("listen_addresses=''", "max_connections=200")
"""Server settings: no TCP."""

FAST = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")
"""Settings of a server that is not `durable`: no waiting on the disk."""

OS_USER = "postgres"
"""The account the server runs under when this process is root."""


def find_bin_dir() -> Path | None:
    """The folder holding `initdb` and `pg_ctl`: from `$PATH`, else the newest Debian install."""
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).parent
    installs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(installs[-1]).parent if installs else None


class LocalPostgres:
    """Start with `with LocalPostgres(bin_dir) as server:`; `server.url(db)` names a database on it."""

    def __init__(self, bin_dir: Path, user: str = OS_USER, *, durable: bool = False) -> None:
        self.bin_dir = bin_dir
        self.durable = durable
        self.as_root = os.geteuid() == 0
        self.os_user = user if self.as_root else pwd.getpwuid(os.geteuid()).pw_name
        self.folder = Path(tempfile.mkdtemp(prefix="sessionrl-pg-"))
        self.data = self.folder / "data"

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self.as_root:
            command = ["runuser", "-u", self.os_user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> None:
        """Create the cluster (UTF-8, C.UTF-8 character classes, so trigrams see Chinese) and start it."""
        if self.as_root:
            shutil.chown(self.folder, self.os_user)
        self._run(
            "initdb", "-D", str(self.data), "-U", self.os_user, "--auth=trust", "--encoding=UTF8",
            "--locale=C.UTF-8", "--no-sync",
        )  # fmt: skip
        settings = SETTINGS if self.durable else (*SETTINGS, *FAST)
        options = " ".join([f"-k {self.folder}", *(f"-c {s}" for s in settings)])
        log = str(self.folder / "server.log")
        self._run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", log, "-o", options)

    def url(self, database: str = "postgres", options: str = "") -> str:
        """A libpq URL for a database on this server (`options`: settings such as `-csearch_path=x`)."""
        url = f"postgresql:///{database}?host={quote(str(self.folder), safe='')}&user={self.os_user}"
        return url + (f"&options={quote(options, safe='')}" if options else "")

    def stop(self) -> None:
        """Stop the server at once and remove its folder."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
