"""The shortcut to the busiest routes: which requests it serves, and that it answers as the routes do."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from service_support import AUTH, READER, make_app, serving
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.service.shortcut import Shortcut

STEP = {"kind": "tool", "payload": {"tool": "find", "params": {"q": 1}}}
FRAMEWORK = {"Content-Type": "application/json; charset=utf-8"}
"""A content type the route accepts but the shortcut leaves to the framework."""


class Inner:
    """Stands for the framework: records the requests passed on, with the body it could read."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 599, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def call(app: FastAPI, shortcut: Shortcut, path: str, body: bytes, headers: dict[str, str]) -> int:
    """Send one POST through `shortcut` in two body chunks; return the status answered."""
    chunks = [body[:3], body[3:]]

    async def receive() -> Message:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": raw,
        "app": app,
    }
    await shortcut(scope, receive, send)
    return int(sent[0]["status"])


def json_headers(body: bytes, **extra: str) -> dict[str, str]:
    return {**AUTH, "Content-Type": "application/json", "Content-Length": str(len(body)), **extra}


async def test_well_formed_writes_are_served_without_the_framework() -> None:
    app = make_app()
    async with serving(app):
        inner = Inner()
        shortcut = Shortcut(inner)
        store = app.state.engine.store
        create = json.dumps({"user_query": "q", "session_id": "s1"}).encode()
        assert await call(app, shortcut, "/v1/sessions", create, json_headers(create)) == 201
        step = json.dumps(STEP).encode()
        assert await call(app, shortcut, "/v1/sessions/s1/steps", step, json_headers(step)) == 200
        finish = json.dumps({"text": "done"}).encode()
        assert await call(app, shortcut, "/v1/sessions/s1/finish", finish, json_headers(finish)) == 200
        assert inner.bodies == []
        # created, executing, the tool call, the output, finished
        assert [e.type for e in store.events("s1")] == [
            "session_created",
            "state_changed",
            "tool_call",
            "output_set",
            "state_changed",
        ]


@pytest.mark.parametrize(
    ("path", "body", "extra"),
    [
        ("/v1/sessions/S/steps", b"{not json", {}),
        ("/v1/sessions/S/steps", b"[" * 100_000, {}),
        ("/v1/sessions/S/steps", json.dumps({"kind": "dance"}).encode(), {}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"Authorization": f"Bearer {READER}"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"Authorization": "Bearer nobody"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"Idempotency-Key": "a b"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"If-Match": "seven"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), FRAMEWORK),
        ("/v1/sessions/S/finish", json.dumps({"text": 3}).encode(), {}),
        ("/v1/sessions", json.dumps({"user_query": "q"}).encode(), FRAMEWORK),
        ("/v1/sessions/S/feedback", json.dumps({"type": "human_rating", "score": 5}).encode(), {}),
        ("/v1/sessions/S/steps/", json.dumps(STEP).encode(), {}),
        ("/v1/sessions/S/steps", b'{"kind": "tool", "payload": {"tool": "find", "params": {"q": NaN}}}', {}),
        ("/v1/sessions/S/steps", b"\xef\xbb\xbf" + json.dumps(STEP).encode(), {}),
    ],
)
async def test_anything_else_goes_to_the_framework_with_its_body(
    path: str, body: bytes, extra: dict[str, str]
) -> None:
    app = make_app()
    async with serving(app):
        inner = Inner()
        status = await call(app, Shortcut(inner), path, body, json_headers(body, **extra))
        assert (status, inner.bodies) == (599, [body])


async def test_integers_past_64_bits_are_read_exactly() -> None:
    app = make_app()
    async with serving(app):
        inner = Inner()
        shortcut = Shortcut(inner)
        create = json.dumps({"user_query": "q", "session_id": "s1"}).encode()
        assert await call(app, shortcut, "/v1/sessions", create, json_headers(create)) == 201
        big = 2**70 + 1  # a float would round it to 2**70
        step = json.dumps({"kind": "tool", "payload": {"tool": "find", "params": {"q": big}}}).encode()
        assert await call(app, shortcut, "/v1/sessions/s1/steps", step, json_headers(step)) == 200
        assert inner.bodies == []
        (call_record,) = app.state.engine.store.get("s1").tool_calls
        assert call_record.params == {"q": big}
        assert type(call_record.params["q"]) is int


def comparable(response: httpx.Response, *differing: str) -> tuple[int, dict[str, Any]]:
    """Status and body, without the fields named (ids and times that differ between two sessions)."""
    body = dict(response.json())
    for name in differing:
        body.pop(name, None)
    if "detail" in body:
        body["detail"] = body["detail"].replace(response.request.url.path.split("/")[3], "SID")
    return response.status_code, body


