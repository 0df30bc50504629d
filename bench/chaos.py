"""Chaos run (`make chaos`, long; not part of `make test`): kill writers and servers, fuzz the service.

1. Writer kills: on each backend (SQLite file, PostgreSQL), `--kill-trials` trials of a forked writer
   appending to the store, killed with SIGKILL at a random moment (`bench/research/crash.py`); every
   acknowledged write must be in the store, every log must fold to its view, the store consistent.
2. Server kills: on each backend, one `sessionrl serve` process under load from `--drivers` clients,
   each driving sessions (open, tool steps, finish) with an idempotency key per request and retrying a
   request that failed in transit with the same key, as the client library does. The server is killed
   with SIGKILL `--serve-kills` times at random moments and started again on the same store. At the
   end, every step the clients saw acknowledged must be in its session exactly once.
3. Fuzzing: `--fuzz-cases` Schemathesis cases against a live `sessionrl serve`, spread over every
   operation of its OpenAPI document; a 5xx answer is a server error, except the documented 503 of the
   chat gateway on a service started without a chat backend (`no_backend`), counted apart.

PostgreSQL is started in a temporary folder (as the `postgres` user when run as root; without its
programs the PostgreSQL half is skipped, saying so). The last line is one JSON object with
`kill_trials`, `acknowledged_lost`, `serve_kills`, `steps_lost`, `fuzz_cases` and `server_errors`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

TOKEN = "chaos-token"
SKILL = """
name: lookup
description: A lookup that takes a few milliseconds.
input_schema: {type: object}
output_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
simulation: {mean_ms: 3, std_ms: 1}
"""
STEPS = 5
LOG = Path(tempfile.gettempdir()) / "sessionrl-chaos-serve.log"
"""Where the servers started here write their output (read it when one does not start)."""
START_S = 180
"""How long a server may take to answer: on a loaded machine its imports alone take many seconds."""


# stores


@contextmanager
def store_urls(folder: Path, backends: list[str]) -> Iterator[dict[str, Any]]:
    """`{backend: make_url}`, where `make_url(name)` gives a new empty store's URL on that backend."""
    urls: dict[str, Any] = {}
    with ExitStack() as stack:
        if "sqlite" in backends:
            urls["sqlite"] = lambda name: f"sqlite:///{folder / name}.db"
        if "postgresql" in backends:
            from sessionrl.store.postgres_server import LocalPostgres, find_bin_dir

            bin_dir = find_bin_dir()
            if bin_dir is None:
                print("postgresql: skipped, PostgreSQL is not installed (no initdb)", flush=True)
            else:
                import psycopg

                server = stack.enter_context(LocalPostgres(bin_dir, durable=True))

                def database(name: str) -> str:
                    with psycopg.connect(server.url(), autocommit=True) as admin:
                        admin.execute(f"CREATE DATABASE {name}")
                    return server.url(name)

                urls["postgresql"] = database
        yield urls


# 1. writer kills


def writer_kills(make_url: Any, trials: int, per_db: int = 10) -> dict[str, int]:
    from research.crash import run_trial, survivors

    rng = random.Random(2026)
    lost = broken = drift = acknowledged = 0
    for trial in range(trials):
        if trial % per_db == 0:
            url = make_url(f"kills{trial}")
        acked = run_trial(url, trial, rng)
        found = survivors(url, trial, acked)
        acknowledged += found.acknowledged
        lost += found.lost
        broken += len(found.broken)
        drift += len(found.drift)
    return {"kill_trials": trials, "acknowledged": acknowledged, "acknowledged_lost": lost,
            "broken_logs": broken, "drift": drift}  # fmt: skip


# 2. server kills


def serve_command(url: str, skills: Path, port: int) -> list[str]:
    entry = "import sys; from sessionrl.cli import app; sys.argv[0] = 'sessionrl'; app()"
    return [sys.executable, "-c", entry, "serve", "--db", url, "--skills", str(skills), "--port", str(port),
            "--tokens", f"{TOKEN}:read,write", "--rate", "1000000000"]  # fmt: skip


def start_serve(command: list[str], base: str) -> subprocess.Popen[bytes]:
    log = open(LOG, "ab")  # noqa: SIM115 - the server writes to it until it ends
    proc = subprocess.Popen(command, stdout=log, stderr=log)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sessionrl serve exited with {proc.returncode}; see {LOG}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"sessionrl serve did not start; see {LOG}")


class Driver:
    """Drives sessions back to back; a request that fails in transit is sent again with its key."""

    def __init__(self, client: httpx.AsyncClient, name: str, stop: asyncio.Event) -> None:
        self.client, self.name, self.stop = client, name, stop
        self.acked: list[tuple[str, str]] = []
        """(session id, call id) of every step answered 200."""
        self.errors: Counter[int] = Counter()

    async def send(self, path: str, body: dict[str, Any], key: str) -> dict[str, Any]:
        while True:
            try:
                answer = await self.client.post(path, json=body, headers={"Idempotency-Key": key})
            except httpx.TransportError:
                await asyncio.sleep(0.05)
                continue
            if answer.status_code in (502, 503, 504):
                await asyncio.sleep(0.05)
                continue
            if answer.status_code >= 300:
                self.errors[answer.status_code] += 1
                raise RuntimeError(f"{path} -> {answer.status_code}: {answer.text[:200]}")
            result: dict[str, Any] = answer.json()
            return result

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            key = f"{self.name}-{n}"
            sid = (await self.send("/v1/sessions", {"user_query": "chaos"}, key))["session_id"]
            for k in range(STEPS):
                step = {"kind": "tool", "payload": {"tool": "lookup", "params": {}}}
                result = await self.send(f"/v1/sessions/{sid}/steps", step, f"{key}-t{k}")
                self.acked.append((sid, result["call_id"]))
            await self.send(f"/v1/sessions/{sid}/finish", {"text": "done"}, f"{key}-f")
            n += 1


