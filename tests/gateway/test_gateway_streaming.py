"""True streaming through the gateway to a streaming upstream (the simulator, slowed down): chunks reach
the agent before the upstream has finished, parallel tool calls and a failed result are recorded
exactly, usage is recorded when sent and null when not, and an agent that leaves mid-stream leaves a
call recorded as cut off with what had arrived."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import WRITER, gateway_app, serving_on_loopback
from openai import OpenAI
from upstream_simulator import Simulator

AUTH = {"Authorization": f"Bearer {WRITER}"}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("stock", "price")
]


def proxied(sim: Simulator, tmp_path: Path, upstream: str) -> Any:
    return gateway_app(
        f"sqlite:///{tmp_path / 'g.db'}", upstream_url=f"{upstream}/v1", upstream_api_key=sim.api_key
    )


def session(root: str, sid: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{root}/v1/sessions/{sid}", headers=AUTH).json()
    return body


def test_a_streaming_agent_with_parallel_tool_calls_is_recorded_exactly(tmp_path: Path) -> None:
    sim = Simulator(latency_s=0.0, chunk_delay_s=0.05, parallel=True)
    with (
        serving_on_loopback(sim.app()) as upstream,
        serving_on_loopback(proxied(sim, tmp_path, upstream)) as root,
    ):
        client = OpenAI(base_url=f"{root}/gateway/sessions/st-1/v1", api_key=WRITER, max_retries=0)
        messages: list[Any] = [{"role": "user", "content": "boots"}]
        stream = client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, stream=True, stream_options={"include_usage": True}
        )
        first_chunk_at = None
        chunks = []
        for chunk in stream:
            first_chunk_at = first_chunk_at or time.monotonic()
            chunks.append(chunk)
        assert first_chunk_at is not None
        assert first_chunk_at < sim.streams_done[0]  # the agent read before the upstream had finished
        assert {c.id for c in chunks} == {chunks[0].id}  # the id the session records
        assert chunks[-1].usage is not None  # asked for, and sent
        calls: dict[int, dict[str, Any]] = {}
        for delta in (c.choices[0].delta for c in chunks if c.choices):
            for piece in delta.tool_calls or ():
                slot = calls.setdefault(piece.index, {"id": piece.id, "name": "", "arguments": ""})
                slot["name"] += (piece.function and piece.function.name) or ""
                slot["arguments"] += (piece.function and piece.function.arguments) or ""
        assert [c["name"] for c in calls.values()] == ["stock", "price"]
        messages.append(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["arguments"]},
                    }
                    for c in calls.values()
                ],
            }
        )
        messages += [
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"on_hand": 3}'},
            {"role": "tool", "tool_call_id": calls[1]["id"], "content": '{"error": "no price list"}'},
        ]
        second = list(client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True))
        assert all(c.usage is None for c in second)  # not asked for: not sent on
        text = "".join(c.choices[0].delta.content or "" for c in second if c.choices)
        recorded = session(root, "st-1")
        with pytest.raises(openai.ConflictError):  # the answer ended the session: refused before a stream
            client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)
    assert text == 'done: {"error": "no price list"}'
    asked, answered = recorded["llm_calls"]
    assert asked["call_id"] == chunks[0].id
    assert [(c["name"], json.loads(c["arguments"])) for c in asked["tool_calls"]] == [
        ("stock", {"q": "boots"}),
        ("price", {"q": "boots"}),
    ]
    assert asked["usage"] == {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
    assert answered["usage"]["total_tokens"] == 26  # the upstream always sends it to the gateway
    assert answered["response"] == text
    assert [(c["tool"], c["status"]) for c in recorded["tool_calls"]] == [
        ("stock", "success"),
        ("price", "error"),
    ]
    assert recorded["state"] == "finished"


def test_usage_the_upstream_does_not_send_is_null(tmp_path: Path) -> None:
    sim = Simulator(latency_s=0.0, send_usage=False)
    with (
        serving_on_loopback(sim.app()) as upstream,
        serving_on_loopback(proxied(sim, tmp_path, upstream)) as root,
    ):
        client = OpenAI(base_url=f"{root}/gateway/sessions/nu-1/v1", api_key=WRITER, max_retries=0)
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert answer.usage is None
        (call,) = session(root, "nu-1")["llm_calls"]
    assert (call["usage"], call["tokens_used"]) == (None, None)


def test_an_agent_that_leaves_mid_stream_leaves_a_call_cut_off_with_what_had_arrived(tmp_path: Path) -> None:
    sim = Simulator(latency_s=0.0, chunk_delay_s=0.3)
    with (
        serving_on_loopback(sim.app()) as upstream,
        serving_on_loopback(proxied(sim, tmp_path, upstream)) as root,
    ):
        url = f"{root}/gateway/sessions/cut-1/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=30) as response:
            assert response.status_code == 200
            events: list[str] = []
            for line in response.iter_lines():
                if line.startswith("data:"):
                    events.append(line)
                if len(events) == 2:  # the role, then the first word
                    break
        deadline = time.monotonic() + 20
        while not session(root, "cut-1").get("llm_calls"):
            assert time.monotonic() < deadline, "the cut-off call was never recorded"
            time.sleep(0.05)
        (call,) = session(root, "cut-1")["llm_calls"]
    assert call["status"] == "error"
    assert call["error_message"].startswith("cut off")
    assert "done: nothing".startswith(call["response"])
    assert call["response"]  # the first word had arrived
