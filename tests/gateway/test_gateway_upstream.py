"""The gateway as a proxy to an upstream OpenAI-compatible server (a simulator on loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import WRITER, gateway_app, serving_on_loopback
from openai import OpenAI
from upstream_simulator import MODEL, Simulator

TOOL = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
AUTH = {"Authorization": f"Bearer {WRITER}"}


def session(root: str, sid: str) -> dict[str, Any]:
    response = httpx.get(f"{root}/v1/sessions/{sid}", headers=AUTH)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def proxied(sim: Simulator, tmp_path: Path, upstream: str) -> Any:
    return gateway_app(
        f"sqlite:///{tmp_path / 'g.db'}", upstream_url=f"{upstream}/v1", upstream_api_key=sim.api_key
    )


def test_a_proxied_agent_turn_is_recorded_with_what_the_upstream_said(tmp_path: Path) -> None:
    sim = Simulator(latency_s=0.05)
    with (
        serving_on_loopback(sim.app()) as upstream,
        serving_on_loopback(proxied(sim, tmp_path, upstream)) as root,
    ):
        client = OpenAI(base_url=f"{root}/gateway/sessions/p-1/v1", api_key=WRITER, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "find shoes"}]
        first = client.chat.completions.create(model="any", messages=messages, tools=[TOOL])
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"hits": 3}'},
        ]
        second = client.chat.completions.create(model="any", messages=messages, tools=[TOOL])
        assert second.choices[0].message.content == 'done: {"hits": 3}'
        assert [m.id for m in client.models.list().data] == [MODEL]
        recorded = session(root, "p-1")
    assert sim.requests[0]["tools"] == [TOOL]  # what the agent sent reached the upstream
    first_call, second_call = recorded["llm_calls"]
    assert first_call["model"] == MODEL
    assert first_call["usage"]["total_tokens"] == 25
    assert first_call["latency_ms"] >= 50  # the upstream's latency, measured around the call
    assert first_call["tool_calls"][0]["name"] == "search"
    (tool,) = recorded["tool_calls"]
    assert (tool["call_id"], tool["tool"], tool["params"], tool["output"]) == (
        call.id,
        "search",
        {"q": "find shoes"},
        {"hits": 3},
    )
    assert tool["latency_ms"] > 0  # from the answer that asked for it to the request that answered it
    assert second_call["response"] == 'done: {"hits": 3}'


def test_an_upstream_failure_is_an_openai_error_and_a_recorded_failed_call(tmp_path: Path) -> None:
    sim = Simulator(fail={0})
    with (
        serving_on_loopback(sim.app()) as upstream,
        serving_on_loopback(proxied(sim, tmp_path, upstream)) as root,
    ):
        client = OpenAI(base_url=f"{root}/gateway/sessions/p-2/v1", api_key=WRITER, max_retries=0)
        with pytest.raises(openai.InternalServerError) as failed:
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
        assert failed.value.status_code == 502  # the upstream's 503 is a bad gateway to the agent
        assert "overloaded" in str(failed.value)
        assert failed.value.body == {
            "message": "the upstream server answered 503: The server is overloaded; try again later",
            "type": "upstream_error",
            "param": None,
            "code": "upstream_failed",
        }
        retried = OpenAI(base_url=f"{root}/gateway/sessions/p-2/v1", api_key=WRITER, max_retries=0)
        assert retried.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}]).id
        calls = session(root, "p-2")["llm_calls"]
    assert [c["status"] for c in calls] == ["error", "success"]
    assert "overloaded" in calls[0]["error_message"]


def test_an_unreachable_upstream_is_a_502_and_recorded(tmp_path: Path) -> None:
    app = gateway_app(f"sqlite:///{tmp_path / 'g.db'}", upstream_url="http://127.0.0.1:9/v1")
    with serving_on_loopback(app) as root:
        client = OpenAI(base_url=f"{root}/gateway/sessions/p-3/v1", api_key=WRITER, max_retries=0)
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model="any", messages=[{"role": "user", "content": "hi"}])
        assert failed.value.status_code == 502
        assert session(root, "p-3")["llm_calls"][0]["status"] == "error"
