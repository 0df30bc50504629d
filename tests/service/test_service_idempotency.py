"""Idempotency on every write route and on the gateway, on both store backends: the same key with the
same body replays the first answer and writes nothing; the same key with another body is a 422
`idempotency_key_reused` and writes nothing either."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from service_support import PLAN, TOKENS, serving, skills

from pg_support import local_postgres
from sessionrl.gateway import ChatReply, ScriptedChat
from sessionrl.service import ServiceConfig, create_app
from sessionrl.store.postgres_server import LocalPostgres

DATABASE = "service_tests"
_schemas = itertools.count(1)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[LocalPostgres]:
    with local_postgres(DATABASE) as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A URL of an empty store on each backend (on PostgreSQL, a schema of its own, dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sessions.db'}"
        return
    import psycopg

    server: LocalPostgres = request.getfixturevalue("pg_server")
    name = f"idem{next(_schemas)}"
    with psycopg.connect(server.url(DATABASE), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield server.url(DATABASE, f"-csearch_path={name},public")
    finally:
        with psycopg.connect(server.url(DATABASE), autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    chat = ScriptedChat(lambda request: ChatReply(text=f"seen {len(request.messages)}"))
    app = create_app(ServiceConfig(db_url=db_url, tokens=TOKENS), skills=skills(), chat=chat)
    async with serving(app) as connected:
        connected.app = app  # type: ignore[attr-defined]
        yield connected


def written(client: httpx.AsyncClient) -> list[tuple[str, int]]:
    """Every session and how many events it has."""
    store = client.app.state.engine.store  # type: ignore[attr-defined]
    return [(sid, len(store.events(sid))) for sid in sorted(store.session_ids())]


async def open_session(client: httpx.AsyncClient, sid: str = "s-1") -> str:
    response = await client.post("/v1/sessions", json={"user_query": "refund", "session_id": sid})
    assert response.status_code == 201, response.text
    return sid


def reused(response: httpx.Response) -> str:
    """The code of a refused reuse, in either of the service's error shapes."""
    assert response.status_code == 422, response.text
    body = response.json()
    return str(body["error"]["code"] if "error" in body else body["code"])


async def replay_then_refuse(
    client: httpx.AsyncClient, path: str, first: dict[str, Any], other: dict[str, Any]
) -> None:
    key = {"Idempotency-Key": "k-1"}
    answer = await client.post(path, json=first, headers=key)
    assert answer.status_code < 300, answer.text
    before = written(client)
    again = await client.post(path, json=first, headers=key)
    assert (again.status_code, again.json()) == (answer.status_code, answer.json())
    assert reused(await client.post(path, json=other, headers=key)) == "idempotency_key_reused"
    assert written(client) == before


async def test_create(client: httpx.AsyncClient) -> None:
    await replay_then_refuse(client, "/v1/sessions", {"user_query": "q"}, {"user_query": "another"})
    # a create naming its session: the retry finds it, another body under the key is refused
    named = {"user_query": "q", "session_id": "named-1"}
    key = {"Idempotency-Key": "k-2"}
    assert (await client.post("/v1/sessions", json=named, headers=key)).status_code == 201
    before = written(client)
    assert (await client.post("/v1/sessions", json=named, headers=key)).status_code == 201
    other = {**named, "user_query": "another"}
    assert reused(await client.post("/v1/sessions", json=other, headers=key)) == "idempotency_key_reused"
    assert written(client) == before


async def test_steps(client: httpx.AsyncClient) -> None:
    sid = await open_session(client)
    planned = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "plan", "payload": {"plan": PLAN}})
    assert planned.status_code == 200, planned.text
    first = {"kind": "tool", "payload": {"tool": "find", "subgoal_id": "a", "params": {"id": 1}}}
    other = {"kind": "tool", "payload": {"tool": "find", "subgoal_id": "a", "params": {"id": 2}}}
    await replay_then_refuse(client, f"/v1/sessions/{sid}/steps", first, other)


async def test_feedback(client: httpx.AsyncClient) -> None:
    sid = await open_session(client)
    first = {"type": "human_rating", "score": 4, "annotator": "doc_007"}
    await replay_then_refuse(client, f"/v1/sessions/{sid}/feedback", first, {**first, "score": 2})


async def test_finish(client: httpx.AsyncClient) -> None:
    sid = await open_session(client)
    await replay_then_refuse(client, f"/v1/sessions/{sid}/finish", {"text": "done"}, {"text": "other"})


async def test_gateway(client: httpx.AsyncClient) -> None:
    first = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    other = {"model": "m", "messages": [{"role": "user", "content": "bye"}]}
    await replay_then_refuse(client, "/gateway/sessions/g-1/v1/chat/completions", first, other)


async def test_a_gateway_retry_in_a_later_second_answers_with_the_first_answers_time(
    client: httpx.AsyncClient,
) -> None:
    path = "/gateway/sessions/g-2/v1/chat/completions"
    body, key = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, {"Idempotency-Key": "k-t"}
    answer = await client.post(path, json=body, headers=key)
    assert answer.status_code == 200, answer.text
    await asyncio.sleep(1.1)  # `created` counts whole seconds: the retry comes in a later one
    again = await client.post(path, json=body, headers=key)
    assert again.json() == answer.json()
    store = client.app.state.engine.store  # type: ignore[attr-defined]
    (call,) = store.get("g-2").llm_calls
    assert answer.json()["created"] == int(call.finished_at.timestamp())
