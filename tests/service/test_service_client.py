"""The typed client, async in process and sync against a live uvicorn on loopback."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from service_support import PLAN, WRITER, make_app

from sessionrl.client import ApiError, AsyncClient, Client
from sessionrl.session import Claim, FeedbackType, FinalOutput, SessionCreate
from sessionrl.wire import FeedbackIn, ToolPayload

SERVER_SIDE = (
    "fastapi",
    "starlette",
    "uvicorn",
    "torch",
    "sqlite3",
    "sessionrl.service",
    "sessionrl.store",
    "sessionrl.orchestrator",
    "sessionrl.skills",
)
"""Modules a client never needs: the web framework and server, the engine, the store, the skills, torch."""


def test_importing_the_client_loads_no_server_side_module() -> None:
    probe = (
        "import sys, sessionrl.client; "
        f"print(sorted(m for m in sys.modules if m.startswith({SERVER_SIDE!r})))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


class LosesFirstResponse(httpx.AsyncBaseTransport):
    """Delivers every request, but drops the answer of the first POST as if the connection broke."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.dropped = 0
        self.keys: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.method == "POST":
            self.keys.append(request.headers.get("Idempotency-Key"))
            if self.dropped == 0:
                self.dropped += 1
                await response.aread()
                raise httpx.ReadError("connection reset", request=request)
        return response


@pytest.fixture
async def served() -> AsyncIterator[tuple[AsyncClient, Any]]:
    app = make_app()
    async with app.router.lifespan_context(app):
        client = AsyncClient("http://service", WRITER, transport=httpx.ASGITransport(app=app))
        async with client:
            yield client, app


async def test_the_async_client_drives_a_whole_session(served: tuple[AsyncClient, Any]) -> None:
    client, _ = served
    session = await client.create_session(SessionCreate(user_query="refund", tags=("vip",)))
    plan = await client.step(session.session_id, "plan", {"plan": PLAN})
    assert plan.ok
    found = await client.step(session.session_id, "tool", ToolPayload(tool="find", subgoal_id="a"))
    assert found.output == {"order": "#1"}
    rated = await client.feedback(session.session_id, FeedbackIn(type=FeedbackType.HUMAN_RATING, score=5))
    assert rated.in_force
    output = FinalOutput(text="done", claims=(Claim(text="found", call_ids=(str(found.call_id),)),))
    finished = await client.finish(session.session_id, output)
    assert finished.unverified_subgoals == ("b",)
    read = await client.get_session(session.session_id)
    assert read.state == "finished"
    assert read.final_output == output
    page = await client.list_sessions(tag=["vip"], state="finished")
    assert [s.session_id for s in page.items] == [session.session_id]
    assert [s.name for s in await client.skills()] == ["find", "refund"]
    assert (await client.health()).status == "ok"


async def test_errors_carry_the_problem_document(served: tuple[AsyncClient, Any]) -> None:
    client, _ = served
    with pytest.raises(ApiError) as missing:
        await client.get_session("s_nope")
    assert missing.value.status == 404
    assert missing.value.problem is not None
    assert missing.value.problem.code == "not_found"
    sid = (await client.create_session("q")).session_id
    with pytest.raises(ApiError) as stale:
        await client.step(sid, "tool", {"tool": "find"}, if_match=9)
    assert stale.value.status == 412


async def test_a_lost_answer_is_retried_with_the_same_key_and_runs_once() -> None:
    app = make_app()
    async with app.router.lifespan_context(app):
        transport = LosesFirstResponse(httpx.ASGITransport(app=app))
        async with AsyncClient("http://service", WRITER, transport=transport) as client:
            session = await client.create_session("q")  # its first answer is lost, then replayed
            result = await client.step(session.session_id, "tool", {"tool": "find"})
        assert result.ok
        assert transport.keys[0] == transport.keys[1]  # the retry reused the generated key
        assert app.state.engine.store.session_ids() == [session.session_id]
        assert len(app.state.engine.store.get(session.session_id).tool_calls) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def live_url() -> Iterator[str]:
    """A uvicorn server on loopback in a thread, over a fresh in-memory store."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_the_sync_client_against_a_live_server(live_url: str) -> None:
    with Client(live_url, WRITER) as client:
        sid = client.create_session("refund", idempotency_key="open-1").session_id
        assert client.create_session("refund", idempotency_key="open-1").session_id == sid
        step = client.step(sid, "tool", {"tool": "refund"}, idempotency_key="s-1")
        assert client.step(sid, "tool", {"tool": "refund"}, idempotency_key="s-1") == step
        assert client.finish(sid, "done").state == "finished"
        with pytest.raises(ApiError) as again:
            client.finish(sid, "done")
        assert again.value.status == 409
        assert len(client.get_session(sid).tool_calls) == 1
    with Client(live_url, "wrong") as anonymous, pytest.raises(ApiError) as denied:
        anonymous.skills()
    assert denied.value.status == 401


def test_a_failure_that_lasts_is_raised_after_the_last_retry() -> None:
    seen: list[httpx.Request] = []

    def unavailable(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(503, text="down for maintenance")

    with (
        Client("http://service", WRITER, retries=2, transport=httpx.MockTransport(unavailable)) as client,
        pytest.raises(ApiError) as raised,
    ):
        client.create_session("q")
    assert raised.value.status == 503
    assert raised.value.problem is None  # a plain-text answer has no problem document
    assert len(seen) == 3  # the first attempt and two retries
    assert len({r.headers["Idempotency-Key"] for r in seen}) == 1
    assert len({r.content for r in seen}) == 1


def test_a_transport_error_that_lasts_is_raised_as_it_came() -> None:
    attempts = 0

    def refused(request: httpx.Request) -> httpx.Response:
        nonlocal attempts
        attempts += 1
        raise httpx.ConnectError("connection refused", request=request)

    with (
        Client("http://service", WRITER, retries=1, transport=httpx.MockTransport(refused)) as client,
        pytest.raises(httpx.ConnectError),
    ):
        client.create_session("q")
    assert attempts == 2
