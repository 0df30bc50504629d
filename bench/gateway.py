"""Benchmark of the OpenAI-compatible gateway: its ceiling against a zero-latency backend, its time to
first token when streaming, and its share of a realistic upstream's latency.

1. Ceiling: two servers run side by side on loopback, each in its own process, both answering chat
   completions with the same fast scripted backend (a fixed text answer, no latency): `sessionrl`'s
   gateway, which also records every request as a step of its session in a durable SQLite store, and a
   bare endpoint that only calls the backend. The same load (concurrent keep-alive connections, each
   agent sending `--turns` requests to one session before opening the next) goes to each in alternating
   rounds, so drift in the machine's speed reaches both alike. JSON: `gateway_rps`, `direct_rps`,
   `overhead_ms_p50` (the gateway's median latency minus the direct one's) and `ratio` (gateway_rps /
   direct_rps). Against a backend that takes no time the durable record is all there is to measure, so
   the ratio is a ceiling, not an aim: a record per request cannot be free.
2. Against an upstream: a fake OpenAI-compatible server in its own process (`fake_upstream`), called
   through the gateway (`--upstream` mode, recording each call) and directly, in alternating rounds.
   `ttft_ms`: streaming, the median time from the upstream sending its first chunk to the client reading
   it through the gateway (the chunk carries its send time on the machine's monotonic clock);
   `ttft_direct_ms` is the same straight from the upstream. `overhead_pct_200ms`: on an upstream that
   answers after 200 ms, the gateway's median latency minus the direct one, as a share of the direct one.
   Each request's record is one durable commit after the answer (a session's opening and the tool results
   a request brings are committed while the upstream answers), so that share has a floor the disk sets:
   `disk_sync_ms`, the median time of one `fdatasync` where the store is, is printed beside it, with
   `gateway_cpu_ms_200ms`, the gateway process's CPU time per request in those rounds.

On a machine other work shares, requests per second swing with that work; the CPU time each server
process spends per request (user and system, all its threads, from /proc) swings far less, so the JSON
also gives `gateway_cpu_ms`, `direct_cpu_ms` and `cpu_ratio` (direct_cpu_ms / gateway_cpu_ms: the ratio
the two would reach where both are CPU-bound on a machine of their own), and the load average.

`--baseline-src DIR` adds a third server in the ceiling's rounds: the gateway as another source tree
builds it (such as a `git worktree` of an earlier commit, its `src` folder), so a change is measured
against the code before it under the same load; the JSON then adds `baseline_rps`, `baseline_ratio`,
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


def build_app(kind: str, db: str, upstream: int | None = None) -> Any:
    """The server of `kind`: the gateway over a store at `db` answering from a scripted backend
    (`gateway`) or from the fake upstream on port `upstream` (`proxy`), the bare endpoint (`direct`), or
    the fake upstream itself (`upstream`)."""
    if kind == "upstream":
        return fake_upstream()
    from sessionrl.gateway import ChatReply, ChatRequest, ScriptedChat
    from sessionrl.gateway.chat import completion
    from sessionrl.service import ServiceConfig, create_app, parse_tokens

    backend = ScriptedChat(
        lambda request: ChatReply(text="ok", usage={"prompt_tokens": 8, "completion_tokens": 1})
    )
    if kind in ("gateway", "proxy"):
        # a chat that goes on after each text answer, so its sessions must not end on one (a baseline
        # tree from before the gateway's settings has no such field)
        multi_turn = (
            {"gateway": {"finish_on_answer": False}} if "gateway" in ServiceConfig.model_fields else {}
        )
        proxied = {"upstream_url": f"http://{HOST}:{upstream}/v1"} if kind == "proxy" else {}
        config = ServiceConfig(
            db_url=f"sqlite:///{db}",
            tokens=parse_tokens(f"{TOKEN}:read,write"),
            rate_per_s=1e9,
            **multi_turn,
            **proxied,
        )
        return create_app(config, skills=[], chat=backend if kind == "gateway" else None)
    app = FastAPI()

    @app.post("/gateway/sessions/{session_id}/v1/chat/completions")
    async def direct(session_id: str, request: Request) -> Response:
        body = ChatRequest.model_validate_json(await request.body())
        reply = await backend.complete(body, session_id)
        made = int(time.time())
        answer = completion("chatcmpl-direct", reply.model, reply.text, reply.tool_calls, reply.usage, made)
        return Response(json.dumps(answer), media_type="application/json")

    return app


UPSTREAM_CHUNKS = 5
"""Content chunks of the fake upstream's streamed answer, CHUNK_GAP_S apart."""
CHUNK_GAP_S = 0.01
SLOW_MODEL = "sleep-200"
"""The model name that makes the fake upstream answer after 200 ms."""


