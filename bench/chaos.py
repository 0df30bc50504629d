"""Chaos run (`make chaos`, long; not part of `make test`): kill writers and servers, fuzz the service.

1. Writer kills: on each backend (SQLite file, PostgreSQL), `--kill-trials` trials of a forked writer
   appending to the store, killed with SIGKILL at a random moment (`bench/research/crash.py`); every
   acknowledged write must be in the store, every log must fold to its view, the store consistent.
2. Server kills: on each backend, one `sessionrl serve` process under load from `--drivers` clients,
   each driving sessions (open, tool steps, finish) with an idempotency key per request and retrying a
   request that failed in transit with the same key, as the client library does. The server is killed
   with SIGKILL `--serve-kills` times at random moments and started again on the same store (forked
   from a zygote that has done the imports: see `Zygote`). At the end, every step the clients saw
   acknowledged must be in its session exactly once; every 5xx answer counts as a server error, the
   retried 502/503/504 too.
3. Fuzzing: at least `--fuzz-cases` Schemathesis cases against a live `sessionrl serve`, spread over
   every operation of its OpenAPI document; a 5xx answer is a server error, except the documented 503 of
   the chat gateway on a service started without a chat backend (`no_backend`), counted apart.

PostgreSQL is started in a temporary folder (as the `postgres` user when run as root; without its
programs the PostgreSQL half is skipped, saying so). Progress lines go to stdout as it runs. The last
line is one JSON object: `kill_trials` and `serve_kills` per backend (the least of the backends'),
`acknowledged_lost`, `steps_lost`, `fuzz_cases` and `server_errors` over the whole run, then the other
counts, and every figure of each backend under `by_backend`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
    began = time.monotonic()
    for trial in range(trials):
        if trial % per_db == 0:
            url = make_url(f"kills{trial}")
        acked = run_trial(url, trial, rng)
        found = survivors(url, trial, acked)
        acknowledged += found.acknowledged
        lost += found.lost
        broken += len(found.broken)
        drift += len(found.drift)
        if (trial + 1) % 100 == 0:
            progress(f"writer kills {trial + 1}/{trials}, {lost} of {acknowledged} acknowledged lost", began)
    return {"kill_trials": trials, "acknowledged": acknowledged, "acknowledged_lost": lost,
            "broken_logs": broken, "drift": drift}  # fmt: skip


# 2. server kills


def serve_argv(url: str, skills: Path, port: int) -> list[str]:
    """The `sessionrl serve` arguments of a chaos server on `url`."""
    return ["serve", "--db", url, "--skills", str(skills), "--port", str(port),
            "--tokens", f"{TOKEN}:read,write", "--rate", "1000000000"]  # fmt: skip


class Zygote:
    """Starts `sessionrl serve` processes by forking an interpreter that has imported sessionrl once.

    A server started from a new interpreter spends seconds importing on a loaded machine: at 100 kills per
    backend that is most of the run. The zygote (this file run with `--zygote`) imports the CLI, the
    service and the store backends, then forks one child per start; the child parses its arguments and
    serves as `sessionrl serve` would. The kill stays honest: each server is its own process, opens its
    own store connections in its lifespan and dies by SIGKILL with requests in flight; only the imports,
    which hold no state, are shared. The zygote holds no thread, socket or store when it forks (it checks
    the thread count) and lets the kernel reap its children (SIGCHLD ignored), so a killed server's pid
    disappears as soon as it is dead.
    """

    def __init__(self) -> None:
        command = [sys.executable, __file__, "--zygote"]
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self._line() != "ready":
            raise RuntimeError(f"the zygote did not start; see {LOG}")

    def _line(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def spawn(self, argv: list[str]) -> int:
        """Fork a `sessionrl <argv>` process; its pid."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        answer = self._line()
        if not answer.isdigit():
            raise RuntimeError(f"the zygote did not fork ({answer!r}); see {LOG}")
        return int(answer)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def zygote_main() -> None:
    """The zygote's side of `Zygote`: import, then fork a child for each line of arguments on stdin."""
    import threading

    import psycopg  # noqa: F401 - imported before the forks, as the CLI and the service are

    import sessionrl.store.postgres  # noqa: F401
    from sessionrl.cli import app

    if threading.active_count() != 1:
        raise RuntimeError(f"the zygote runs {threading.active_count()} threads: forking it is unsafe")
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    print("ready", flush=True)
    for line in sys.stdin:
        argv = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(app, argv)
        print(pid, flush=True)


