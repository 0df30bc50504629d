"""Benchmark of the dashboard: time to first render of the session list over a large store, and of the page
of one 200-step session.

1. A SQLite store holding `--n` generated sessions (`sessionrl.store.synthetic`, 3–8 tool calls each,
   appended in bulk: `append_batch`, 1000 sessions a transaction) and one session of `--steps` steps
   (tool and LLM calls over a plan of sub-goals), unless `--db` names an existing store (the long
   session is then added to it).
2. The dashboard (`sessionrl ui`) on a loopback port; `start_s` is how long it took to start, which
   includes projecting what the fill left unprojected (the dashboard does that before it serves).
   The first request for each page is timed from sending it to the last byte of the HTML (the server's
   whole render: query, count and template): `list_first_ms`, `session_first_ms`; then `--repeat`
   more give the medians `list_ms`, `session_ms`. The list is also timed searching text (`search_ms`:
   `q=refund`, through the text index) and filtering failed tasks (`failed_ms`: `outcome=failed`).
3. Unless `--no-browser`, Debian's Chromium (through Playwright) opens each page and the time to its
   `load` event is reported (`list_browser_ms`, `session_browser_ms`).

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from sessionrl.service import parse_tokens
from sessionrl.session.events import Event, LLMCallRecorded, PlanSet, StateChanged, ToolCallRecorded
from sessionrl.session.model import (
    CallStatus,
    LLMCall,
    Message,
    Plan,
    SessionCreate,
    SessionState,
    SubGoal,
    ToolCall,
)
from sessionrl.store import SessionStore, synthetic
from sessionrl.ui import UIConfig, create_ui_app

TOKEN = "bench-reader"
LONG_ID = "bench-long-session"


def long_session_events(steps: int) -> list[Event]:
    """A session of `steps` steps: a plan of `steps // 8` sub-goals, then tool calls (one in ten failing,
    one in seven retried) and an LLM call after every third tool call."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    n_goals = max(1, steps // 8)
    goals = tuple(
        SubGoal(
            id=f"g{i}",
            description=f"sub-goal {i}",
            tool=f"tool_{i % 9}",
            depends_on=(f"g{i - 1}",) if i else (),
        )
        for i in range(n_goals)
    )
    events: list[Event] = [
        StateChanged(state=SessionState.PLANNING, at=t0),
        PlanSet(plan=Plan(root_goal="a long task", subgoals=goals), at=t0),
        StateChanged(state=SessionState.EXECUTING, at=t0),
    ]
    at = t0
    for k in range(steps):
        start, at = at, at + timedelta(milliseconds=40 + k % 13)
        if k % 4 == 3:
            messages = (Message(role="user", content=f"step {k}: what next?"),)
            call: LLMCall | ToolCall = LLMCall(
                call_id=f"l{k}",
                messages=messages,
                response="next",
                tokens_used=120,
                started_at=start,
                finished_at=at,
            )
            events.append(LLMCallRecorded(call=call, at=at))
            continue
        status = CallStatus.ERROR if k % 10 == 0 else CallStatus.SUCCESS
        tool = ToolCall(
            call_id=f"t{k}",
            subgoal_id=f"g{k % n_goals}",
            tool=f"tool_{k % 9}",
            params={"k": k},
            output={"rows": k} if status == CallStatus.SUCCESS else None,
            status=status,
            error_code="E_BENCH" if status == CallStatus.ERROR else None,
            latency_ms=40 + k % 13,
            attempt=2 if k % 7 == 0 else 1,
            started_at=start,
            finished_at=at,
        )
        events.append(ToolCallRecorded(call=tool, at=at))
    events.append(StateChanged(state=SessionState.FINISHED, at=at))
    return events


def build_store(db: Path, n: int, steps: int, seed: int) -> None:
    """Fill `db` with `n` generated sessions (when it holds none yet) and the long session."""
    with SessionStore.open(f"sqlite:///{db}") as store:
        if n and not store.session_ids():
            synthetic.ingest(store, n, seed=seed, batch_sessions=1000, progress=True)
        if LONG_ID not in store.session_ids():
            store.create(SessionCreate(user_query="a long task", session_id=LONG_ID))
            for result in store.append_batch([(LONG_ID, e, None) for e in long_session_events(steps)]):
                if isinstance(result, Exception):
                    raise result


