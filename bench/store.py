"""Benchmark of the session store on realistic traffic (SQLite file, WAL, synchronous=FULL).

1. Ingest: `--n` generated sessions (3–8 tool calls, 1–4 LLM calls, 0–2 feedback items each) appended with
   `append_batch`, 250 sessions per transaction; sessions/s counts store time only, not generation.
2. Durable appends: single `append` calls, each its own transaction acknowledged after its fsync, on the
   full store; p50 and p99 latency. After each append, one 4 KiB write + fsync of a plain file in the same
   folder is timed too: that floor says how much of the append latency is the disk's at that moment.
3. The seed question, "of the sessions whose feedback comment mentions chronic disease, what fraction
   called crp_test_request?", in SQL over the query tables (median of several runs), the same question
   through the typed `SessionQuery` filters, and a per-tool failure-rate group-by.
4. The same question answered the naive way: every session kept as a JSON blob in a list (as a Redis list
   of documents would hold them), decoded and scanned in Python; the ratio naive / SQL.

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from sessionrl.cli.store_demo import CHRONIC_SQL, CHRONIC_TOOL, FAILURE_RATES_SQL
from sessionrl.errors import SessionRLError
from sessionrl.session import Session, codec
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.store.dialect import contains_pattern, match_phrase
from sessionrl.store.synthetic import batch_items, generate

NEEDLE = "chronic disease"
BATCH_SESSIONS = 250
SINGLE_APPENDS = 2000
QUERY_RUNS = 7


def ingest(store: SessionStore, n: int, seed: int) -> tuple[float, list[bytes]]:
    """Append `n` sessions in batches; return the seconds spent in the store and each session as JSON."""
    spent = 0.0
    blobs: list[bytes] = []
    for first in range(0, n, BATCH_SESSIONS):
        sessions = list(generate(min(BATCH_SESSIONS, n - first), seed, first))
        items = [item for events in sessions for item in batch_items(events)]
        started = time.perf_counter()
        results = store.append_batch(items)
        spent += time.perf_counter() - started
        last: dict[str, Session] = {}
        for result in results:
            if isinstance(result, SessionRLError):
                raise result
            last[result.session_id] = result
        blobs += [codec.dumps(s) for s in last.values()]
        if (first // BATCH_SESSIONS) % 40 == 0:
            print(f"  ingested {first + len(sessions):>7} / {n}", flush=True)
    return spent, blobs


def fsync_ms(probe: int) -> float:
    """Time (ms) to write 4 KiB at the start of an open file and fsync it: the disk's cost of one commit."""
    started = time.perf_counter()
    os.pwrite(probe, bytes(4096), 0)
    os.fsync(probe)
    return (time.perf_counter() - started) * 1000


def single_appends(
    store: SessionStore, count: int, seed: int, probe: int
) -> tuple[list[float], list[float], list[bytes]]:
    """Latency (ms) of `count` single durable appends (the events of fresh sessions, one at a time), the
    disk's fsync floor timed after each (`fsync_ms` on `probe`), and the sessions they left, as JSON."""
    latencies: list[float] = []
    floor: list[float] = []
    last: dict[str, Session] = {}
    for events in generate(count, seed=seed):
        for sid, event, _ in batch_items(events):
            if len(latencies) == count:
                return latencies, floor, [codec.dumps(s) for s in last.values()]
            started = time.perf_counter()
            last[sid] = store.append(sid, event)
            latencies.append((time.perf_counter() - started) * 1000)
            floor.append(fsync_ms(probe))
    return latencies, floor, [codec.dumps(s) for s in last.values()]


