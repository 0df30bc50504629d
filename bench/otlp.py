"""Benchmark of the OTLP receiver against the session API, writing the same sessions.

One `sessionrl serve` process over a durable SQLite store (`SESSIONRL_TRACES_ROOT_GRACE_S=0`, so a
session is finished as soon as its root span comes). Each session is a small agent run: a root span, an
LLM call asking for a tool, the tool call, and an LLM call answering. The same sessions are written both
ways, in alternating rounds so drift in the machine's speed reaches both alike:

- OTLP: spans sent as an OTLP exporter sends them, protobuf batches of `--batch` spans
  (`BatchSpanProcessor` sends up to 512), one request at a time per client;
- API: per session, `POST /v1/sessions`, three record-mode steps (`POST .../steps`) and
  `POST .../finish`, as an agent using the client would.

`--clients` concurrent clients drive each side. Printed per round, then one JSON line:
`otlp_spans_per_s` (spans stored per second), `api_steps_per_s` (API writes per second: the create, the
steps and the finish), `ratio` (their quotient), and the sessions per second of each side with their
ratio (`sessions_ratio`, the like-for-like figure: the same sessions either way).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPANS_PER_SESSION = 4
API_WRITES_PER_SESSION = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(db: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    entry = "import sys; from sessionrl.cli import app; sys.argv[0] = 'sessionrl'; app()"
    command = [sys.executable, "-c", entry, "serve", "--db", str(db), "--port", str(port)]
    command += ["--tokens", f"{TOKEN}:read,write", "--rate", "1000000000", "--log-level", "warning"]
    env = {**os.environ, "SESSIONRL_TRACES_ROOT_GRACE_S": "0"}
    proc = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, "sessionrl serve exited"
        assert time.monotonic() < deadline, "sessionrl serve did not start"
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return url, proc
        except httpx.TransportError:
            time.sleep(0.1)


def question(n: int) -> str:
    return f"Where is order {n}?"


def session_spans(tag: str, n: int) -> list[Any]:
    """The four GenAI-convention spans of session `n` (trace ids unique per tag and n)."""
    from sessionrl.capture.otlp_spans import Span

    trace = hashlib.blake2b(f"{tag}-{n}".encode(), digest_size=16).hexdigest()
    t0 = 1_780_000_000_000_000_000 + n * 1_000_000_000
    ms = 1_000_000
    user = [{"role": "user", "parts": [{"type": "text", "content": question(n)}]}]
    asked = [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": f"call_{n}", "name": "order_status", "arguments": {"order_id": n}}
            ],
        }
    ]
    said = [{"role": "assistant", "parts": [{"type": "text", "content": f"Order {n} is packed."}]}]
    chat = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "fake-1",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 7,
    }
    ids = [hashlib.blake2b(f"{tag}-{n}-{i}".encode(), digest_size=8).hexdigest() for i in range(4)]

    def span(i: int, attributes: dict[str, Any], start: int, end: int) -> Any:
        parent = None if i == 0 else ids[0]
        return Span(trace, ids[i], parent, f"span {i}", t0 + start * ms, t0 + end * ms, attributes)

    return [
        span(0, {"gen_ai.operation.name": "invoke_agent"}, 0, 10),
        span(
            1,
            {**chat, "gen_ai.input.messages": json.dumps(user), "gen_ai.output.messages": json.dumps(asked)},
            1,
            3,
        ),
        span(
            2,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "order_status",
                "gen_ai.tool.call.id": f"call_{n}",
                "gen_ai.tool.call.arguments": json.dumps({"order_id": n}),
                "gen_ai.tool.call.result": json.dumps({"status": "packed"}),
            },
            4,
            5,
        ),
        span(
            3,
            {**chat, "gen_ai.input.messages": json.dumps(user), "gen_ai.output.messages": json.dumps(said)},
            6,
            9,
        ),
    ]


async def otlp_side(url: str, tag: str, sessions: int, batch: int, clients: int) -> float:
    """Seconds to send every session's spans as OTLP protobuf batches."""
    from sessionrl.capture.otlp import encode

    per_request = max(1, batch // SPANS_PER_SESSION)
    bodies = [
        encode(
            [s for n in range(start, min(start + per_request, sessions)) for s in session_spans(tag, n)],
            json=False,
        )
        for start in range(0, sessions, per_request)
    ]
    headers = {**AUTH, "Content-Type": "application/x-protobuf"}

    async def client(mine: list[bytes], http: httpx.AsyncClient) -> None:
        for body in mine:
            answer = await http.post("/v1/traces", content=body, headers=headers)
            assert answer.status_code == 200, answer.text

    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(bodies[i::clients], http) for i in range(clients)))
        return time.perf_counter() - start