def serve(app: Any, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server


def timed(client: httpx.Client, path: str, repeat: int) -> tuple[float, float]:
    """Milliseconds of the first request for `path`, and the median of `repeat` more."""
    times = []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        answer = client.get(path)
        answer.raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return times[0], statistics.median(times[1:]) if repeat else times[0]


def browser_times(base: str, paths: list[str]) -> list[float]:
    """Milliseconds from navigation to the `load` event of each page, in Debian's Chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context(extra_http_headers={"Authorization": f"Bearer {TOKEN}"})
        page = context.new_page()
        out = []
        for path in paths:
            started = time.perf_counter()
            page.goto(base + path, wait_until="load")
            out.append((time.perf_counter() - started) * 1000)
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=100_000, help="generated sessions in the store")
    parser.add_argument("--steps", type=int, default=200, help="steps of the long session")
    parser.add_argument(
        "--db", type=Path, help="an existing store to use (default: a new one in a temp folder)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="timed requests after the first")
    parser.add_argument("--port", type=int, default=8377)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-browser", action="store_true", help="do not time the pages in Chromium")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "sessions.db"
        started = time.perf_counter()
        build_store(db, args.n, args.steps, args.seed)
        print(f"store ready in {time.perf_counter() - started:.1f} s: {db}", flush=True)
        app = create_ui_app(f"sqlite:///{db}", UIConfig(runs_dir=Path(tmp)), parse_tokens(f"{TOKEN}:read"))
        started = time.perf_counter()
        server = serve(app, args.port)
        result: dict[str, Any] = {"n_sessions": args.n, "steps": args.steps}
        result["load_avg"] = round(os.getloadavg()[0], 1)  # other work on the machine slows every figure
        result["start_s"] = round(time.perf_counter() - started, 1)
        base = f"http://127.0.0.1:{args.port}"
        try:
            result |= page_times(base, args.repeat)
            if not args.no_browser:
                in_browser = browser_times(base, ["/ui/sessions", f"/ui/sessions/{LONG_ID}"])
                result |= {
                    "list_browser_ms": round(in_browser[0], 1),
                    "session_browser_ms": round(in_browser[1], 1),
                }
        finally:
            server.should_exit = True
    print(f"dashboard started in {result['start_s']} s (projecting what the fill left)")
    print(
        f"session list over {args.n} sessions: first {result['list_first_ms']:.0f} ms,"
        f" median {result['list_ms']:.0f} ms; text search {result['search_ms']:.0f} ms,"
        f" failed tasks {result['failed_ms']:.0f} ms"
    )
    print(
        f"{args.steps}-step session page: first {result['session_first_ms']:.0f} ms,"
        f" median {result['session_ms']:.0f} ms"
    )
    if not args.no_browser:
        print(
            f"in Chromium, to the load event: list {result['list_browser_ms']:.0f} ms,"
            f" session {result['session_browser_ms']:.0f} ms"
        )
    print(json.dumps(result))


def page_times(base: str, repeat: int) -> dict[str, float]:
    """First and median server times of the list, the long session, a text search and a verdict filter."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=300) as client:
        list_first, list_median = timed(client, "/ui/sessions", repeat)
        session_first, session_median = timed(client, f"/ui/sessions/{LONG_ID}", repeat)
        _, search = timed(client, "/ui/sessions?q=refund", repeat)
        _, failed = timed(client, "/ui/sessions?outcome=failed", repeat)
    return {
        "list_first_ms": round(list_first, 1),
        "list_ms": round(list_median, 1),
        "session_first_ms": round(session_first, 1),
        "session_ms": round(session_median, 1),
        "search_ms": round(search, 1),
        "failed_ms": round(failed, 1),
    }


if __name__ == "__main__":
    main()
