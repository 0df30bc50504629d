"""Benchmark of `sessionrl serve` on loopback with the durable store (SQLite, WAL, synchronous=FULL).

1. Step throughput: tool steps on a zero-latency simulated skill from 64 concurrent keep-alive
   connections; steps/s, p50, p99. The same load on a bare FastAPI endpoint served the same way is the
   framework's ceiling; the ratio says how much of it the orchestrator keeps. Both servers run side by
   side and take the load in alternating windows (medians are printed), so drift in the machine's speed
   reaches both alike.
2. Slow tools: 1,000 sessions in flight, 5 tool steps each on a skill of 820 ± 340 ms; sessions/s
   against the ideal (concurrency ÷ mean session time, 1000 / 4.1 s). The same workload run by one
   synchronous loop per CPU core (one step at a time per worker) gives the speed-up.
3. With `--pair` (and wrk): two server processes on one store file take the step load at once, half the
   connections each, each on the sessions it opened. Nothing routes a session's requests between them,
   so their sum is the most a second process on the same store could add on this machine. Two bare
   endpoints loaded the same way, in alternating windows, are the ceiling of two processes.
4. With `--pair --pg` (instead of 1-3): one process against two on one PostgreSQL store, in alternating
   windows: the one takes all connections, then it and a second process take half each. Each process
   steps sessions the other opened, so every one of them is served by a process that did not create
   it. The bench starts a durable PostgreSQL (fsync on, as SQLite's synchronous=FULL) in a temporary
   folder (as the `postgres` user when run as root), or uses the database `--db postgresql://...` names.
   Then one process, and the pair, take steps at a fixed rate, 70% of one process's saturated rate
   (`p99_ms_at_70pct`, `one_p99_ms_at_70pct`), their latency timed from each request's intended send
   time (`http_load.fixed_rate`, as wrk2 does): at saturation a p99 is mostly queueing, at a fixed rate
   below it the p99 is what a client sees. The pair also takes 25% of that rate (`p99_ms_at_25pct`): a
   p99 that falls with the rate was queueing for the machine's CPUs, not a tail of its own. While each
   fixed-rate run lasts, the database's backends are sampled: the mean number waiting on a commit's
   WAL flush, on the outbox lock that orders commits (held through the flush), on a session's lock,
   and on the serve process between two statements of a transaction (`wal_sync_at_70pct`, ...).
   A window that completes no step (the machine stalled) is counted in `stalled_windows`.

Step load comes from `wrk` (one thread, keep-alive, one request in flight per connection); `make bench`
installs it (Debian: `apt-get install wrk`). Without it the bench stops, unless `--without-wrk` lets a raw
HTTP/1.1 client on asyncio take its place: that client shares the cores with the server, so the ratio to
the ceiling reads lower. Which one ran is printed and is in the JSON line (`load_generator`). Both
servers get the same client, and the server process's CPU time per
request is printed next to requests/s: on a shared machine it is the steadier figure. So is the share of
the time the server's event-loop thread was on a CPU: near 100% means the loop's own work is the limit,
less means requests were waiting elsewhere (for a commit, or for the interpreter lock). The garbage
collector's pauses in our server's windows come from its `/metrics` (`sessionrl_gc_pause_seconds`): the
share of the time they took, and how long the longest was in the window with the worst p99. The slow-tool
phase needs session ids from answers, so it always runs on the asyncio client (it is mostly waiting).
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import uvloop

from http_load import Conn, Target, call, fixed_rate

TOKEN = "bench-token"
HOST = "127.0.0.1"
CONCURRENCY = 64
STEPS_PER_SESSION = 8
STEP_SESSIONS = CONCURRENCY * 140
"""Sessions the step phase opens: fewer than the service's session cache (10,000), as on a service sized
for its active sessions. A walk over more sessions than the cache holds evicts, at each miss, the very
session the walk reaches next, and every step then re-reads its session from the store."""
SLOW_SESSIONS = 1000
SLOW_STEPS = 5
SLOW_MEAN_S = 0.820

FAST_SKILL = """
name: echo
description: Answers at once with a fixed payload.
input_schema: {type: object}
output_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
simulation: {mean_ms: 0}
"""

SLOW_SKILL = """
name: slow_lookup
description: A slow back-office lookup.
input_schema: {type: object}
output_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
sla: {timeout_s: 30}
simulation: {mean_ms: 820, std_ms: 340}
"""


# the load generator


async def create_sessions(port: int, n: int, width: int = 64) -> list[str]:
    """Open `n` sessions through `width` connections."""
    ids: list[str] = []

    async def worker(count: int) -> None:
        conn = await Conn.open(port, TOKEN)
        for _ in range(count):
            ids.append((await call(conn, "POST", "/v1/sessions", {"user_query": "bench"}))["session_id"])
        conn.close()

    await asyncio.gather(*(worker(n // width + (i < n % width)) for i in range(width)))
    return ids


async def step_load(
    port: int, sessions: list[str] | None, warmup_s: float, measure_s: float
) -> dict[str, float]:
    """CONCURRENCY connections send tool steps back to back (or, with no sessions, hit the bare endpoint).

    Each connection walks through its own sessions, STEPS_PER_SESSION steps on each, so sessions stay the
    size of real ones. Latencies are kept for requests that start inside the measuring window.
    """
    start = time.perf_counter()
    t0, t1 = start + warmup_s, start + warmup_s + measure_s
    latencies: list[float] = []
    step = {"kind": "tool", "payload": {"tool": "echo", "params": {}}}

    async def worker(i: int) -> None:
        conn = await Conn.open(port, TOKEN)
        mine = sessions[i::CONCURRENCY] if sessions is not None else ["bare"]
        n = 0
        while (now := time.perf_counter()) < t1:
            sid = mine[(n // STEPS_PER_SESSION) % len(mine)]
            await call(conn, "POST", f"/v1/sessions/{sid}/steps", step)
            if now >= t0:
                latencies.append(time.perf_counter() - now)
            n += 1
        conn.close()

    await asyncio.gather(*(worker(i) for i in range(CONCURRENCY)))
    latencies.sort()
    return {
        "rps": len(latencies) / measure_s,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "n": float(len(latencies)),
    }


async def slow_load(port: int, warmup_s: float, measure_s: float) -> dict[str, float]:
    """SLOW_SESSIONS workers run sessions back to back: open, SLOW_STEPS slow tool steps, finish."""
    start = time.perf_counter()
    t0, t1 = start + warmup_s, start + warmup_s + measure_s
    done: list[float] = []
    step = {"kind": "tool", "payload": {"tool": "slow_lookup", "params": {}}}

    async def worker() -> None:
        conn = await Conn.open(port, TOKEN)
        while time.perf_counter() < t1:
            sid = (await call(conn, "POST", "/v1/sessions", {"user_query": "bench"}))["session_id"]
            for _ in range(SLOW_STEPS):
                result = await call(conn, "POST", f"/v1/sessions/{sid}/steps", step)
                if not result["ok"]:
                    raise RuntimeError(f"slow step failed: {result}")
            await call(conn, "POST", f"/v1/sessions/{sid}/finish", {"text": "done"})
            done.append(time.perf_counter())
        conn.close()

    await asyncio.gather(*(worker() for _ in range(SLOW_SESSIONS)))
    completed = sum(t0 <= t < t1 for t in done)
    return {"sessions_per_s": completed / measure_s, "completed": float(completed)}


def sync_load(port: int, workers: int, measure_s: float) -> float:
    """`workers` threads, each a synchronous loop of the same sessions (one blocking step at a time);
    returns sessions/s, counting finished steps (÷ SLOW_STEPS) so partial sessions count too."""
    from sessionrl.client import Client

    deadline = time.perf_counter() + measure_s
    steps = [0] * workers

    def loop(i: int) -> None:
        with Client(f"http://{HOST}:{port}", TOKEN, timeout=60) as client:
            while time.perf_counter() < deadline:
                sid = client.create_session("bench").session_id
                for _ in range(SLOW_STEPS):
                    if time.perf_counter() >= deadline:
                        return
                    client.step(sid, "tool", {"tool": "slow_lookup"})
                    steps[i] += 1
                client.finish(sid, "done")

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(steps) / SLOW_STEPS / measure_s


WRK_SCRIPT = """
-- paths come from a file, one a line; a session gets STEPS requests in a row, as with the asyncio client
local paths, body, count = {}, "", 0
function init(args)
  for line in io.lines(args[1]) do paths[#paths + 1] = line end
  body = args[2]
  wrk.headers["Authorization"] = "Bearer " .. args[3]
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  local path = paths[(math.floor(count / tonumber(STEPS)) % #paths) + 1]
  count = count + 1
  return wrk.format("POST", path, nil, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "failed": %d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout + e.status))
end
"""


def server_cpu_s(pid: int, *, main_thread: bool = False) -> float:
    """User plus system CPU seconds of process `pid` (or of its main thread, where uvicorn runs the event
    loop) so far, from Linux /proc; 0.0 where there is no /proc."""
    stat = f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat"
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk_load(
    folder: Path, port: int, paths: list[str], seconds: float, connections: int = CONCURRENCY
) -> dict[str, float]:
    """`connections` wrk connections post tool steps to `paths` for `seconds`; the failed count must be 0."""
    script = folder / f"steps-{port}.lua"
    script.write_text(WRK_SCRIPT.replace("STEPS", str(STEPS_PER_SESSION)))
    listing = folder / f"paths-{port}.txt"
    listing.write_text("\n".join(paths) + "\n")
    body = json.dumps({"kind": "tool", "payload": {"tool": "echo", "params": {}}})
    command = [
        *("wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"),
        *("-s", str(script), f"http://{HOST}:{port}", "--", str(listing), body, TOKEN),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    if figures["failed"]:
        raise RuntimeError(f"wrk saw {figures['failed']} failed requests: {out}")
    return {
        "rps": figures["requests"] / (figures["duration_us"] / 1e6),
        "p50_ms": figures["p50_us"] / 1000,
        "p99_ms": figures["p99_us"] / 1000,
        "n": float(figures["requests"]),
    }


def load_generator() -> str:
    """`wrk` when it is installed, else `asyncio` (the raw HTTP/1.1 client above)."""
    return "wrk" if shutil.which("wrk") else "asyncio"


def measured_window(
    folder: Path, port: int, pid: int, sessions: list[str] | None, seconds: float
) -> dict[str, float]:
    """One window of step load on one server (wrk if installed, else the asyncio client, which warms up
    for half a second first), with the server's CPU ms per request and the share of the window its event
    loop thread was on a CPU."""
    before, loop_before, started = server_cpu_s(pid), server_cpu_s(pid, main_thread=True), time.perf_counter()
    if load_generator() == "asyncio":
        warmup_s = 0.5
        figures = asyncio.run(step_load(port, sessions, warmup_s, seconds))
        share = seconds / (warmup_s + seconds)  # warm-up requests are not counted: charge CPU pro rata
    else:
        paths = [f"/v1/sessions/{sid}/steps" for sid in sessions or ["bare"]]
        figures = wrk_load(folder, port, paths, seconds)
        share = 1.0
    cpu_s = (server_cpu_s(pid) - before) * share
    loop_busy = (server_cpu_s(pid, main_thread=True) - loop_before) / (time.perf_counter() - started)
    return {**figures, "cpu_ms": 1000 * cpu_s / figures["n"], "loop_busy": loop_busy}


def gc_pauses(port: int) -> tuple[dict[float, float], float]:
    """A server's garbage-collector pauses so far, every generation together, from its `/metrics`: the
    cumulative count at each bucket bound (seconds) and the sum of the pauses (seconds)."""
    from prometheus_client.parser import text_string_to_metric_families

    request = urllib.request.Request(
        f"http://{HOST}:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    counts: dict[float, float] = {}
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sessionrl_gc_pause_seconds_bucket":
                bound = float(sample.labels["le"])
                counts[bound] = counts.get(bound, 0.0) + sample.value
            elif sample.name == "sessionrl_gc_pause_seconds_sum":
                total += sample.value
    return counts, total


def gc_window(
    before: tuple[dict[float, float], float], after: tuple[dict[float, float], float]
) -> dict[str, float]:
    """The pauses between two `gc_pauses` readings: their total (ms) and the bucket bound (ms) the longest
    one stayed under (0 without a pause)."""
    grown = {bound: count - before[0].get(bound, 0.0) for bound, count in after[0].items()}
    pauses = grown.get(float("inf"), 0.0)
    longest = min((b for b, n in grown.items() if n == pauses and pauses), default=0.0)
    return {"gc_ms": 1000 * (after[1] - before[1]), "gc_max_ms": 1000 * longest}


def alternated(
    folder: Path,
    ours: tuple[int, int],
    bare: tuple[int, int],
    sessions: list[str],
    rounds: int,
    window_s: float,
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Step load on both servers (each a (port, pid)) in alternating windows, after a warm-up window each.

    A shared machine speeds up and slows down over seconds; alternating short windows exposes both
    servers to the same drift, so their ratio is steadier than one long run of each. Each window of ours
    walks its own slice of the sessions, so the sessions it measures start fresh.
    """
    slices = [sessions[i :: rounds + 1] for i in range(rounds + 1)]
    measured_window(folder, *ours, slices[0], window_s)
    measured_window(folder, *bare, None, window_s)
    runs: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
    for part in slices[1:]:
        pauses = gc_pauses(ours[0])
        run = measured_window(folder, *ours, part, window_s)
        runs[0].append(run | gc_window(pauses, gc_pauses(ours[0])))
        runs[1].append(measured_window(folder, *bare, None, window_s))
    return runs


# servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("server did not start")


@contextmanager
def server(args: list[str], port: int) -> Iterator[int]:
    """Run a server process until the block ends; yields its pid."""
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def sessionrl_server(folder: Path, skill: str, port: int, db: Path | str | None = None) -> list[str]:
    skills = folder / f"skills-{port}"
    skills.mkdir()
    (skills / "skill.yaml").write_text(skill)
    entry = "import sys; from sessionrl.cli import app; sys.argv[0] = 'sessionrl'; app()"
    return [
        "-c",
        entry,
        "serve",
        "--db",
        str(db or folder / f"bench-{port}.db"),
        "--skills",
        str(skills),
        "--port",
        str(port),
        "--tokens",
        f"{TOKEN}:read,write",
        "--rate",
        "1000000000",
    ]


def serve_bare(port: int) -> None:
    """The ceiling: one FastAPI endpoint at the step route, answering a small JSON body at once."""
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/sessions/{session_id}/steps")
    async def step(session_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "session_id": session_id, "kind": body.get("kind")}

    uvicorn.run(
        app, host=HOST, port=port, loop="uvloop", http="httptools", log_level="warning", access_log=False
    )


# the runs


def run_steps(folder: Path, rounds: int, window_s: float) -> dict[str, float]:
    port, bare_port = free_port(), free_port()
    with (
        server(sessionrl_server(folder, FAST_SKILL, port), port) as pid,
        server([__file__, "--bare", str(bare_port)], bare_port) as bare_pid,
    ):
        sessions = asyncio.run(create_sessions(port, STEP_SESSIONS))
        steps, bare = alternated(folder, (port, pid), (bare_port, bare_pid), sessions, rounds, window_s)
    ratios = [s["rps"] / b["rps"] for s, b in zip(steps, bare, strict=True)]
    return {
        "steps_per_s": median(steps, "rps"),
        "p50_ms": median(steps, "p50_ms"),
        "p99_ms": median(steps, "p99_ms"),
        "p99_ms_worst": (worst := max(steps, key=lambda s: s["p99_ms"]))["p99_ms"],
        "gc_max_ms_worst": worst["gc_max_ms"],
        "gc_share": sum(s["gc_ms"] for s in steps) / (1000 * window_s * len(steps)),
        "cpu_ms_per_step": median(steps, "cpu_ms"),
        "loop_busy": median(steps, "loop_busy"),
        "ceiling_rps": median(bare, "rps"),
        "ceiling_p99_ms": median(bare, "p99_ms"),
        "ceiling_cpu_ms": median(bare, "cpu_ms"),
        "ceiling_loop_busy": median(bare, "loop_busy"),
        "ceiling_ratio": statistics.median(ratios),
        "ceiling_ratio_min": min(ratios),
        "ceiling_ratio_max": max(ratios),
        "ceiling_cpu_ratio": median(bare, "cpu_ms") / cpu if (cpu := median(steps, "cpu_ms")) else 0.0,
    }


def run_pair(folder: Path, rounds: int, window_s: float) -> dict[str, float]:
    """Two `sessionrl serve` processes on one store file, loaded at once, each by half the connections on
    the half of the sessions it opened: what a second process could add to one store at best, since
    nothing routes a session's requests from one process to the other here. Two bare endpoints take the
    same load in alternating windows: the two processes' ceiling. A warm-up window each first."""
    ours, bare = (free_port(), free_port()), (free_port(), free_port())
    db = folder / "pair.db"
    with (
        server(sessionrl_server(folder, FAST_SKILL, ours[0], db), ours[0]),
        server(sessionrl_server(folder, FAST_SKILL, ours[1], db), ours[1]),
        server([__file__, "--bare", str(bare[0])], bare[0]),
        server([__file__, "--bare", str(bare[1])], bare[1]),
        ThreadPoolExecutor(2) as pool,
    ):
        halves = [asyncio.run(create_sessions(port, STEP_SESSIONS // 2)) for port in ours]

        def window(ports: tuple[int, int], paths: list[list[str]]) -> dict[str, float]:
            def load(i: int) -> dict[str, float]:
                return wrk_load(folder, ports[i], paths[i], window_s, connections=CONCURRENCY // 2)

            both = list(pool.map(load, range(2)))
            return {"rps": sum(w["rps"] for w in both), "p99_ms": max(w["p99_ms"] for w in both)}

        runs: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
        for part in range(rounds + 1):
            steps = [[f"/v1/sessions/{sid}/steps" for sid in half[part :: rounds + 1]] for half in halves]
            runs[0].append(window(ours, steps))
            runs[1].append(window(bare, [["/v1/sessions/bare/steps"]] * 2))
    ratios = [s["rps"] / b["rps"] for s, b in zip(runs[0][1:], runs[1][1:], strict=True)]
    return {
        "pair_steps_per_s": median(runs[0][1:], "rps"),
        "pair_p99_ms": median(runs[0][1:], "p99_ms"),
        "pair_ceiling_rps": median(runs[1][1:], "rps"),
        "pair_ceiling_ratio": statistics.median(ratios),
    }


@contextmanager
def postgres(url: str | None) -> Iterator[str]:
    """The database `url` names, or a durable PostgreSQL started for the bench in a temporary folder."""
    if url is not None:
        yield url
        return
    from sessionrl.store.postgres_server import LocalPostgres, find_bin_dir

    bin_dir = find_bin_dir()
    if bin_dir is None:
        sys.exit("--pg: PostgreSQL is not installed (no initdb); install it or pass --db postgresql://...")
    with LocalPostgres(bin_dir, durable=True) as server:
        import psycopg

        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute("CREATE DATABASE bench")
        yield server.url("bench")


def run_pg(folder: Path, rounds: int, window_s: float, url: str | None) -> dict[str, float]:
    """One `sessionrl serve` process against two on one PostgreSQL store, in alternating windows (a
    warm-up pair of windows first); each process steps the sessions the other opened."""
    from sessionrl.store import SessionStore

    ports = (free_port(), free_port())
    with postgres(url) as db, ExitStack() as stack, ThreadPoolExecutor(2) as pool:
        SessionStore.open(db).close()  # the tables exist before two processes open the store at once
        for port in ports:
            stack.enter_context(server(sessionrl_server(folder, FAST_SKILL, port, db), port))
        opened = [asyncio.run(create_sessions(port, STEP_SESSIONS // 2)) for port in ports]
        served = [opened[1], opened[0]]

        def window(n: int, part: int) -> dict[str, float]:
            def load(i: int) -> dict[str, float]:
                paths = [f"/v1/sessions/{sid}/steps" for sid in served[i][part :: 2 * (rounds + 1)]]
                return wrk_load(folder, ports[i], paths, window_s, connections=CONCURRENCY // n)

            both = list(pool.map(load, range(n)))
            return {"rps": sum(w["rps"] for w in both), "p99_ms": max(w["p99_ms"] for w in both)}

        one = [window(1, 2 * r) for r in range(rounds + 1)]
        pair = [window(2, 2 * r + 1) for r in range(rounds + 1)]
        steady = at_fixed_rate(ports, served, median(one[1:], "rps"), rounds * window_s, db)
    # a window in which the machine stalled completes no step: it is counted, not divided by
    speedups = [p["rps"] / o["rps"] for o, p in zip(one[1:], pair[1:], strict=True) if o["rps"]] or [0.0]
    return {
        "stalled_windows": float(sum(not w["rps"] for w in one[1:] + pair[1:])),
        "pg_one_steps_per_s": median(one[1:], "rps"),
        "pg_one_p99_ms": median(one[1:], "p99_ms"),
        "pg_pair_steps_per_s": median(pair[1:], "rps"),
        "p99_ms": median(pair[1:], "p99_ms"),
        "pair_speedup": statistics.median(speedups),
        "pair_speedup_min": min(speedups),
        "pair_speedup_max": max(speedups),
        **steady,
    }


AT_SHARE = 0.7
"""The fixed request rate of `--pg`'s latency figure, as a share of one process's saturated rate."""
LOW_SHARE = 0.25
"""A lower fixed rate the pair also takes: a p99 that falls with the rate was queueing, not a tail."""


def at_fixed_rate(
    ports: tuple[int, int], served: list[list[str]], saturated: float, seconds: float, db: str
) -> dict[str, float]:
    """The latency of one process, then of the pair, at AT_SHARE of `saturated` steps/s, and of the pair
    at LOW_SHARE of it (after a second's warm-up each), timed from each request's intended send time
    (`http_load.fixed_rate`): latency, not queueing, unless the rate is more than they can take.
    CONCURRENCY connections, split evenly over the pair. Meanwhile the database's backends are sampled
    (`pg_waits`) to say what a slow step waited on."""
    step = {"kind": "tool", "payload": {"tool": "echo", "params": {}}}
    paths = [[f"/v1/sessions/{sid}/steps" for sid in sessions] for sessions in served]
    one = [Target(ports[0], paths[0], STEPS_PER_SESSION)]
    pair = [Target(port, mine, STEPS_PER_SESSION) for port, mine in zip(ports, paths, strict=True)]
    figures: dict[str, float] = {"rate_at_70pct": AT_SHARE * saturated}
    for name, targets, share, suffix in (
        ("one_", one, AT_SHARE, "70pct"),
        ("", pair, AT_SHARE, "70pct"),
        ("", pair, LOW_SHARE, "25pct"),
    ):
        load = fixed_rate(
            targets,
            step,
            rate=share * saturated,
            seconds=seconds,
            warmup_s=1.0,
            connections=CONCURRENCY,
            token=TOKEN,
        )
        with pg_waits(db) as waits:
            run = asyncio.run(load)
        if run["failed"]:
            raise RuntimeError(f"{run['failed']:.0f} steps failed at the fixed rate")
        figures |= {
            f"{name}p99_ms_at_{suffix}": run["p99_ms"],
            f"{name}p50_ms_at_{suffix}": run["p50_ms"],
            f"{name}rps_at_{suffix}": run["rps"],
            f"{name}late_share_at_{suffix}": run["late_share"],
            f"{name}p99_sent_ms_at_{suffix}": run["p99_sent_ms"],
            **{f"{name}{wait}_at_{suffix}": n for wait, n in waits.items()},
        }
    return figures


WAITS = {
    "wal_sync": "wait_event = 'WALSync'",
    "outbox_lock": "wait_event = 'advisory' AND query LIKE 'INSERT INTO outbox%'",
    "session_lock": "wait_event = 'advisory' AND query NOT LIKE 'INSERT INTO outbox%'",
    "client_in_txn": "state LIKE 'idle in transaction%'",
}
"""What a database backend of a write may be waiting on: its commit's WAL flush, the outbox lock that
orders commits for the change feed (`sessionrl.store.postgres`), a session's lock, or the client (a
`sessionrl serve` process between two statements of its transaction: its CPU time, or the interpreter
lock)."""


@contextmanager
def pg_waits(url: str, every_s: float = 0.02) -> Iterator[dict[str, float]]:
    """Sample the database's client backends every `every_s` while the block runs; the dict yielded is
    filled, when the block ends, with the mean number of backends in each of WAITS and `pg_samples`."""
    import psycopg

    counts = [0] * len(WAITS)
    shares: dict[str, float] = {}
    stop = threading.Event()
    columns = ", ".join(f"count(*) FILTER (WHERE {where})" for where in WAITS.values())
    sql = (
        f"SELECT {columns} FROM pg_stat_activity"
        " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        samples = 0

        def sample() -> None:
            nonlocal samples
            while not stop.wait(every_s):
                row = conn.execute(sql).fetchone()
                if row is not None:
                    samples += 1
                    for i, n in enumerate(row):
                        counts[i] += int(n)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield shares
        finally:
            stop.set()
            sampler.join()
    shares.update({name: n / max(samples, 1) for name, n in zip(WAITS, counts, strict=True)})
    shares["pg_samples"] = float(samples)


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def run_slow(folder: Path, warmup_s: float, measure_s: float, sync_s: float) -> dict[str, float]:
    port = free_port()
    with server(sessionrl_server(folder, SLOW_SKILL, port), port):
        slow = asyncio.run(slow_load(port, warmup_s, measure_s))
        workers = os.cpu_count() or 1
        sync = sync_load(port, workers, sync_s)
    ideal = SLOW_SESSIONS / (SLOW_STEPS * SLOW_MEAN_S)
    return {
        "slow_tool_sessions_per_s": slow["sessions_per_s"],
        "slow_tool_ideal": ideal,
        "slow_tool_efficiency": slow["sessions_per_s"] / ideal,
        "sync_workers": float(workers),
        "sync_sessions_per_s": sync,
        "sync_speedup": slow["sessions_per_s"] / sync if sync else float("inf"),
    }


def pause_text(longest_ms: float) -> str:
    return f"its longest GC pause under {longest_ms:.0f} ms" if longest_ms else "no GC pause in it"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bare", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="Shorter windows (a smoke run).")
    parser.add_argument(
        "--pair",
        action="store_true",
        help="Also load two server processes on one store file, half the sessions each (needs wrk).",
    )
    parser.add_argument(
        "--pg",
        action="store_true",
        help="With --pair: only one process against two on one PostgreSQL store (see the module doc).",
    )
    parser.add_argument("--db", help="With --pg: the PostgreSQL database to use (postgresql://...).")
    parser.add_argument(
        "--without-wrk",
        action="store_true",
        help="Where wrk is missing, load with the asyncio client (it shares the cores with the server).",
    )
    args = parser.parse_args()
    if args.bare:
        serve_bare(args.bare)
        return
    uvloop.install()
    rounds, window, slow_s, sync_s = (2, 1.0, 6.0, 5.0) if args.quick else (5, 3.0, 20.0, 20.0)
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load average {load:.2f} at the start (other work skews every figure)")
    generator = load_generator()
    if generator == "asyncio" and not args.without_wrk:
        sys.exit(
            "wrk is not installed: `make bench` installs it (Debian: sudo apt-get install wrk). Or pass "
            "--without-wrk to load with the asyncio client, which shares the cores with the server."
        )
    client = "wrk" if generator == "wrk" else "the asyncio client (wrk is not installed; it costs more CPU)"
    print(f"load generator: {client}")
    if args.pg:
        main_pg(args.db, rounds, window, load)
        return
    with tempfile.TemporaryDirectory(prefix="sessionrl-bench-") as tmp:
        folder = Path(tmp)
        steps = run_steps(folder, rounds, window)
        print(
            f"steps ({rounds} windows of {window:.0f} s, medians): {steps['steps_per_s']:.0f}/s"
            f"  p50 {steps['p50_ms']:.1f} ms  p99 {steps['p99_ms']:.1f} ms"
            f" (worst window {steps['p99_ms_worst']:.1f}, {pause_text(steps['gc_max_ms_worst'])};"
            f" GC {steps['gc_share']:.1%} of the time)"
            f"  server CPU {steps['cpu_ms_per_step']:.3f} ms/step, event loop busy {steps['loop_busy']:.0%}"
            f"  | bare FastAPI {steps['ceiling_rps']:.0f}/s, {steps['ceiling_cpu_ms']:.3f} ms/request,"
            f" loop busy {steps['ceiling_loop_busy']:.0%}"
            f"  -> {steps['ceiling_ratio']:.0%} of the ceiling (windows {steps['ceiling_ratio_min']:.0%}"
            f"-{steps['ceiling_ratio_max']:.0%}; {steps['ceiling_cpu_ratio']:.0%} by CPU)",
            flush=True,
        )
        pair = run_pair(folder, rounds, window) if args.pair and generator == "wrk" else {}
        if args.pair and not pair:
            print("two processes: skipped, wrk is not installed", flush=True)
        if pair:
            print(
                f"two processes on one store file, {CONCURRENCY // 2} connections each on its own sessions:"
                f" {pair['pair_steps_per_s']:.0f}/s in all, p99 {pair['pair_p99_ms']:.1f} ms (median of"
                f" the worse process's) = {pair['pair_steps_per_s'] / steps['steps_per_s']:.2f}x one process"
                f"  | two bare FastAPI processes {pair['pair_ceiling_rps']:.0f}/s"
                f"  -> {pair['pair_ceiling_ratio']:.0%} of their ceiling",
                flush=True,
            )
        slow = run_slow(folder, 2 * SLOW_STEPS * SLOW_MEAN_S, slow_s, sync_s)
        print(
            f"slow tools: {slow['slow_tool_sessions_per_s']:.1f} sessions/s"
            f" of ideal {slow['slow_tool_ideal']:.1f}"
            f" ({slow['slow_tool_efficiency']:.0%})  | {slow['sync_workers']:.0f} sync loops:"
            f" {slow['sync_sessions_per_s']:.2f} sessions/s -> speed-up {slow['sync_speedup']:.0f}x",
            flush=True,
        )
    figures = {k: round(v, 4) for k, v in {**steps, **pair, **slow, "load_average": load}.items()}
    print(json.dumps({**figures, "load_generator": generator}))


def main_pg(url: str | None, rounds: int, window_s: float, load: float) -> None:
    """The `--pair --pg` run: its line of text, then its JSON line."""
    if load_generator() != "wrk":
        sys.exit("--pg needs wrk: `make bench` installs it (Debian: sudo apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="sessionrl-bench-") as tmp:
        pg = run_pg(Path(tmp), rounds, window_s, url)
    print(
        f"PostgreSQL ({rounds} windows of {window_s:.0f} s each, medians): one process"
        f" {pg['pg_one_steps_per_s']:.0f}/s (p99 {pg['pg_one_p99_ms']:.1f} ms), two processes"
        f" {pg['pg_pair_steps_per_s']:.0f}/s (p99 {pg['p99_ms']:.1f} ms, the worse process's) ->"
        f" {pg['pair_speedup']:.2f}x (windows {pg['pair_speedup_min']:.2f}-{pg['pair_speedup_max']:.2f}x)",
        flush=True,
    )
    print(
        f"at a fixed {pg['rate_at_70pct']:.0f} steps/s ({AT_SHARE:.0%} of one process's rate), latency from"
        f" the intended send time: one process p50 {pg['one_p50_ms_at_70pct']:.1f} ms, p99"
        f" {pg['one_p99_ms_at_70pct']:.1f} ms; two processes p50 {pg['p50_ms_at_70pct']:.1f} ms, p99"
        f" {pg['p99_ms_at_70pct']:.1f} ms ({pg['late_share_at_70pct']:.1%} of requests sent late);"
        f" at {LOW_SHARE:.0%} the pair's p50 {pg['p50_ms_at_25pct']:.1f} ms,"
        f" p99 {pg['p99_ms_at_25pct']:.1f} ms",
        flush=True,
    )
    print(
        "database backends waiting, on average, at 70% (one process / two): "
        + ", ".join(f"{w} {pg[f'one_{w}_at_70pct']:.2f} / {pg[f'{w}_at_70pct']:.2f}" for w in WAITS),
        flush=True,
    )
    figures = {k: round(v, 4) for k, v in {**pg, "load_average": load}.items()}
    print(json.dumps({**figures, "load_generator": "wrk"}))


if __name__ == "__main__":
    main()