def _child(app: Any, argv: list[str]) -> None:
    """In a forked child: run `sessionrl <argv>` with its output in LOG, and never return."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.argv = ["sessionrl", *argv]
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def start_serve(zygote: Zygote, argv: list[str], base: str) -> int:
    """Start a server and wait until it answers; its pid."""
    pid = zygote.spawn(argv)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if not alive(pid):
            raise RuntimeError(f"sessionrl serve (pid {pid}) exited; see {LOG}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return pid
        except httpx.TransportError:
            time.sleep(0.02)
    kill(pid)
    raise RuntimeError(f"sessionrl serve did not start; see {LOG}")


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to a server and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + 60
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


class Driver:
    """Drives sessions back to back; a request that fails in transit is sent again with its key."""

    def __init__(self, client: httpx.AsyncClient, name: str, stop: asyncio.Event) -> None:
        self.client, self.name, self.stop = client, name, stop
        self.acked: list[tuple[str, str]] = []
        """(session id, call id) of every step answered 200."""
        self.errors: Counter[int] = Counter()
        """Answers by status other than success, the retried 502/503/504 among them."""

    async def send(self, path: str, body: dict[str, Any], key: str) -> dict[str, Any]:
        while True:
            try:
                answer = await self.client.post(path, json=body, headers={"Idempotency-Key": key})
            except httpx.TransportError:
                await asyncio.sleep(0.05)
                continue
            if answer.status_code in (502, 503, 504):  # retried as the client library does, but counted
                self.errors[answer.status_code] += 1
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


async def load_with_kills(
    zygote: Zygote, argv: list[str], base: str, kills: int, drivers: int
) -> list[Driver]:
    """Drivers load the server while it is killed `kills` times and started again each time."""
    rng = random.Random(7)
    stop = asyncio.Event()
    pid = await asyncio.to_thread(start_serve, zygote, argv, base)
    limits = httpx.Limits(max_connections=drivers)
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=30, limits=limits) as client:  # fmt: skip
        team = [Driver(client, f"d{i}", stop) for i in range(drivers)]
        tasks = [asyncio.create_task(d.run()) for d in team]
        try:
            for n in range(1, kills + 1):
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                kill(pid)
                pid = await asyncio.to_thread(start_serve, zygote, argv, base)
                if n % 10 == 0 or n == kills:
                    acked = sum(len(d.acked) for d in team)
                    progress(f"server kills {n}/{kills}, {acked} steps acknowledged", began)
            await asyncio.sleep(1.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
        finally:
            for task in tasks:
                task.cancel()
            kill(pid, signal.SIGTERM)
    return team


def progress(what: str, began: float) -> None:
    print(f"  {what} ({time.monotonic() - began:.0f} s)", flush=True)


def serve_kills(zygote: Zygote, url: str, folder: Path, kills: int, drivers: int) -> dict[str, int]:
    from sessionrl.store import SessionStore

    skills = folder / "skills"
    skills.mkdir(exist_ok=True)
    (skills / "lookup.yaml").write_text(SKILL)
    port = free_port()
    argv = serve_argv(url, skills, port)
    team = asyncio.run(load_with_kills(zygote, argv, f"http://127.0.0.1:{port}", kills, drivers))
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


def fuzz(zygote: Zygote, url: str, folder: Path, cases: int) -> dict[str, int]:
    """At least `cases` Schemathesis cases against a live `sessionrl serve` on `url`, spread evenly over
    its operations. Hypothesis stops an operation early when it has tried every value its schema
    allows, so passes with new seeds follow until the count is reached."""
    import schemathesis

    skills = folder / "fuzz-skills"
    skills.mkdir(exist_ok=True)
    (skills / "lookup.yaml").write_text(SKILL)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pid = start_serve(zygote, serve_argv(url, skills, port), base)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    counts: Counter[str] = Counter()
    began = time.monotonic()
    try:
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json", headers=auth)
        operations = [op.ok() for op in schema.get_all_operations()]  # type: ignore[union-attr]
        for seed in range(100):
            if counts["cases"] >= cases:
                break
            each = -(-(cases - counts["cases"]) // len(operations))
            for operation in operations:
                fuzz_operation(operation, base, auth, each, seed, counts)
            progress(f"fuzzing: pass {seed + 1}, {counts['cases']}/{cases} cases", began)
    finally:
        kill(pid, signal.SIGTERM)
    return {
        "fuzz_cases": counts["cases"],
        "fuzz_operations": len(operations),
        "server_errors": counts["server_errors"],
        "no_backend_503": counts["no_backend_503"],
    }


def fuzz_operation(
    operation: Any, base: str, auth: dict[str, str], cases: int, seed: int, counts: Counter[str]
) -> None:
    """Up to `cases` cases of one operation (seed `seed`), counted in `counts`; a 5xx is printed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed

    @with_seed(seed)
    @given(case=operation.as_strategy())
    @settings(max_examples=cases, deadline=None, suppress_health_check=list(HealthCheck),
              database=None, phases=[Phase.generate])  # fmt: skip
    def one(case: Any) -> None:
        response = case.call(base_url=base, headers=auth)
        counts["cases"] += 1
        if response.status_code == 503 and b'"no_backend"' in response.content:
            counts["no_backend_503"] += 1
        elif response.status_code >= 500:
            counts["server_errors"] += 1
            print(f"5xx: {case.method} {case.formatted_path} -> {response.status_code}: "
                  f"{response.text[:300]}", flush=True)  # fmt: skip

    one()


