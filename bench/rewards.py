"""Benchmark of the reward engine over stored sessions (SQLite file store, WAL, synchronous=FULL).

1. Setup: `--n` generated sessions ingested into a file store (reused when `--db` already holds them).
2. Scoring: every finished session read from the store in batches (`iter_sessions`) and scored with the
   shipped rules, the offline judge and running normalisation; sessions/s end to end, and for the
   scoring alone (store reads excluded).
3. Storing: `score_and_store` on the first `--store-n` finished sessions (each a durable transaction),
   then the same calls again, which find nothing new to write; sessions/s of each pass.

The last line is one JSON object; `sessions_per_s` is the end-to-end figure of step 2.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from sessionrl.rewards import RewardEngine
from sessionrl.session import SessionState
from sessionrl.store import SessionStore
from sessionrl.store.synthetic import ingest


def prepare(store: SessionStore, n: int, seed: int) -> float:
    """Ingest `n` sessions unless the store already holds them; return the seconds spent (0 if reused)."""
    held = len(store.session_ids())
    if held >= n:
        print(f"reusing {held} stored sessions")
        return 0.0
    if held:
        raise SystemExit(f"the store holds {held} sessions, fewer than --n {n}; use an empty --db")
    started = time.perf_counter()
    ingest(store, n, seed=seed, progress=True)
    return time.perf_counter() - started


def score_all(store: SessionStore, engine: RewardEngine) -> tuple[int, float, float, float]:
    """Score every finished session; return (count, wall seconds, seconds inside `score`, CPU seconds).

    CPU seconds (this process) tell the cost apart from waiting on a busy machine."""
    count, scoring = 0, 0.0
    started, cpu = time.perf_counter(), time.process_time()
    for session in store.iter_sessions(SessionState.FINISHED, batch=500):
        t = time.perf_counter()
        engine.score(session)
        scoring += time.perf_counter() - t
        count += 1
        if count % 20_000 == 0:
            print(f"  scored {count}", flush=True)
    return count, time.perf_counter() - started, scoring, time.process_time() - cpu


def store_pass(store: SessionStore, engine: RewardEngine, ids: list[str]) -> tuple[float, int]:
    """`score_and_store` each id; return (seconds, versions written)."""
    started = time.perf_counter()
    written = sum(engine.score_and_store(store, sid).new for sid in ids)
    return time.perf_counter() - started, written


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000, help="sessions in the store")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated traffic")
    parser.add_argument("--db", type=Path, default=None, help="store file to (re)use [default: a temp dir]")
    parser.add_argument("--store-n", type=int, default=2_000, help="sessions scored and stored in step 3")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "rewards.db"
        with SessionStore.open(f"sqlite:///{path}") as store:
            ingest_s = prepare(store, args.n, args.seed)
            engine = RewardEngine()
            print(f"rules {engine.ruleset.version}")
            count, wall, scoring, cpu = score_all(store, engine)
            rate = count / wall
            print(f"scored {count} finished sessions in {wall:.1f} s: {rate:,.0f} sessions/s end to end,")
            print(f"  {count / scoring:,.0f} sessions/s in scoring alone ({scoring / wall:.0%} of the time)")
            print(f"  {count / cpu:,.0f} sessions per CPU second (reads included)")

            ids = store.session_ids(SessionState.FINISHED)[: args.store_n]
            first_s, written = store_pass(store, engine, ids)
            again_s, rewritten = store_pass(store, engine, ids)
            print(f"score_and_store: {len(ids) / first_s:,.0f} sessions/s writing {written} versions,")
            print(f"  {len(ids) / again_s:,.0f} sessions/s when nothing changed ({rewritten} written)")

    print(
        json.dumps(
            {
                "sessions": count,
                "sessions_per_s": round(count / wall, 1),
                "scoring_only_per_s": round(count / scoring, 1),
                "sessions_per_cpu_s": round(count / cpu, 1),
                "store_per_s": round(len(ids) / first_s, 1),
                "store_unchanged_per_s": round(len(ids) / again_s, 1),
                "ingest_s": round(ingest_s, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