async def test_the_shortcut_answers_as_the_framework_routes_do() -> None:
    async with serving(make_app()) as client:
        created = []
        for headers in ({}, FRAMEWORK):
            response = await client.post(
                "/v1/sessions", json={"user_query": "q", "tags": ["a"]}, headers=headers
            )
            created.append(response)
        assert comparable(created[0], "session_id", "trace_id", "created_at", "updated_at") == comparable(
            created[1], "session_id", "trace_id", "created_at", "updated_at"
        )
        assert created[0].headers["location"] == f"/v1/sessions/{created[0].json()['session_id']}"
        assert created[0].headers["etag"] == created[1].headers["etag"] == '"1"'
        sids = [r.json()["session_id"] for r in created]
        cases: list[tuple[str, dict[str, Any], dict[str, str]]] = [
            ("steps", STEP, {}),
            ("steps", {"kind": "tool", "payload": {"tool": "missing"}}, {}),
            ("steps", STEP, {"If-Match": '"1"'}),
            ("finish", {"text": "done"}, {"If-Match": '"1"'}),
            ("finish", {"text": "done"}, {}),
            ("finish", {"text": "again"}, {}),
            ("steps", STEP, {}),
        ]
        for route, body, headers in cases:
            direct, framework = [
                await client.post(f"/v1/sessions/{sid}/{route}", json=body, headers={**headers, **extra})
                for sid, extra in zip(sids, ({}, FRAMEWORK), strict=True)
            ]
            differing = ("session_id", "instance", "call_id", "latency_ms")
            assert comparable(direct, *differing) == comparable(framework, *differing), (route, body, headers)
            assert direct.headers["content-type"] == framework.headers["content-type"]
        unknown = [
            await client.post("/v1/sessions/nobody/steps", json=STEP, headers=extra)
            for extra in ({}, FRAMEWORK)
        ]
        assert comparable(unknown[0]) == comparable(unknown[1])
        assert unknown[0].status_code == 404


async def test_a_key_is_the_same_request_on_either_path() -> None:
    app = make_app()
    async with serving(app) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        path, key = f"/v1/sessions/{sid}/steps", {"Idempotency-Key": "step-1"}
        first = await client.post(path, json=STEP, headers=key)
        events = len(app.state.engine.store.events(sid))
        again = await client.post(path, json=STEP, headers={**key, **FRAMEWORK})
        assert again.json() == first.json()
        assert len(app.state.engine.store.events(sid)) == events


async def test_steps_count_in_the_metrics_under_the_route_template() -> None:
    async with serving(make_app()) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        for _ in range(3):
            assert (await client.post(f"/v1/sessions/{sid}/steps", json=STEP)).status_code == 200
        text = (await client.get("/metrics")).text
        route = 'route="/v1/sessions/{session_id}/steps"'
        assert f'sessionrl_http_requests_total{{method="POST",{route},status="200"}} 3.0' in text
        assert 'sessionrl_steps_total{kind="tool",outcome="ok"} 3.0' in text


async def test_a_step_over_the_rate_is_429() -> None:
    # a bucket of 2 refilled at one request per 100 s: the create and one step pass, the next step waits
    async with serving(make_app(rate_per_s=0.01, rate_burst=2)) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        assert (await client.post(f"/v1/sessions/{sid}/steps", json=STEP)).status_code == 200
        limited = await client.post(f"/v1/sessions/{sid}/steps", json=STEP)
        assert limited.status_code == 429
        assert limited.json()["code"] == "rate_limited"
        assert 95 <= int(limited.headers["retry-after"]) <= 100


async def test_served_requests_pass_none_of_the_framework_s_middleware() -> None:
    app = make_app()
    seen: list[str] = []

    class Tap:
        """A user middleware that records the HTTP requests reaching it."""

        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])
            await self.app(scope, receive, send)

    app.add_middleware(Tap)
    async with serving(app) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        assert (await client.post(f"/v1/sessions/{sid}/steps", json=STEP)).status_code == 200
        framework = await client.post(f"/v1/sessions/{sid}/steps", json=STEP, headers=FRAMEWORK)
        assert framework.status_code == 200
        assert seen == [f"/v1/sessions/{sid}/steps"]


class Broken:
    """A policy backend that fails unexpectedly."""

    async def generate(self, messages: Any, *, purpose: str) -> PolicyReply:
        raise RuntimeError("secret internals")


async def test_an_unexpected_failure_is_answered_500_counted_and_raised_on() -> None:
    app = make_app(backends=[Broken()])
    async with serving(app, raise_errors=False) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        failed = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "llm"})
        assert failed.status_code == 500
        assert failed.headers["content-type"] == "application/problem+json"
        assert failed.json()["code"] == "internal"
        text = (await client.get("/metrics")).text
        route = 'route="/v1/sessions/{session_id}/steps"'
        assert f'sessionrl_http_requests_total{{method="POST",{route},status="500"}} 1.0' in text
    async with serving(make_app(backends=[Broken()])) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        with pytest.raises(RuntimeError, match="secret internals"):
            await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "llm"})
