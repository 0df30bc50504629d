"""Two `sessionrl serve` processes on one PostgreSQL store: any process serves any session.

Workers drive sessions (open, tool steps, finish) concurrently through both processes. Every session must
end with each of its steps recorded once, in order, and the store must agree with its log: whether each
session keeps to one process, or its consecutive requests alternate between them (each process then
builds on a cached view that the other has moved past, and must notice; see
`sessionrl.orchestrator.engine`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from serve_support import serve_process
from sessionrl.client import AsyncClient
from sessionrl.store import SessionStore

TOKEN = "pair-token"
SESSIONS = 8
STEPS = 4
SKILL = """
name: lookup
description: A lookup that takes a few milliseconds.
input_schema: {type: object}
output_schema: {type: object, properties: {ok: {type: boolean}}, required: [ok]}
simulation: {mean_ms: 4, std_ms: 2}
"""

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("store_backend", ["postgresql"])]


@contextmanager
def serve(db_url: str, skills: Path) -> Iterator[str]:
    """One `sessionrl serve` process on `db_url`; its base URL once it answers."""
    with serve_process(db_url, skills, TOKEN) as (url, _):
        yield url


async def drive(urls: list[str], seed: int, *, interleave: bool) -> str:
    """One session; its id. Its requests go to the processes in turn (`interleave`: each request to the
    other process than the one before, which holds a view one step behind), or every request to the
    process the seed picks."""
    turn = itertools.count(seed)
    clients = [AsyncClient(url, TOKEN) for url in urls]
    try:
        own = clients[seed % len(clients)]
        pick = (lambda: clients[next(turn) % len(clients)]) if interleave else (lambda: own)
        sid = (await pick().create_session("look things up", idempotency_key=f"s{seed}")).session_id
        for k in range(STEPS):
            result = await pick().step(sid, "tool", {"tool": "lookup"}, idempotency_key=f"s{seed}-t{k}")
            assert result.ok, result
        await pick().finish(sid, "done", idempotency_key=f"s{seed}-f")
        return sid
    finally:
        for client in clients:
            await client.aclose()


def run_pair(db_url: str, tmp_path: Path, *, interleave: bool) -> None:
    """Drive SESSIONS sessions through two serve processes, then check every one against the store."""
    skills = tmp_path / "skills"
    skills.mkdir()
    (skills / "lookup.yaml").write_text(SKILL)
    SessionStore.open(db_url).close()  # the tables exist before two processes open the store at once
    with ExitStack() as stack:
        urls = [stack.enter_context(serve(db_url, skills)) for _ in range(2)]

        async def everything() -> list[str]:
            runs = (drive(urls, seed, interleave=interleave) for seed in range(SESSIONS))
            return await asyncio.gather(*runs)

        sids = asyncio.run(everything())
    with SessionStore.open(db_url) as store:
        for sid in sids:
            session = store.get(sid)
            assert session.state.value == "finished"
            assert len(session.tool_calls) == STEPS
            log = store.events(sid)
            assert [e.seq for e in log] == list(range(1, len(log) + 1))
        assert store.consistency_check().clean


def test_two_serve_processes_share_one_store(db_url: str, tmp_path: Path) -> None:
    run_pair(db_url, tmp_path, interleave=False)


def test_consecutive_requests_of_a_session_may_go_to_different_processes(db_url: str, tmp_path: Path) -> None:
    run_pair(db_url, tmp_path, interleave=True)
