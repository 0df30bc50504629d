"""How fast the global strategy switch takes effect: the time from the API call that switches
`strategy_mode` to the first step served by the new mode.

A `sessionrl` service runs in its own process over a SQLite store, with a policy backend that takes
`--policy-ms` to answer (its replies start with `policy:`) and a plan template as the rule-based fallback
(its replies are plain JSON). `--workers` clients keep running sessions busy with tool steps that the
server's strategy decides. Every `--every-s` seconds the switch is flipped between `policy` and `rules`
(`PUT /v1/policies/strategy`); `switch_ms` is measured from just before that request is sent to the
arrival of the first step answer made by the new mode (steps already under way finish in the old one).
Printed: each switch's latency; the last line is one JSON object with `switch_ms` (the median),
`switch_ms_max`, `switches`, `steps` and `steps_per_s`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

TOKEN = "bench-token"
HOST = "127.0.0.1"
PLAN = {
    "root_goal": "refund the order",
    "subgoals": [
        {"id": "a", "description": "find the order", "tool": "find"},
        {"id": "b", "description": "refund it", "tool": "refund", "depends_on": ["a"]},
    ],
}
STEPS_PER_SESSION = 12


def build_app(db: str, policy_ms: float) -> Any:
    """The service: two simple skills, a slow scripted policy, a plan template for the `bench` scenario."""
    from sessionrl.ops.config import OpsConfig, TemplateStep
    from sessionrl.orchestrator.policy import PolicyReply
    from sessionrl.service import ServiceConfig, create_app, parse_tokens
    from sessionrl.session.model import Message
    from sessionrl.skills import SkillContract, callable_skill

    class SlowPolicy:
        async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
            await asyncio.sleep(policy_ms / 1000)
            return PolicyReply(
                text='policy: {"tool": "find", "params": {}, "subgoal_id": "a"}', policy_version=1
            )

    def skill(name: str) -> Any:
        contract = {"name": name, "description": name, "input_schema": {"type": "object"}}
        return callable_skill(SkillContract.model_validate(contract), lambda p: {"ok": True})

    ops = OpsConfig(plan_templates={"bench": (TemplateStep(tool="find"), TemplateStep(tool="refund"))})
    config = ServiceConfig(
        db_url=f"sqlite:///{db}", tokens=parse_tokens(f"{TOKEN}:read,write"), rate_per_s=1e9, ops=ops
    )
    return create_app(config, skills=[skill("find"), skill("refund")], backends=[SlowPolicy()])


def serve(port: int, db: str, policy_ms: float) -> None:
    import uvicorn

    uvicorn.run(build_app(db, policy_ms), host=HOST, port=port, log_level="warning", access_log=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start(db: str, policy_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [
        sys.executable,
        __file__,
        "--serve",
        "--port",
        str(port),
        "--db",
        db,
        "--policy-ms",
        str(policy_ms),
    ]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return process, f"http://{HOST}:{port}"
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("the server did not start")


class Watch:
    """The switch under way: when it was asked for, its mode, and when the first step of that mode came."""

    def __init__(self) -> None:
        self.mode = "policy"
        self.asked_at: float | None = None
        self.latencies: list[float] = []
        self.steps = 0

    def saw(self, mode: str) -> None:
        self.steps += 1
        if self.asked_at is not None and mode == self.mode:
            self.latencies.append((time.perf_counter() - self.asked_at) * 1000)
            self.asked_at = None


async def worker(client: httpx.AsyncClient, w: int, watch: Watch, stop: asyncio.Event) -> None:
    """Open sessions and run strategy-decided tool steps on them until `stop`."""
    n = 0
    while not stop.is_set():
        sid = f"w{w}-{n}"
        n += 1
        body = {"user_query": "refund my order", "session_id": sid, "scenario": "bench"}
        (await client.post("/v1/sessions", json=body)).raise_for_status()
        planned = await client.post(
            f"/v1/sessions/{sid}/steps", json={"kind": "plan", "payload": {"plan": PLAN}}
        )
        planned.raise_for_status()
        for _ in range(STEPS_PER_SESSION):
            if stop.is_set():
                return
            answer = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "tool", "payload": {}})
            answer.raise_for_status()
            text = answer.json().get("text") or ""
            watch.saw("policy" if text.startswith("policy:") else "rules")


async def drive(url: str, *, workers: int, switches: int, every_s: float) -> Watch:
    watch = Watch()
    stop = asyncio.Event()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        tasks = [asyncio.create_task(worker(client, w, watch, stop)) for w in range(workers)]
        await asyncio.sleep(every_s)
        for i in range(switches):
            mode = "rules" if i % 2 == 0 else "policy"
            watch.mode, watch.asked_at = mode, time.perf_counter()
            (
                await client.put("/v1/policies/strategy", json={"mode": mode, "reason": "bench"})
            ).raise_for_status()
            await asyncio.sleep(every_s)
            if watch.asked_at is not None:
                raise SystemExit(f"switch {i + 1} to {mode}: no step served by it within {every_s} s")
            print(f"switch {i + 1} to {mode}: {watch.latencies[-1]:.1f} ms")
        stop.set()
        await asyncio.gather(*tasks)
    return watch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8, help="Clients running sessions at once.")
    parser.add_argument("--switches", type=int, default=20, help="Switches to measure.")
    parser.add_argument("--every-s", type=float, default=1.0, help="Seconds between switches.")
    parser.add_argument("--policy-ms", type=float, default=20.0, help="How long the policy takes to answer.")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.db, args.policy_ms)
        return
    with tempfile.TemporaryDirectory() as tmp:
        process, url = start(str(Path(tmp) / "degrade.db"), args.policy_ms)
        try:
            began = time.perf_counter()
            watch = asyncio.run(
                drive(url, workers=args.workers, switches=args.switches, every_s=args.every_s)
            )
            elapsed = time.perf_counter() - began
        finally:
            process.terminate()
            process.wait(timeout=30)
    result = {
        "switch_ms": round(statistics.median(watch.latencies), 2),
        "switch_ms_max": round(max(watch.latencies), 2),
        "switches": len(watch.latencies),
        "steps": watch.steps,
        "steps_per_s": round(watch.steps / elapsed, 1),
        "policy_ms": args.policy_ms,
        "workers": args.workers,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