PER_BACKEND = ("kill_trials", "serve_kills")
"""Figures the JSON line gives per backend (the least of the backends'); the others are summed."""
KEYS = ("kill_trials", "acknowledged_lost", "serve_kills", "steps_lost", "fuzz_cases", "server_errors")


def summary(runs: dict[str, dict[str, int]], fuzzed: dict[str, int], seconds: float) -> dict[str, Any]:
    """The JSON line: the acceptance figures first (`kill_trials` and `serve_kills` per backend, losses
    and 5xx answers over every backend and the fuzzing), then every figure by backend."""
    totals: Counter[str] = Counter(fuzzed)
    for figures in runs.values():
        totals.update({k: v for k, v in figures.items() if k not in PER_BACKEND})
    totals["server_errors"] += totals["serve_errors_5xx"]
    line: dict[str, Any] = {k: min((f.get(k, 0) for f in runs.values()), default=0) for k in PER_BACKEND}
    line |= {k: totals[k] for k in KEYS if k not in PER_BACKEND}
    line = {k: line[k] for k in KEYS}
    line |= {k: v for k, v in sorted(totals.items()) if k not in KEYS}
    return line | {"by_backend": runs, "backends": ",".join(runs), "seconds": round(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-trials", type=int, default=1000, help="Writer kills per backend.")
    parser.add_argument("--serve-kills", type=int, default=100, help="Server kills per backend.")
    parser.add_argument("--drivers", type=int, default=16, help="Clients loading the server.")
    parser.add_argument("--fuzz-cases", type=int, default=10_000, help="Schemathesis cases in all.")
    parser.add_argument(
        "--backends", default="sqlite,postgresql", help="Comma-separated: sqlite, postgresql."
    )
    parser.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.zygote:
        zygote_main()
        return
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    runs: dict[str, dict[str, int]] = {}
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="sessionrl-chaos-") as tmp,
        store_urls(Path(tmp), args.backends.split(",")) as urls,
    ):
        zygote = Zygote()
        try:
            for backend, make_url in urls.items():
                kills = writer_kills(make_url, args.kill_trials) if args.kill_trials else {}
                print(f"{backend} writer kills: {kills}", flush=True)
                served = (
                    serve_kills(zygote, make_url("serve"), Path(tmp), args.serve_kills, args.drivers)
                    if args.serve_kills
                    else {}
                )
                print(f"{backend} server kills: {served}", flush=True)
                runs[backend] = kills | served
            first = next(iter(urls.values()))
            fuzzed = fuzz(zygote, first("fuzz"), Path(tmp), args.fuzz_cases) if args.fuzz_cases else {}
            print(f"fuzzing: {fuzzed}", flush=True)
        finally:
            zygote.close()
    print(json.dumps(summary(runs, fuzzed, time.monotonic() - started)))


if __name__ == "__main__":
    main()
