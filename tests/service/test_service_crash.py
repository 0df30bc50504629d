"""Kill `sessionrl serve` mid-traffic: every acknowledged write survives, and sessions can carry on.

Twelve workers drive sessions (open, four tool steps, finish) through the client, each request with a
deterministic idempotency key. The server is SIGKILLed while requests are in flight, then restarted on the
same database file. Everything that got a 2xx answer must be there, with the same content; replaying every
worker's requests with the same keys must finish every session without running any step twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from serve_support import serve_process
from sessionrl.client import AsyncClient

TOKEN = "crash-token"
WORKERS = 12
STEPS = 4
SKILL = """
name: lookup
description: A lookup that takes a few milliseconds.
input_schema: {type: object}
output_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
simulation: {mean_ms: 8, std_ms: 4}
"""

pytestmark = pytest.mark.slow


@dataclass
class Acks:
    """What the server acknowledged (answered 2xx)."""

    sessions: dict[tuple[int, int], str] = field(default_factory=dict)
    steps: dict[tuple[str, int], tuple[str, str]] = field(default_factory=dict)
    finished: set[str] = field(default_factory=set)
    started: set[tuple[int, int]] = field(default_factory=set)


async def run_session(client: AsyncClient, worker: int, n: int, acks: Acks) -> None:
    """One session: open, STEPS tool steps, finish; every key derived from (worker, n)."""
    acks.started.add((worker, n))
    key = f"w{worker}-s{n}"
    sid = (await client.create_session("look things up", idempotency_key=key)).session_id
    acks.sessions[(worker, n)] = sid
    for k in range(STEPS):
        result = await client.step(sid, "tool", {"tool": "lookup"}, idempotency_key=f"{key}-t{k}")
        assert result.ok, result
        acks.steps[(sid, k)] = (str(result.call_id), str(result.status))
    await client.finish(sid, "done", idempotency_key=f"{key}-f")
    acks.finished.add(sid)


async def traffic(url: str, acks: Acks, stop_after: int) -> None:
    """Workers run sessions back to back until the server dies (or enough steps were acknowledged)."""

    async def worker(i: int) -> None:
        async with AsyncClient(url, TOKEN, retries=0, timeout=10) as client:
            n = 0
            while len(acks.steps) < stop_after:
                try:
                    await run_session(client, i, n, acks)
                except httpx.TransportError:
                    return
                n += 1

    await asyncio.gather(*(worker(i) for i in range(WORKERS)))


def test_acknowledged_writes_survive_a_sigkill_and_sessions_continue(tmp_path: Path) -> None:
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "lookup.yaml").write_text(SKILL)
    db = tmp_path / "sessions.db"
    acks = Acks()

    with serve_process(db, skills, TOKEN) as (url, proc):

        async def traffic_then_kill() -> None:
            task = asyncio.create_task(traffic(url, acks, stop_after=10**9))
            while len(acks.steps) < 60:  # well into the run, with requests of every kind in flight
                await asyncio.sleep(0.01)
            os.kill(proc.pid, signal.SIGKILL)
            await task

        asyncio.run(traffic_then_kill())
    assert len(acks.steps) >= 60

    with serve_process(db, skills, TOKEN) as (url, _):

        async def check_and_resume() -> None:
            async with AsyncClient(url, TOKEN) as client:
                for sid in acks.sessions.values():
                    session = await client.get_session(sid)
                    calls = {c.call_id: str(c.status) for c in session.tool_calls}
                    for (owner, _), (call_id, status) in acks.steps.items():
                        if owner == sid:
                            assert calls.get(call_id) == status
                    if sid in acks.finished:
                        assert session.state == "finished"
                # every session that was begun is replayed with the same keys, to its end
                resumed = Acks()
                await asyncio.gather(*(run_session(client, w, n, resumed) for w, n in sorted(acks.started)))
                for key, sid in acks.sessions.items():
                    assert resumed.sessions[key] == sid  # a replayed open names the same session
                for step, answer in acks.steps.items():
                    assert resumed.steps[step] == answer  # a replayed step answers as the first time
                for sid in resumed.sessions.values():
                    session = await client.get_session(sid)
                    assert session.state == "finished"
                    assert len(session.tool_calls) == STEPS  # nothing ran twice

        asyncio.run(check_and_resume())
