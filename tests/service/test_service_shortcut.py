"""The step route's shortcut: which requests it serves itself, and that its answers are the route's."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from service_support import AUTH, READER, make_app, serving
from starlette.types import Message, Receive, Scope, Send

from sessionrl.service.shortcut import StepShortcut

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


async def call(app: FastAPI, shortcut: StepShortcut, path: str, body: bytes, headers: dict[str, str]) -> int:
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


async def test_a_well_formed_step_is_served_without_the_framework() -> None:
    app = make_app()
    async with serving(app) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        inner = Inner()
        shortcut = StepShortcut(inner)
        body = json.dumps(STEP).encode()
        status = await call(app, shortcut, f"/v1/sessions/{sid}/steps", body, json_headers(body))
        assert (status, inner.bodies) == (200, [])
        assert len(app.state.engine.store.events(sid)) == 3  # created, executing, the tool call


@pytest.mark.parametrize(
    ("path", "body", "extra"),
    [
        ("/v1/sessions/S/steps", b"{not json", {}),
        ("/v1/sessions/S/steps", json.dumps({"kind": "dance"}).encode(), {}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"Authorization": f"Bearer {READER}"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"Authorization": "Bearer nobody"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"Idempotency-Key": "a b"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), {"If-Match": "seven"}),
        ("/v1/sessions/S/steps", json.dumps(STEP).encode(), FRAMEWORK),
        ("/v1/sessions/S/finish", json.dumps({"text": "done"}).encode(), {}),
    ],
)
async def test_anything_else_goes_to_the_framework_with_its_body(
    path: str, body: bytes, extra: dict[str, str]
) -> None:
    app = make_app()
    async with serving(app):
        inner = Inner()
        status = await call(app, StepShortcut(inner), path, body, json_headers(body, **extra))
        assert (status, inner.bodies) == (599, [body])


def comparable(response: httpx.Response) -> tuple[int, dict[str, Any]]:
    """Status and body, without what differs between any two steps (ids, versions)."""
    body = dict(response.json())
    for field in ("call_id", "state_version", "latency_ms"):
        body.pop(field, None)
    return response.status_code, body


async def test_the_shortcut_answers_as_the_framework_route_does() -> None:
    async with serving(make_app()) as client:
        sid = (await client.post("/v1/sessions", json={"user_query": "q"})).json()["session_id"]
        cases: list[tuple[str, dict[str, Any], dict[str, str]]] = [
            (sid, STEP, {}),
            (sid, {"kind": "tool", "payload": {"tool": "missing"}}, {}),
            (sid, STEP, {"If-Match": '"1"'}),
            ("nobody", STEP, {}),
        ]
        for target, body, headers in cases:
            path = f"/v1/sessions/{target}/steps"
            direct = await client.post(path, json=body, headers=headers)
            framework = await client.post(path, json=body, headers={**headers, **FRAMEWORK})
            assert comparable(direct) == comparable(framework), (target, body, headers)
            assert direct.headers["content-type"] == framework.headers["content-type"]


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
