"""Benchmark of the OpenAI-compatible gateway against the same chat backend called directly.

Two servers run side by side on loopback, each in its own process, both answering chat completions with
the same fast scripted backend (a fixed text answer): `sessionrl`'s gateway, which also records every
request as a step of its session in a durable SQLite store, and a bare endpoint that only calls the
backend. The same load (concurrent keep-alive connections, each agent sending `--turns` requests to one
session before opening the next) goes to each in alternating rounds, so drift in the machine's speed
reaches both alike. Printed: requests/s and latency percentiles of each; the last line is one JSON object
with `gateway_rps`, `direct_rps`, `overhead_ms_p50` (the gateway's median latency minus the direct one's)
and `ratio` (gateway_rps / direct_rps).

On a machine other work shares, requests per second swing with that work; the CPU time each server
process spends per request (user and system, all its threads, from /proc) swings far less, so the JSON
also gives `gateway_cpu_ms`, `direct_cpu_ms` and `cpu_ratio` (direct_cpu_ms / gateway_cpu_ms: the ratio
the two would reach where both are CPU-bound on a machine of their own).

`--baseline-src DIR` adds a third server in the same rounds: the gateway as another source tree builds it
(such as a `git worktree` of an earlier commit, its `src` folder), so a change is measured against the
code before it under the same load; the JSON then adds `baseline_rps`, `baseline_ratio`,
`baseline_cpu_ms` and `baseline_cpu_ratio`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response

TOKEN = "bench-token"
HOST = "127.0.0.1"


def build_app(kind: str, db: str) -> Any:
    """The server of `kind`: the gateway over a store at `db`, or the bare endpoint."""
    from sessionrl.gateway import ChatReply, ChatRequest, ScriptedChat
    from sessionrl.gateway.chat import completion
    from sessionrl.service import ServiceConfig, create_app, parse_tokens

    backend = ScriptedChat(
        lambda request: ChatReply(text="ok", usage={"prompt_tokens": 8, "completion_tokens": 1})
    )
    if kind == "gateway":
        # a chat that goes on after each text answer, so its sessions must not end on one (a baseline
        # tree from before the gateway's settings has no such field)
        multi_turn = (
            {"gateway": {"finish_on_answer": False}} if "gateway" in ServiceConfig.model_fields else {}
        )
        config = ServiceConfig(
            db_url=f"sqlite:///{db}",
            tokens=parse_tokens(f"{TOKEN}:read,write"),
            rate_per_s=1e9,
            **multi_turn,
        )
        return create_app(config, skills=[], chat=backend)
    app = FastAPI()

    @app.post("/gateway/sessions/{session_id}/v1/chat/completions")
    async def direct(session_id: str, request: Request) -> Response:
        body = ChatRequest.model_validate_json(await request.body())
        reply = await backend.complete(body, session_id)
        answer = completion("chatcmpl-direct", reply.model, reply.text, reply.tool_calls, reply.usage)
        return Response(json.dumps(answer), media_type="application/json")

    return app


def serve(kind: str, port: int, db: str) -> None:
    import uvicorn

    # a long keep-alive: on a busy machine an agent's next request may come seconds after its last, and
    # a connection closed meanwhile fails the request that raced the close
    uvicorn.run(
        build_app(kind, db),
        host=HOST,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=120,
    )


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far, all threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start(kind: str, db: str, src: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """A server of `kind` in its own process, importing sessionrl from `src` when given."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": src} if src else None
    command = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--db", db]
    process = subprocess.Popen(command, env=env)
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return process, url
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the {kind} server did not start")


async def load(
    url: str, *, requests: int, concurrency: int, turns: int, tag: str
) -> tuple[float, list[float]]:
    """Send `requests` chat completions from `concurrency` agents; return requests/s and latencies (ms)."""
    latencies: list[float] = []
    per_agent = requests // concurrency
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:

        async def agent(a: int) -> None:
            messages: list[dict[str, Any]] = []
            for i in range(per_agent):
                if i % turns == 0:
                    messages = [{"role": "user", "content": f"question {a}.{i}"}]
                path = f"/gateway/sessions/{tag}-{a}-{i // turns}/v1/chat/completions"
                started = time.perf_counter()
                response = await client.post(path, json={"model": "m", "messages": messages})
                latencies.append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
                messages = [
                    *messages,
                    response.json()["choices"][0]["message"],
                    {"role": "user", "content": "and?"},
                ]

        began = time.perf_counter()
        await asyncio.gather(*(agent(a) for a in range(concurrency)))
        return len(latencies) / (time.perf_counter() - began), latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="Requests per round and server.")
    parser.add_argument("--concurrency", type=int, default=32, help="Agents sending at once.")
    parser.add_argument("--turns", type=int, default=8, help="Requests per session.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds per server.")
    parser.add_argument("--baseline-src", help="Also serve the gateway of this source tree (a src folder).")
    parser.add_argument("--serve", choices=["gateway", "direct"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.db)
        return
    with tempfile.TemporaryDirectory() as tmp:
        servers = {kind: start(kind, str(Path(tmp) / f"{kind}.db")) for kind in ("gateway", "direct")}
        if args.baseline_src:
            servers["baseline"] = start("gateway", str(Path(tmp) / "baseline.db"), args.baseline_src)
        rps: dict[str, list[float]] = {kind: [] for kind in servers}
        latency: dict[str, list[float]] = {kind: [] for kind in servers}
        cpu: dict[str, float] = dict.fromkeys(servers, 0.0)
        try:
            for r in range(args.rounds):
                for kind, (process, url) in servers.items():
                    before = cpu_seconds(process.pid)
                    got, lat = asyncio.run(
                        load(
                            url,
                            requests=args.requests,
                            concurrency=args.concurrency,
                            turns=args.turns,
                            tag=f"r{r}",
                        )
                    )
                    cpu[kind] += cpu_seconds(process.pid) - before
                    rps[kind].append(got)
                    latency[kind] += lat
                    print(
                        f"round {r} {kind:8s} {got:8.0f} req/s  p50 {statistics.median(lat):6.2f} ms",
                        flush=True,
                    )
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(timeout=30)
    p50 = {k: statistics.median(v) for k, v in latency.items()}
    result = {
        "gateway_rps": round(statistics.median(rps["gateway"]), 1),
        "direct_rps": round(statistics.median(rps["direct"]), 1),
        "overhead_ms_p50": round(p50["gateway"] - p50["direct"], 3),
    }
    result["ratio"] = round(result["gateway_rps"] / result["direct_rps"], 3)
    cpu_ms = {kind: 1000 * seconds / len(latency[kind]) for kind, seconds in cpu.items()}
    result["gateway_cpu_ms"] = round(cpu_ms["gateway"], 3)
    result["direct_cpu_ms"] = round(cpu_ms["direct"], 3)
    result["cpu_ratio"] = round(cpu_ms["direct"] / cpu_ms["gateway"], 3)
    if "baseline" in rps:
        result["baseline_rps"] = round(statistics.median(rps["baseline"]), 1)
        result["baseline_ratio"] = round(result["baseline_rps"] / result["direct_rps"], 3)
        result["baseline_cpu_ms"] = round(cpu_ms["baseline"], 3)
        result["baseline_cpu_ratio"] = round(cpu_ms["direct"] / cpu_ms["baseline"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