async def api_side(url: str, tag: str, sessions: int, clients: int) -> float:
    """Seconds to write the same sessions through the session API (create, 3 recorded steps, finish)."""

    async def one(http: httpx.AsyncClient, n: int) -> None:
        sid = f"api-{tag}-{n}"
        user = {"role": "user", "content": question(n)}
        asked = {
            "text": "",
            "tool_calls": [
                {"id": f"call_{n}", "name": "order_status", "arguments": json.dumps({"order_id": n})}
            ],
            "model": "fake-1",
            "usage": {"prompt_tokens": 12, "completion_tokens": 7},
        }
        writes = [
            (
                "/v1/sessions",
                {"user_query": question(n), "session_id": sid, "metadata": {"free_form_tools": True}},
            ),
            (f"/v1/sessions/{sid}/steps", {"kind": "llm", "payload": {"messages": [user], "reply": asked}}),
            (
                f"/v1/sessions/{sid}/steps",
                {
                    "kind": "tool",
                    "payload": {
                        "tool": "order_status",
                        "params": {"order_id": n},
                        "call_id": f"call_{n}",
                        "result": {"output": {"status": "packed"}},
                    },
                },
            ),
            (
                f"/v1/sessions/{sid}/steps",
                {
                    "kind": "llm",
                    "payload": {
                        "messages": [user],
                        "reply": {"text": f"Order {n} is packed.", "model": "fake-1"},
                    },
                },
            ),
            (f"/v1/sessions/{sid}/finish", {"text": f"Order {n} is packed."}),
        ]
        for path, body in writes:
            answer = await http.post(
                path, content=orjson.dumps(body), headers={**AUTH, "Content-Type": "application/json"}
            )
            assert answer.status_code in (200, 201), answer.text

    async def client(mine: range, http: httpx.AsyncClient) -> None:
        for n in mine:
            await one(http, n)

    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(range(i, sessions, clients), http) for i in range(clients)))
        return time.perf_counter() - start


def check(db: Path, tag: str, sessions: int, rounds_done: int) -> None:
    """Both sides stored every session and finished it."""
    from sessionrl.store import SessionStore

    with SessionStore.open(f"sqlite:///{db}") as store:
        rows = store.sql("SELECT session_id, state FROM session_head")
    finished = [r for r in rows if r["state"] == "finished"]
    otlp = [r for r in finished if r["session_id"].startswith("otel-")]
    api = [r for r in finished if r["session_id"].startswith(f"api-{tag}")]
    assert len(api) == sessions, f"API: {len(api)} of {sessions} finished"
    assert len(otlp) == sessions * rounds_done, f"OTLP: {len(otlp)} of {sessions * rounds_done} finished"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=400, help="Sessions per side per round.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds of both sides.")
    parser.add_argument("--batch", type=int, default=512, help="Spans per OTLP request.")
    parser.add_argument("--clients", type=int, default=4, help="Concurrent clients per side.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        db = Path(where) / "bench.db"
        url, proc = start_server(db)
        try:
            otlp_s = api_s = 0.0
            for r in range(args.rounds):
                tag = f"r{r}"
                o = asyncio.run(otlp_side(url, tag, args.sessions, args.batch, args.clients))
                a = asyncio.run(api_side(url, tag, args.sessions, args.clients))
                check(db, tag, args.sessions, r + 1)
                otlp_s, api_s = otlp_s + o, api_s + a
                print(
                    f"round {r}: OTLP {args.sessions * SPANS_PER_SESSION / o:,.0f} spans/s, "
                    f"API {args.sessions * API_WRITES_PER_SESSION / a:,.0f} writes/s",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    total = args.sessions * args.rounds
    spans, steps = total * SPANS_PER_SESSION / otlp_s, total * API_WRITES_PER_SESSION / api_s
    print(
        json.dumps(
            {
                "otlp_spans_per_s": round(spans, 1),
                "api_steps_per_s": round(steps, 1),
                "ratio": round(spans / steps, 3),
                "otlp_sessions_per_s": round(total / otlp_s, 1),
                "api_sessions_per_s": round(total / api_s, 1),
                "sessions_ratio": round(api_s / otlp_s, 3),
                "sessions": total,
                "batch": args.batch,
                "clients": args.clients,
            }
        )
    )


if __name__ == "__main__":
    main()
