"""Record mode over HTTP and through the client, and the bad inputs that must write nothing."""

from __future__ import annotations

from typing import Any

import httpx
from service_support import WRITER, make_app, serving

from sessionrl.client import AsyncClient

PROBLEM = "application/problem+json"
REPLY = {
    "text": "",
    "tool_calls": [{"id": "call_1", "name": "find", "arguments": '{"order_id": "7"}'}],
    "model": "gpt-test",
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    "latency_ms": 20.0,
    "token_ids": [5, 6],
    "logprobs": [-0.1, -0.2],
}


async def open_session(client: httpx.AsyncClient, **fields: Any) -> str:
    response = await client.post("/v1/sessions", json={"user_query": "where is order 7?", **fields})
    assert response.status_code == 201, response.text
    return str(response.json()["session_id"])


async def test_an_agent_records_its_own_model_and_tool_calls(client: httpx.AsyncClient) -> None:
    sid = await open_session(client, metadata={"free_form_tools": True})
    steps = f"/v1/sessions/{sid}/steps"
    llm = {
        "messages": [{"role": "user", "content": "where is order 7?"}],
        "reply": REPLY,
        "call_id": "cmpl-1",
    }
    answer = await client.post(steps, json={"kind": "llm", "payload": llm})
    assert answer.status_code == 200, answer.text
    assert answer.json()["call_id"] == "cmpl-1"
    tool = {
        "tool": "find",
        "params": {"order_id": "7"},
        "result": {"output": {"at": "depot"}},
        "call_id": "call_1",
    }
    assert (await client.post(steps, json={"kind": "tool", "payload": tool})).json()["ok"]
    own = {"tool": "weather", "params": {}, "result": {"status": "error", "error_message": "down"}}
    failed = (await client.post(steps, json={"kind": "tool", "payload": own})).json()
    assert (failed["ok"], failed["status"]) == (False, "error")
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert session["llm_calls"][0]["token_ids"] == [5, 6]
    assert session["llm_calls"][0]["recorded"]
    assert [(c["tool"], c["recorded"], c["free_form"]) for c in session["tool_calls"]] == [
        ("find", True, False),
        ("weather", True, True),
    ]


async def test_an_unknown_tool_without_free_form_is_422_and_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = await open_session(client)
    own = {"tool": "weather", "params": {}, "result": {"output": 1}}
    response = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "tool", "payload": own})
    assert response.status_code == 422
    assert "free_form_tools" in response.json()["detail"]
    assert (await client.get(f"/v1/sessions/{sid}")).json()["tool_calls"] == []


async def test_a_key_reused_with_another_body_or_kind_is_422_saying_so(client: httpx.AsyncClient) -> None:
    sid = await open_session(client)
    steps, key = f"/v1/sessions/{sid}/steps", {"Idempotency-Key": "rec-1"}
    tool = {"tool": "find", "params": {"order_id": "7"}, "result": {"output": {"at": "depot"}}}
    first = await client.post(steps, json={"kind": "tool", "payload": tool}, headers=key)
    again = await client.post(steps, json={"kind": "tool", "payload": tool}, headers=key)
    assert first.json() == again.json()
    for body in (
        {"kind": "tool", "payload": {**tool, "params": {"order_id": "8"}}},
        {"kind": "llm", "payload": {"reply": REPLY}},
    ):
        refused = await client.post(steps, json=body, headers=key)
        assert refused.status_code == 422
        assert refused.headers["content-type"] == PROBLEM
        assert refused.json()["code"] == "idempotency_key_reused"
        assert "Idempotency-Key was already used" in refused.json()["detail"]
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert len(session["tool_calls"]) == 1
    assert session["llm_calls"] == []


async def test_a_rating_outside_one_to_five_is_422_and_writes_nothing(client: httpx.AsyncClient) -> None:
    sid = await open_session(client)
    for score in (0, 6, 5.5):
        response = await client.post(
            f"/v1/sessions/{sid}/feedback", json={"type": "human_rating", "score": score}
        )
        assert response.status_code == 422
        assert "1 to 5" in response.text
    ok = await client.post(f"/v1/sessions/{sid}/feedback", json={"type": "human_rating", "score": 5})
    assert ok.status_code == 201
    assert len((await client.get(f"/v1/sessions/{sid}")).json()["feedback"]) == 1


async def test_the_client_records_steps_and_the_openapi_document_shows_record_mode() -> None:
    app = make_app()
    async with serving(app) as http:
        schemas = (await http.get("/openapi.json")).json()["components"]["schemas"]
        assert "reply" in schemas["LLMPayload"]["properties"]
        assert "result" in schemas["ToolPayload"]["properties"]
        async with AsyncClient("http://service", WRITER, transport=httpx.ASGITransport(app=app)) as client:
            sid = (await client.create_session("where is order 7?")).session_id
            llm = await client.record_llm(sid, [{"role": "user", "content": "q"}], REPLY, call_id="cmpl-9")
            tool = await client.record_tool(
                sid, "find", {"order_id": "7"}, {"output": {"at": "x"}}, call_id="call_1"
            )
            assert (llm.call_id, tool.call_id, tool.ok) == ("cmpl-9", "call_1", True)
            session = await client.get_session(sid)
    assert session.llm_calls[0].model == "gpt-test"
    assert session.tool_calls[0].recorded