def timed(run: Callable[[], Any], repeats: int = QUERY_RUNS) -> tuple[float, Any]:
    """Median wall time in ms of `repeats` runs after one warm-up, and the last result."""
    result = run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def naive_answer(blobs: list[bytes]) -> tuple[int, int]:
    """The seed question over JSON blobs: decode each session and look at its feedback and calls."""
    matched = called = 0
    for blob in blobs:
        doc = orjson.loads(blob)
        if any(NEEDLE in (f.get("comment") or "").lower() for f in doc["feedback"]):
            matched += 1
            called += any(c["tool"] == CHRONIC_TOOL for c in doc["tool_calls"])
    return matched, called


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def measure(n: int, seed: int) -> dict[str, Any]:
    """Run every measurement on a fresh file store of `n` sessions; return the figures."""
    with tempfile.TemporaryDirectory(prefix="sessionrl-bench-") as folder:
        db = Path(folder) / "sessions.db"
        with SessionStore.open(f"sqlite:///{db}") as store:
            print(f"ingesting {n} sessions into {db}")
            spent, blobs = ingest(store, n, seed)
            started = time.perf_counter()
            store.project()
            projection_s = time.perf_counter() - started
            probe = os.open(Path(folder) / "fsync-probe", os.O_WRONLY | os.O_CREAT)
            try:
                latencies, floor, more = single_appends(store, SINGLE_APPENDS, seed + 1, probe)
            finally:
                os.close(probe)
            blobs += more
            store.project()
            params = {
                "tool": CHRONIC_TOOL,
                "phrase": match_phrase(NEEDLE),
                "pattern": contains_pattern(NEEDLE),
            }
            seed_ms, (row,) = timed(lambda: store.sql(CHRONIC_SQL, params))
            groupby_ms, _ = timed(lambda: store.sql(FAILURE_RATES_SQL))
            of, having = SessionQuery(comment_contains=NEEDLE), SessionQuery(tool_called=CHRONIC_TOOL)
            typed_ms, share = timed(lambda: store.fraction(of, having), repeats=3)
        size_mb = sum(p.stat().st_size for p in Path(folder).glob("sessions.db*")) / 1e6
    naive_ms, naive = timed(lambda: naive_answer(blobs), repeats=3)
    if naive != (row["matched"], row["called"]) or abs(share - row["called"] / row["matched"]) > 1e-12:
        raise SystemExit(f"answers differ: naive {naive}, typed {share}, SQL {row}")
    return {
        "sessions": n,
        "session_json_bytes": round(sum(map(len, blobs)) / len(blobs)),
        "db_mb": round(size_mb, 1),
        "ingest_per_s": round(n / spent, 1),
        "projection_s": round(projection_s, 2),
        "append_p50_ms": round(percentile(latencies, 0.50), 3),
        "append_p99_ms": round(percentile(latencies, 0.99), 3),
        "fsync_p50_ms": round(percentile(floor, 0.50), 3),
        "fsync_p99_ms": round(percentile(floor, 0.99), 3),
        "seed_query_ms": round(seed_ms, 2),
        "groupby_ms": round(groupby_ms, 2),
        "typed_query_ms": round(typed_ms, 2),
        "naive_query_ms": round(naive_ms, 2),
        "naive_ratio": round(naive_ms / seed_ms, 1),
        "seed_matched": row["matched"],
        "seed_called": row["called"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000, help="sessions to ingest")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated traffic")
    args = parser.parse_args()
    f = measure(args.n, args.seed)
    print(
        f"ingest           {f['ingest_per_s']} sessions/s (store time), then {f['projection_s']} s projection"
    )
    print(
        f"durable append   p50 {f['append_p50_ms']} ms, p99 {f['append_p99_ms']} ms, {SINGLE_APPENDS} appends"
        f" (disk fsync alone: p50 {f['fsync_p50_ms']} ms, p99 {f['fsync_p99_ms']} ms)"
    )
    answer = f"{f['seed_called']} of {f['seed_matched']} called {CHRONIC_TOOL}"
    print(f"seed question    {f['seed_query_ms']} ms ({answer})")
    print(f"same, typed      {f['typed_query_ms']} ms (SessionQuery filters through store.fraction)")
    print(f"failure group-by {f['groupby_ms']} ms")
    print(f"naive JSON scan  {f['naive_query_ms']} ms ({f['naive_ratio']}x the SQL question)")
    print(json.dumps(f))


if __name__ == "__main__":
    main()
