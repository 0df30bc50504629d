"""The gateway as a proxy to an upstream OpenAI-compatible server (a simulator on loopback)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import WRITER, gateway_app, serving_on_loopback
from openai import OpenAI
from upstream_simulator import MODEL, Simulator

from sessionrl.gateway import ChatRequest, UpstreamChat, UpstreamError
from sessionrl.gateway.upstream import env_proxy

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


def test_an_upstream_slower_than_the_timeout_is_a_504_and_so_is_a_stream_that_stalls() -> None:
    async def answer(chat: UpstreamChat, request: ChatRequest) -> list[Any]:
        if request.stream:
            return [chunk async for chunk in await chat.open_stream(request)]
        return [await chat.complete(request, "s-1")]

    async def asked(sim: Simulator, *, stream: bool) -> UpstreamError:
        with serving_on_loopback(sim.app()) as upstream:
            chat = UpstreamChat(f"{upstream}/v1", api_key=sim.api_key, timeout_s=0.2)
            request = ChatRequest(messages=[{"role": "user", "content": "hi"}], stream=stream)
            try:
                with pytest.raises(UpstreamError) as failed:
                    await answer(chat, request)
            finally:
                await chat.aclose()
        return failed.value

    late = asyncio.run(asked(Simulator(latency_s=1.0), stream=False))
    assert late.status == 504
    assert late.message.startswith("the upstream server did not answer in time")
    stalled = asyncio.run(asked(Simulator(chunk_delay_s=1.0), stream=True))
    assert stalled.status == 504
    assert stalled.message.startswith("the upstream server stopped streaming")


def test_the_upstream_is_reached_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("https://api.example.com/v1") is None
    monkeypatch.setenv("https_proxy", "http://proxy.internal:3128")
    monkeypatch.setenv("no_proxy", "models.internal")
    assert env_proxy("https://api.example.com/v1") == "http://proxy.internal:3128"
    assert env_proxy("http://api.example.com/v1") is None  # no proxy named for plain http
    assert env_proxy("https://models.internal/v1") is None  # exempted