async def load_with_kills(command: list[str], base: str, kills: int, drivers: int) -> list[Driver]:
    """Drivers load the server while it is killed `kills` times and started again each time."""
    rng = random.Random(7)
    stop = asyncio.Event()
    proc = await asyncio.to_thread(start_serve, command, base)
    limits = httpx.Limits(max_connections=drivers)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=30, limits=limits) as client:  # fmt: skip
        team = [Driver(client, f"d{i}", stop) for i in range(drivers)]
        tasks = [asyncio.create_task(d.run()) for d in team]
        try:
            for _ in range(kills):
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                proc = await asyncio.to_thread(start_serve, command, base)
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        finally:
            for task in tasks:
                task.cancel()
            proc.terminate()
            proc.wait()
    return team


def serve_kills(url: str, folder: Path, kills: int, drivers: int) -> dict[str, int]:
    from sessionrl.store import SessionStore

    skills = folder / "skills"
    skills.mkdir(exist_ok=True)
    (skills / "lookup.yaml").write_text(SKILL)
    port = free_port()
    team = asyncio.run(
        load_with_kills(serve_command(url, skills, port), f"http://127.0.0.1:{port}", kills, drivers)
    )
    acked = [a for d in team for a in d.acked]
    lost = duplicated = 0
    with SessionStore.open(url) as store:
        for sid, call_id in acked:
            found = sum(1 for c in store.get(sid).tool_calls if c.call_id == call_id)
            lost += found == 0
            duplicated += found > 1
        clean = store.consistency_check().clean
    errors = sum((d.errors for d in team), Counter[int]())
    return {
        "serve_kills": kills,
        "steps_acknowledged": len(acked),
        "steps_lost": lost,
        "steps_duplicated": duplicated,
        "serve_errors_4xx": sum(n for status, n in errors.items() if status < 500),
        "serve_errors_5xx": sum(n for status, n in errors.items() if status >= 500),
        "inconsistent_stores": int(not clean),
    }


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# 3. fuzzing


def fuzz(url: str, folder: Path, cases: int) -> dict[str, int]:
    """`cases` Schemathesis cases against a live `sessionrl serve` on `url`, spread over its operations."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    skills = folder / "fuzz-skills"
    skills.mkdir(exist_ok=True)
    (skills / "lookup.yaml").write_text(SKILL)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_serve(serve_command(url, skills, port), base)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    counts: Counter[str] = Counter()
    try:
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=auth)
        operations = [op.ok() for op in schema.get_all_operations()]  # type: ignore[union-attr]
        each = max(1, cases // len(operations))
        for operation in operations:

            @given(case=operation.as_strategy())
            @settings(max_examples=each, deadline=None, suppress_health_check=list(HealthCheck),
                      derandomize=True, database=None)  # fmt: skip
            def one(case: Any) -> None:
                response = case.call(base_url=base, headers=auth)
                counts["cases"] += 1
                if response.status_code == 503 and b'"no_backend"' in response.content:
                    counts["no_backend_503"] += 1
                elif response.status_code >= 500:
                    counts["server_errors"] += 1
                    print(f"5xx: {case.method} {case.formatted_path} -> {response.status_code}", flush=True)

            one()
    finally:
        proc.terminate()
        proc.wait()
    return {
        "fuzz_cases": counts["cases"],
        "server_errors": counts["server_errors"],
        "no_backend_503": counts["no_backend_503"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-trials", type=int, default=1000, help="Writer kills per backend.")
    parser.add_argument("--serve-kills", type=int, default=100, help="Server kills per backend.")
    parser.add_argument("--drivers", type=int, default=16, help="Clients loading the server.")
    parser.add_argument("--fuzz-cases", type=int, default=10_000, help="Schemathesis cases in all.")
    parser.add_argument(
        "--backends", default="sqlite,postgresql", help="Comma-separated: sqlite, postgresql."
    )
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    totals: Counter[str] = Counter()
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="sessionrl-chaos-") as tmp,
        store_urls(Path(tmp), args.backends.split(",")) as urls,
    ):
        for backend, make_url in urls.items():
            kills = writer_kills(make_url, args.kill_trials) if args.kill_trials else {}
            print(f"{backend} writer kills: {kills}", flush=True)
            served = (
                serve_kills(make_url("serve"), Path(tmp), args.serve_kills, args.drivers)
                if args.serve_kills
                else {}
            )
            print(f"{backend} server kills: {served}", flush=True)
            totals.update(kills)
            totals.update(served)
        first = next(iter(urls.values()))
        fuzzed = fuzz(first("fuzz"), Path(tmp), args.fuzz_cases) if args.fuzz_cases else {}
        print(f"fuzzing: {fuzzed}", flush=True)
        totals.update(fuzzed)
    keys = ("kill_trials", "acknowledged_lost", "serve_kills", "steps_lost", "fuzz_cases", "server_errors")
    line = {k: totals.get(k, 0) for k in keys} | {k: v for k, v in totals.items() if k not in keys}
    print(json.dumps(line | {"backends": ",".join(urls), "seconds": round(time.monotonic() - started)}))


if __name__ == "__main__":
    main()