def fake_upstream() -> Any:
    """An OpenAI-compatible chat server that answers "ok". Model `sleep-200` answers after 200 ms; a
    streamed answer sends its first chunk at once, stamped with the `time.monotonic()` it was sent at
    (`sent_at`, a clock every process on the machine shares), then UPSTREAM_CHUNKS chunks CHUNK_GAP_S
    apart, and the usage when asked for it. It answers the gateway's paths too, so the same client can
    call it directly."""
    from fastapi.responses import StreamingResponse

    app = FastAPI()
    usage = {"prompt_tokens": 8, "completion_tokens": UPSTREAM_CHUNKS, "total_tokens": 8 + UPSTREAM_CHUNKS}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {"id": "up", "object": "chat.completion.chunk", "created": 0, "model": "up",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    async def stream(include_usage: bool) -> Any:
        first = {"id": "up", "object": "chat.completion.chunk", "created": 0, "model": "up",
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "finish_reason": None}], "sent_at": time.monotonic()}  # fmt: skip
        yield b"data: " + json.dumps(first).encode() + b"\n\n"
        for _ in range(UPSTREAM_CHUNKS):
            await asyncio.sleep(CHUNK_GAP_S)
            yield chunk({"content": "ok "})
        yield chunk({}, "stop")
        if include_usage:
            yield b"data: " + json.dumps({"id": "up", "choices": [], "usage": usage}).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    @app.post("/v1/chat/completions")
    @app.post("/gateway/sessions/{session_id}/v1/chat/completions")
    async def answer(request: Request) -> Any:
        body = await request.json()
        if body.get("stream"):
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(stream(include), media_type="text/event-stream")
        if body.get("model") == SLOW_MODEL:
            await asyncio.sleep(0.2)
        message = {"role": "assistant", "content": "ok"}
        return {"id": "up", "object": "chat.completion", "created": 0, "model": "up", "usage": usage,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip

    return app


def serve(kind: str, port: int, db: str, upstream: int | None = None) -> None:
    import uvicorn

    # a long keep-alive: on a busy machine an agent's next request may come seconds after its last, and
    # a connection closed meanwhile fails the request that raced the close
    uvicorn.run(
        build_app(kind, db, upstream),
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


def start(
    kind: str, db: str, src: str | None = None, upstream: int | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """A server of `kind` in its own process, importing sessionrl from `src` when given."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": src} if src else None
    command = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--db", db]
    command += ["--upstream-port", str(upstream)] if upstream is not None else []
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
    url: str, *, requests: int, concurrency: int, turns: int, tag: str, model: str = "m"
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
                response = await client.post(path, json={"model": model, "messages": messages})
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


async def stream_load(url: str, *, requests: int, concurrency: int, tag: str) -> list[float]:
    """Send `requests` streamed chat completions from `concurrency` agents, each on a session of its own;
    for each, the ms from the fake upstream sending its first chunk (`sent_at`) to the client reading
    it."""
    relays: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as client:

        async def agent(a: int) -> None:
            for i in range(requests // concurrency):
                path = f"/gateway/sessions/{tag}-{a}-{i}/v1/chat/completions"
                body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "q"}]}
                async with client.stream("POST", path, json=body) as response:
                    response.raise_for_status()
                    first: float | None = None
                    async for line in response.aiter_lines():  # read to the end, as an agent does
                        if first is None and line.startswith("data:"):
                            first = 1000 * (time.monotonic() - json.loads(line[5:])["sent_at"])
                    if first is None:
                        raise RuntimeError(f"{path}: the stream carried no chunk")
                    relays.append(first)

        await asyncio.gather(*(agent(a) for a in range(concurrency)))
    return relays


def upstream_rounds(tmp: Path, args: argparse.Namespace) -> dict[str, float]:
    """The gateway in front of the fake upstream against the upstream called directly, in alternating
    rounds: `ttft_ms`, the median ms from the upstream's first chunk to the client's, streaming (through
    the gateway; `ttft_direct_ms` the same straight from the upstream), and `overhead_pct_200ms`, the
    gateway's added median latency as a share of the direct median on a 200 ms upstream."""
    upstream, up_url = start("upstream", str(tmp / "unused.db"))
    port = int(up_url.rsplit(":", 1)[1])
    proxy, proxy_url = start("proxy", str(tmp / "proxy.db"), upstream=port)
    urls = {"gateway": proxy_url, "direct": up_url}
    relay: dict[str, list[float]] = {kind: [] for kind in urls}
    slow: dict[str, list[float]] = {kind: [] for kind in urls}
    slow_cpu_s = 0.0
    try:
        for r in range(args.rounds):
            for kind, url in urls.items():
                relay[kind] += asyncio.run(
                    stream_load(
                        url, requests=args.stream_requests, concurrency=args.stream_agents, tag=f"s{r}"
                    )
                )
                before = cpu_seconds(proxy.pid)
                _, lat = asyncio.run(
                    load(
                        url,
                        requests=args.slow_requests,
                        concurrency=args.slow_agents,
                        turns=args.turns,
                        tag=f"w{r}",
                        model=SLOW_MODEL,
                    )
                )
                slow[kind] += lat
                slow_cpu_s += cpu_seconds(proxy.pid) - before  # nothing when the upstream is called directly
                print(f"round {r} {kind:8s} first chunk +{statistics.median(relay[kind]):.2f} ms,"
                      f" on a 200 ms upstream p50 {statistics.median(lat):.1f} ms", flush=True)  # fmt: skip
    finally:
        for process in (proxy, upstream):
            process.terminate()
            process.wait(timeout=30)
    p50 = {kind: statistics.median(lat) for kind, lat in slow.items()}
    return {
        "ttft_ms": round(statistics.median(relay["gateway"]), 3),
        "ttft_agents": args.stream_agents,
        "ttft_ms_p99": round(sorted(relay["gateway"])[int(0.99 * (len(relay["gateway"]) - 1))], 3),
        "ttft_direct_ms": round(statistics.median(relay["direct"]), 3),
        "latency_ms_200ms": round(p50["gateway"], 2),
        "latency_direct_ms_200ms": round(p50["direct"], 2),
        "overhead_agents": args.slow_agents,
        "overhead_pct_200ms": round(100 * (p50["gateway"] - p50["direct"]) / p50["direct"], 3),
        "gateway_cpu_ms_200ms": round(1000 * slow_cpu_s / len(slow["gateway"]), 3),
        "disk_sync_ms": round(disk_sync_ms(tmp), 3),
    }


def disk_sync_ms(folder: Path, syncs: int = 50) -> float:
    """The median time of a 4 KiB write made durable (`fdatasync`) in `folder`, where the gateway's store
    is: each request's record waits for one such sync (shared with the requests committed with it), so
    on a 200 ms upstream it alone is `disk_sync_ms / 2` percent of overhead."""
    path = folder / "sync-probe"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    times = []
    try:
        for i in range(syncs):
            os.pwrite(fd, b"x" * 4096, i * 4096)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000, help="Requests per round and server.")
    parser.add_argument("--concurrency", type=int, default=32, help="Agents sending at once.")
    parser.add_argument("--turns", type=int, default=8, help="Requests per session.")
    parser.add_argument("--rounds", type=int, default=3, help="Alternating rounds per server.")
    parser.add_argument(
        "--stream-requests", type=int, default=400, help="Streamed requests per round and path (ttft_ms)."
    )
    parser.add_argument("--stream-agents", type=int, default=4, help="Agents streaming at once (ttft_ms).")
    parser.add_argument("--slow-agents", type=int, default=8, help="Agents at once on the 200 ms upstream.")
    parser.add_argument(
        "--slow-requests", type=int, default=320, help="Requests per round and path on the 200 ms upstream."
    )
    parser.add_argument("--baseline-src", help="Also serve the gateway of this source tree (a src folder).")
    parser.add_argument("--serve", choices=["gateway", "direct", "proxy", "upstream"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    parser.add_argument("--upstream-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.db, args.upstream_port)
        return
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = ratio_rounds(Path(tmp), args)
        result |= upstream_rounds(Path(tmp), args)
    print(json.dumps(result | {"load_average": round(os.getloadavg()[0], 2)}))


def ratio_rounds(tmp: Path, args: argparse.Namespace) -> dict[str, float]:
    """The gateway against the bare endpoint on the zero-latency scripted backend, in alternating rounds:
    throughput, latency and CPU per request (see the module doc)."""
    servers = {kind: start(kind, str(tmp / f"{kind}.db")) for kind in ("gateway", "direct")}
    if args.baseline_src:
        servers["baseline"] = start("gateway", str(tmp / "baseline.db"), args.baseline_src)
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
    return result


if __name__ == "__main__":
    main()
