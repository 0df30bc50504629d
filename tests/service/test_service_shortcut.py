"""The shortcut to the busiest routes: which requests it serves, and that it answers as the routes do."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Query, Response
from service_support import AUTH, PLAN, READER, make_app, serving
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.service.deps import Writer, json_response
from sessionrl.service.routers import ROUTERS
from sessionrl.service.shortcut import Shortcut
from sessionrl.wire import Health

STEP = {"kind": "tool", "payload": {"tool": "find", "params": {"q": 1}}}
FRAMEWORK = {"Content-Type": "application/json; charset=utf-8"}
"""A content type the route accepts but the shortcut leaves to the framework."""


def shortcut_over(inner: ASGIApp) -> Shortcut:
    """A shortcut over the service's routes, passing what it does not serve to `inner`."""
    return Shortcut(inner, [route for router in ROUTERS for route in router.routes])


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
        shortcut = shortcut_over(inner)
        store = app.state.engine.store
        create = json.dumps({"user_query": "q", "session_id": "s1"}).encode()
        assert await call(app, shortcut, "/v1/sessions", create, json_headers(create)) == 201
        step = json.dumps(STEP).encode()
        assert await call(app, shortcut, "/v1/sessions/s1/steps", step, json_headers(step)) == 200
        finish = json.dumps({"text": "done"}).encode()
        assert await call(app, shortcut, "/v1/sessions/s1/finish", finish, json_headers(finish)) == 200
        assert inner.bodies == []
        # created, executing, the tool call, the output, what finished it (finished_by), finished
        assert [e.type for e in store.events("s1")] == [
            "session_created",
            "state_changed",
            "tool_call",
            "output_set",
            "session_patched",
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
        ("/v1/sessions/S/feedback", json.dumps({"type": "human_rating", "score": 5}).encode(), FRAMEWORK),
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
        status = await call(app, shortcut_over(inner), path, body, json_headers(body, **extra))
        assert (status, inner.bodies) == (599, [body])


async def test_integers_past_64_bits_are_read_exactly() -> None:
    app = make_app()
    async with serving(app):
        inner = Inner()
        shortcut = shortcut_over(inner)
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


# the contract: every route the shortcut serves, and every way a request can fail, answered alike by the
# shortcut and by the framework alone

VOLATILE = frozenset(
    {"trace_id", "created_at", "updated_at", "started_at", "finished_at", "occurred_at", "received_at", "at"}
    | {"latency_ms", "call_id", "policy_call_id", "feedback_id"}
)
"""Fields that differ between two sessions given the same requests (times, and ids made per request)."""
BASE = "http://service"
COMPARED_HEADERS = ("content-type", "location", "etag", "www-authenticate", "retry-after", "allow")


def framework_only(app: FastAPI) -> ASGIApp:
    """The app with its shortcut stepped over: every request is routed, resolved and answered by the
    framework's own layers, over the same state."""
    if app.middleware_stack is None:
        app.middleware_stack = app.build_middleware_stack()
    stack = app.middleware_stack
    assert isinstance(stack, Shortcut)

    async def framework(scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = app
        await stack.app(scope, receive, send)

    return framework


def normalised(value: Any, sid: str) -> Any:
    """`value` without the volatile fields, with the session id written as SID."""
    if isinstance(value, dict):
        return {k: normalised(v, sid) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [normalised(v, sid) for v in value]
    return value.replace(sid, "SID") if isinstance(value, str) else value


def answer(response: httpx.Response, sid: str) -> tuple[int, dict[str, str], Any]:
    """What the contract compares: status, the headers a route or an error sets, and the body."""
    headers = {h: response.headers[h].replace(sid, "SID") for h in COMPARED_HEADERS if h in response.headers}
    try:
        body = normalised(response.json(), sid)
    except ValueError:
        body = response.text
    return response.status_code, headers, body


Sent = tuple[str, str, bytes | dict[str, Any], dict[str, str]]
"""A request of a script: the route ("create" opens the session, else the path after the session's),
a label, its body (bytes are sent as they are), and extra headers (SID stands for the session id)."""

SCRIPTS: dict[str, list[Sent]] = {
    "a session's life on every served route": [
        ("create", "open", {"user_query": "q", "tags": ["a"]}, {}),
        ("steps", "plan", {"kind": "plan", "payload": {"plan": PLAN}}, {"If-Match": '"1"'}),
        ("steps", "tool", {"kind": "tool", "payload": {"tool": "find", "subgoal_id": "a"}}, {}),
        ("steps", "unknown tool", {"kind": "tool", "payload": {"tool": "missing"}}, {}),
        ("feedback", "rating", {"type": "human_rating", "score": 4, "anchor": {"subgoal_id": "a"}}, {}),
        ("finish", "stale precondition", {"text": "done"}, {"If-Match": '"1"'}),
        ("finish", "finish", {"text": "done"}, {}),
        ("finish", "finish again", {"text": "again"}, {}),
        ("steps", "step after finish", STEP, {}),
        ("feedback", "late feedback", {"type": "human_rating", "score": 2}, {}),
    ],
    "a retried key is answered from the log": [
        ("create", "open", {"user_query": "q"}, {"Idempotency-Key": "open-SID"}),
        ("create", "open again", {"user_query": "q"}, {"Idempotency-Key": "open-SID"}),
        ("steps", "step", STEP, {"Idempotency-Key": "step-1"}),
        ("steps", "step again", STEP, {"Idempotency-Key": "step-1"}),
        ("feedback", "rating", {"type": "human_rating", "score": 4}, {"Idempotency-Key": "fb-1"}),
        ("feedback", "rating again", {"type": "human_rating", "score": 4}, {"Idempotency-Key": "fb-1"}),
        ("finish", "finish", {"text": "done"}, {"Idempotency-Key": "end-1"}),
        ("finish", "finish again", {"text": "done"}, {"Idempotency-Key": "end-1"}),
    ],
    "a session that does not exist": [
        ("steps", "step", STEP, {}),
        ("feedback", "rating", {"type": "human_rating", "score": 4}, {}),
        ("finish", "finish", {"text": "done"}, {"If-Match": '"3"'}),
    ],
    "requests the routes refuse": [
        ("create", "open", {"user_query": "q"}, {}),
        ("steps", "no token", STEP, {"Authorization": ""}),
        ("steps", "unknown token", STEP, {"Authorization": "Bearer nobody"}),
        ("steps", "a reader's token", STEP, {"Authorization": f"Bearer {READER}"}),
        ("steps", "not JSON", b"{not json", {}),
        ("steps", "JSON too deep", b"[" * 100_000, {}),
        ("steps", "unknown kind", {"kind": "dance"}, {}),
        ("steps", "bad key", STEP, {"Idempotency-Key": "a b"}),
        ("steps", "bad If-Match", STEP, {"If-Match": "seven"}),
        ("feedback", "bad score", {"type": "human_rating", "score": "high"}, {}),
        ("finish", "bad output", {"text": 3}, {}),
        ("steps", "too large", b'{"kind": "llm", "pad": "' + b"x" * 1_100_000 + b'"}', {}),
        ("create", "duplicate session id", {"user_query": "q"}, {}),
    ],
}


async def play(client: httpx.AsyncClient, sid: str, script: list[Sent]) -> list[Any]:
    """Send a script for session `sid`; return what the contract compares of each answer."""
    answers = []
    for route, label, body, extra in script:
        path = "/v1/sessions" if route == "create" else f"/v1/sessions/{sid}/{route}"
        if route == "create" and isinstance(body, dict):
            body = {**body, "session_id": sid}
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **{k: v.replace("SID", sid) for k, v in extra.items()}}
        response = await client.post(path, content=content, headers=headers)
        answers.append((label, answer(response, sid)))
    return answers


@pytest.mark.parametrize("name", sorted(SCRIPTS))
async def test_the_shortcut_and_the_framework_answer_alike(name: str) -> None:
    app = make_app()
    routed: list[str] = []

    class Tap:
        """Records the paths of the requests that reach the framework's layers."""

        def __init__(self, inner: ASGIApp) -> None:
            self.inner = inner

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                routed.append(scope["path"])
            await self.inner(scope, receive, send)

    app.add_middleware(Tap)
    async with serving(app) as direct:
        transport = httpx.ASGITransport(app=framework_only(app))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://service", headers=AUTH
        ) as framework:
            framework_answers = await play(framework, "s-framework", SCRIPTS[name])
            routed.clear()
            direct_answers = await play(direct, "s-direct", SCRIPTS[name])
    for (label, ours), (_, theirs) in zip(direct_answers, framework_answers, strict=True):
        assert ours == theirs, label
    if name == "a session's life on every served route":
        assert routed == []  # every well-formed request of the life was served by the shortcut


def test_the_shortcut_serves_every_write_route_and_the_life_script_covers_them() -> None:
    shortcut = shortcut_over(Inner())
    served = {route.path for route in shortcut.served}
    assert served == {
        "/v1/sessions",
        "/v1/sessions/{session_id}/steps",
        "/v1/sessions/{session_id}/finish",
        "/v1/sessions/{session_id}/feedback",
    }
    scripted = {
        "/v1/sessions" if r == "create" else f"/v1/sessions/{{session_id}}/{r}"
        for r, *_ in SCRIPTS["a session's life on every served route"]
    }
    assert scripted == served


async def test_a_spent_rate_is_answered_alike_on_both_paths() -> None:
    # a bucket of 3 refilled at one request per 100 s: the third request is the last one let through
    app = make_app(rate_per_s=0.01, rate_burst=3)
    async with serving(app) as direct:
        transport = httpx.ASGITransport(app=framework_only(app))
        async with httpx.AsyncClient(
            transport=transport, base_url="http://service", headers=AUTH
        ) as framework:
            opened = await direct.post("/v1/sessions", json={"user_query": "q", "session_id": "s1"})
            assert (await direct.post("/v1/sessions/s1/steps", json=STEP)).status_code == 200
            assert (await framework.post("/v1/sessions/s1/steps", json=STEP)).status_code == 200
            limited = [await c.post("/v1/sessions/s1/steps", json=STEP) for c in (direct, framework)]
    assert opened.status_code == 201
    ours, theirs = (answer(r, "s1") for r in limited)
    assert ours[0] == 429
    ours[1].pop("retry-after")  # the seconds left differ by the clock
    theirs[1].pop("retry-after")
    assert ours == theirs


def test_a_route_that_declares_more_than_the_shortcut_reads_is_left_to_the_framework() -> None:
    router = APIRouter()

    @router.post("/with-query")
    async def with_query(body: Health, principal: Writer, limit: int = Query(1)) -> Response:
        return json_response(body)

    @router.post("/with-model")
    async def with_model(body: Health, principal: Writer) -> Health:
        return body

    @router.post("/plain")
    async def plain(body: Health, principal: Writer) -> Response:
        return json_response(body)

    shortcut = Shortcut(Inner(), router.routes)
    assert [route.path for route in shortcut.served] == ["/plain"]
