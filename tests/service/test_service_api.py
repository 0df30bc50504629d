"""Every route's status codes and bodies, the error statuses, and idempotent replays."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_support import OTHER_WRITER, PLAN, READER, contract, make_app, serving

from sessionrl.orchestrator.config import LaneConfig, OrchestratorConfig
from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.session import Message
from sessionrl.skills import callable_skill

PROBLEM = "application/problem+json"


async def new_session(client: httpx.AsyncClient, **fields: Any) -> str:
    response = await client.post("/v1/sessions", json={"user_query": "refund my order", **fields})
    assert response.status_code == 201
    return str(response.json()["session_id"])


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["title"]
    return body


async def test_create_returns_the_session_with_its_location_and_etag(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/sessions", json={"user_query": "hi", "scenario": "shop", "tags": ["vip"]}
    )
    assert response.status_code == 201
    body = response.json()
    assert (body["state"], body["scenario"], body["tags"], body["state_version"]) == (
        "created",
        "shop",
        ["vip"],
        1,
    )
    assert response.headers["location"] == f"/v1/sessions/{body['session_id']}"
    assert response.headers["etag"] == '"1"'
    got = await client.get(response.headers["location"])
    assert got.status_code == 200
    assert got.json() == body


async def test_a_tool_step_runs_and_a_refused_one_is_still_a_200(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    plan = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "plan", "payload": {"plan": PLAN}})
    assert plan.status_code == 200
    assert (plan.json()["ok"], plan.json()["state"]) == (True, "executing")
    refused = await client.post(
        f"/v1/sessions/{sid}/steps", json={"kind": "tool", "payload": {"tool": "refund", "subgoal_id": "b"}}
    )
    assert refused.status_code == 200
    assert (refused.json()["ok"], refused.json()["refused"], refused.json()["status"]) == (
        False,
        "UNMET_DEPENDENCIES",
        "refused",
    )
    found = await client.post(
        f"/v1/sessions/{sid}/steps",
        json={"kind": "tool", "payload": {"tool": "find", "subgoal_id": "a", "params": {"id": 4}}},
    )
    assert found.json()["output"] == {"order": "#1", "id": 4}


async def test_an_llm_step_goes_to_the_policy() -> None:
    class Echo:
        async def generate(self, messages: Any, *, purpose: str) -> PolicyReply:
            return PolicyReply(text=f"{purpose}: {messages[-1].content}", policy_version=2)

    async with serving(make_app(backends=[Echo()])) as client:
        sid = await new_session(client)
        body = {"kind": "llm", "payload": {"messages": [Message(role="user", content="hello").model_dump()]}}
        response = await client.post(f"/v1/sessions/{sid}/steps", json=body)
        assert response.status_code == 200
        assert response.json()["text"] == "step: hello"


async def test_feedback_is_201_and_a_bad_anchor_is_422(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    response = await client.post(f"/v1/sessions/{sid}/feedback", json={"type": "human_rating", "score": 4})
    assert response.status_code == 201
    assert response.json()["in_force"] is True
    bad = await client.post(
        f"/v1/sessions/{sid}/feedback", json={"type": "comment", "anchor": {"call_id": "c_missing"}}
    )
    body = assert_problem(bad, 422, "invalid")
    assert "c_missing" in body["detail"]


async def test_finish_then_every_change_but_feedback_is_a_409(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    finished = await client.post(f"/v1/sessions/{sid}/finish", json={"text": "done"})
    assert finished.status_code == 200
    assert finished.json()["state"] == "finished"
    again = await client.post(f"/v1/sessions/{sid}/finish", json={"text": "done"})
    assert_problem(again, 409, "invalid_transition")
    step = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "tool", "payload": {"tool": "find"}})
    assert_problem(step, 409, "invalid_transition")
    late = await client.post(f"/v1/sessions/{sid}/feedback", json={"type": "comment", "comment": "late"})
    assert late.status_code == 201


async def test_unknown_sessions_and_routes_are_404(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/sessions/s_none"), 404, "not_found")
    step = await client.post("/v1/sessions/s_none/steps", json={"kind": "tool", "payload": {"tool": "find"}})
    assert_problem(step, 404, "not_found")
    assert_problem(await client.post("/v1/sessions/s_none/finish", json={"text": "x"}), 404, "not_found")
    assert_problem(await client.get("/v1/nothing"), 404, "not_found")


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "dance"},
        {"kind": "tool", "payload": {"tool": "find", "surprise": 1}},
        {"kind": "plan", "payload": {"plan": {"root_goal": 3}}},
        {"payload": {}},
    ],
)
async def test_bad_step_payloads_are_422_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    sid = await new_session(client)
    problem = assert_problem(await client.post(f"/v1/sessions/{sid}/steps", json=body), 422, "invalid")
    assert problem["errors"]
    assert all(e["field"].startswith("body") for e in problem["errors"])


async def test_malformed_json_is_400_saying_where_parsing_stopped(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/sessions",
        content=b'{"user_query": "q",\n "tags": nope}',
        headers={"Content-Type": "application/json"},
    )
    problem = assert_problem(response, 400, "malformed")
    assert "line 2, column 10" in problem["detail"]
    assert "body." not in problem["detail"]
    assert (await client.get("/v1/sessions")).json()["items"] == []


async def test_if_match_guards_a_step_with_412(client: httpx.AsyncClient) -> None:
    sid = await new_session(client)
    stale = await client.post(
        f"/v1/sessions/{sid}/steps",
        json={"kind": "tool", "payload": {"tool": "find"}},
        headers={"If-Match": '"7"'},
    )
    body = assert_problem(stale, 412, "precondition_failed")
    assert "expected state_version 7" in body["detail"]
    fresh = await client.post(
        f"/v1/sessions/{sid}/steps",
        json={"kind": "tool", "payload": {"tool": "find"}},
        headers={"If-Match": '"1"'},
    )
    assert fresh.status_code == 200
    finish = await client.post(f"/v1/sessions/{sid}/finish", json={"text": "x"}, headers={"If-Match": '"1"'})
    assert_problem(finish, 412, "precondition_failed")


async def test_listing_filters_sessions(client: httpx.AsyncClient) -> None:
    vip = await new_session(client, tags=["vip"], scenario="shop")
    await new_session(client, scenario="clinic")
    await client.post(f"/v1/sessions/{vip}/finish", json={"text": "done"})
    everything = await client.get("/v1/sessions")
    assert everything.status_code == 200
    assert len(everything.json()["items"]) == 2
    finished = (await client.get("/v1/sessions", params={"state": "finished", "tag": "vip"})).json()
    assert [s["session_id"] for s in finished["items"]] == [vip]
    paged = (await client.get("/v1/sessions", params={"limit": 1, "offset": 1})).json()
    assert (len(paged["items"]), paged["limit"], paged["offset"]) == (1, 1, 1)
    assert_problem(await client.get("/v1/sessions", params={"limit": 0}), 422, "invalid")
    assert_problem(await client.get("/v1/sessions", params={"state": "dancing"}), 422, "invalid")


async def test_skills_health_and_metrics(client: httpx.AsyncClient) -> None:
    skills = await client.get("/v1/skills")
    assert skills.status_code == 200
    assert [(s["name"], s["masked"]) for s in skills.json()] == [("find", False), ("refund", False)]
    assert skills.json()[0]["tool"]["function"]["name"] == "find"
    health = await client.get("/healthz", headers={"Authorization": ""})
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    sid = await new_session(client)
    await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "tool", "payload": {"tool": "find"}})
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'sessionrl_http_requests_total{method="POST",route="/v1/sessions",status="201"} 1.0' in text
    assert 'sessionrl_steps_total{kind="tool",outcome="ok"} 1.0' in text
    assert "sessionrl_cached_sessions 1.0" in text
    assert "sessionrl_session_cache_misses 0.0" in text


async def test_the_service_publishes_gc_pauses_while_it_runs() -> None:
    callbacks = list(gc.callbacks)
    async with serving(make_app()) as client:
        gc.collect(2)
        text = (await client.get("/metrics")).text
        assert len(gc.callbacks) == len(callbacks) + 2  # the pause timer and the collector's freezer
    assert gc.callbacks == callbacks
    counts = {
        s.labels["generation"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "sessionrl_gc_pause_seconds_count"
    }
    assert set(counts) == {"0", "1", "2"}
    assert counts["2"] >= 1


async def test_two_apps_keep_separate_metrics() -> None:
    async with serving(make_app()) as first, serving(make_app()) as second:
        await first.post("/v1/sessions", json={"user_query": "q"})
        assert 'route="/v1/sessions",status="201"} 1.0' in (await first.get("/metrics")).text
        assert 'route="/v1/sessions"' not in (await second.get("/metrics")).text


# auth and limits


async def test_requests_without_a_known_token_are_401(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v1/skills", headers={"Authorization": ""})
    assert_problem(missing, 401, "unauthorized")
    assert missing.headers["www-authenticate"].startswith("Bearer")
    unknown = await client.get("/v1/skills", headers={"Authorization": "Bearer guess"})
    assert_problem(unknown, 401, "unauthorized")


async def test_a_token_without_the_scope_is_403(client: httpx.AsyncClient) -> None:
    reader = {"Authorization": f"Bearer {READER}"}
    assert (await client.get("/v1/skills", headers=reader)).status_code == 200
    denied = await client.post("/v1/sessions", json={"user_query": "q"}, headers=reader)
    body = assert_problem(denied, 403, "forbidden")
    assert "'write'" in body["detail"]


async def test_bodies_over_the_limit_are_413_declared_or_streamed() -> None:
    async with serving(make_app(max_body_bytes=2048)) as client:
        big = {"user_query": "x" * 4096}
        assert_problem(await client.post("/v1/sessions", json=big), 413, "too_large")

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"user_query": "'
            for _ in range(8):
                yield b"y" * 512
            yield b'"}'

        streamed = await client.post(
            "/v1/sessions", content=chunks(), headers={"Content-Type": "application/json"}
        )
        assert_problem(streamed, 413, "too_large")
        assert (await client.post("/v1/sessions", json={"user_query": "small"})).status_code == 201


async def test_a_token_over_its_rate_gets_429_with_retry_after() -> None:
    # a bucket of 2 refilled at one request per 100 s: the third request must wait about 100 s
    async with serving(make_app(rate_per_s=0.01, rate_burst=2)) as client:
        assert (await client.get("/v1/skills")).status_code == 200
        assert (await client.get("/v1/skills")).status_code == 200
        limited = await client.get("/v1/skills")
        assert_problem(limited, 429, "rate_limited")
        assert 95 <= int(limited.headers["retry-after"]) <= 100
        other = await client.get("/v1/skills", headers={"Authorization": f"Bearer {READER}"})
        assert other.status_code == 200  # limits are per token


async def test_a_full_tool_lane_is_503_with_retry_after() -> None:
    gate = asyncio.Event()

    async def stuck(params: dict[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {}

    config = OrchestratorConfig(tool_lane=LaneConfig(concurrency=1, max_waiting=0))
    skill = callable_skill(contract("stuck", sla={"timeout_s": 3600}), stuck)
    async with serving(make_app([skill], orchestrator=config)) as client:
        sid = await new_session(client)
        step = {"kind": "tool", "payload": {"tool": "stuck"}}
        running = asyncio.create_task(client.post(f"/v1/sessions/{sid}/steps", json=step))
        await asyncio.sleep(0.05)
        overloaded = await client.post(f"/v1/sessions/{sid}/steps", json=step)
        assert_problem(overloaded, 503, "overloaded")
        assert overloaded.headers["retry-after"] == "1"
        gate.set()
        assert (await running).status_code == 200


async def test_an_unexpected_failure_is_a_bare_500_problem() -> None:
    class Broken:
        async def generate(self, messages: Any, *, purpose: str) -> PolicyReply:
            raise RuntimeError("secret internals")

    async with serving(make_app(backends=[Broken()]), raise_errors=False) as client:
        sid = await new_session(client)
        response = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "llm"})
        body = assert_problem(response, 500, "internal")
        assert "secret" not in response.text
        assert body["detail"] == "the service failed unexpectedly"


# idempotency


async def test_every_post_replays_its_first_answer_and_writes_nothing_new() -> None:
    app = make_app()
    async with serving(app) as client:
        store = app.state.engine.store
        key = {"Idempotency-Key": "create-1"}
        first = await client.post("/v1/sessions", json={"user_query": "q"}, headers=key)
        again = await client.post("/v1/sessions", json={"user_query": "q"}, headers=key)
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.json() == first.json()
        sid = first.json()["session_id"]
        assert len(store.session_ids()) == 1
        requests = [
            ("steps", {"kind": "plan", "payload": {"plan": PLAN}}),
            ("steps", {"kind": "tool", "payload": {"tool": "find", "subgoal_id": "a"}}),
            ("feedback", {"type": "human_rating", "score": 5}),
            ("finish", {"text": "done"}),
        ]
        for i, (route, body) in enumerate(requests):
            headers = {"Idempotency-Key": f"k{i}"}
            first = await client.post(f"/v1/sessions/{sid}/{route}", json=body, headers=headers)
            events = len(store.events(sid))
            again = await client.post(f"/v1/sessions/{sid}/{route}", json=body, headers=headers)
            assert again.status_code == first.status_code
            assert again.json() == first.json()
            assert len(store.events(sid)) == events
        # a key is the caller's: the same key from another token is another request
        other = await client.post(
            "/v1/sessions",
            json={"user_query": "q"},
            headers={**key, "Authorization": f"Bearer {OTHER_WRITER}"},
        )
        assert other.status_code == 201
        assert other.json()["session_id"] != sid


async def test_an_invalid_idempotency_key_is_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/sessions", json={"user_query": "q"}, headers={"Idempotency-Key": "a b"})
    assert_problem(response, 422, "invalid")


async def test_the_openapi_document_declares_problems_auth_and_keys(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert "Problem" in spec["components"]["schemas"]
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    step = spec["paths"]["/v1/sessions/{session_id}/steps"]["post"]
    assert {"401", "403", "404", "409", "412", "413", "422", "429", "503"} <= set(step["responses"])
    assert step["responses"]["409"]["content"]["application/problem+json"]["schema"] == {
        "$ref": "#/components/schemas/Problem"
    }
    for path, methods in spec["paths"].items():
        # the gateway speaks OpenAI's API, whose clients send no Idempotency-Key: each request is a model call
        if "post" in methods and "chat/completions" not in path:
            names = {p["name"] for p in methods["post"].get("parameters", [])}
            assert "Idempotency-Key" in names, path
    assert "HTTPValidationError" not in spec["components"]["schemas"]


async def test_no_page_of_the_service_loads_its_script_from_a_cdn(client: httpx.AsyncClient) -> None:
    # Swagger UI is served from the package's copy (see tests/ui); ReDoc only exists as a CDN page
    assert (await client.get("/redoc")).status_code == 404
