"""Exact tokens from an upstream that gives them (the simulator answering as vLLM's OpenAI server does
when asked): the gateway asks for them and records them, streamed or not, and the session says where its
tokens come from; without them it says they are re-tokenised."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from gateway_support import WRITER, gateway_app, serving_on_loopback
from openai import OpenAI
from upstream_simulator import PROMPT_IDS, Simulator

from sessionrl.gateway.config import GatewayConfig

AUTH = {"Authorization": f"Bearer {WRITER}"}
USER = [{"role": "user", "content": "hi"}]


def session(root: str, sid: str) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{root}/v1/sessions/{sid}", headers=AUTH).json()
    return body


def test_an_upstream_s_token_ids_and_logprobs_are_asked_for_and_recorded(tmp_path: Path) -> None:
    sim = Simulator(latency_s=0.0)
    config = GatewayConfig(upstream_token_ids=True)
    with serving_on_loopback(sim.app()) as upstream:
        app = gateway_app(
            f"sqlite:///{tmp_path / 'g.db'}",
            upstream_url=f"{upstream}/v1",
            upstream_api_key=sim.api_key,
            gateway=config,
        )
        with serving_on_loopback(app) as root:
            for sid, stream in (("tok-1", False), ("tok-2", True)):
                client = OpenAI(base_url=f"{root}/gateway/sessions/{sid}/v1", api_key=WRITER, max_retries=0)
                answer = client.chat.completions.create(model="m", messages=USER, stream=stream)
                if stream:
                    assert (
                        "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
                        == "done: nothing"
                    )
                else:
                    assert answer.choices[0].message.content == "done: nothing"
            recorded = {sid: session(root, sid) for sid in ("tok-1", "tok-2")}
    assert all(r["return_token_ids"] and r["logprobs"] for r in sim.requests)
    for sid, s in recorded.items():
        (call,) = s["llm_calls"]
        assert (call["prompt_token_ids"], call["token_ids"], call["logprobs"]) == (
            PROMPT_IDS,
            [100, 101],  # one per word of "done: nothing"
            [-0.25, -0.5],
        ), sid
        assert s["metadata"]["token_source"] == "upstream"


def test_without_an_upstream_that_gives_tokens_the_session_says_they_are_re_tokenised(tmp_path: Path) -> None:
    sim = Simulator(latency_s=0.0)
    with serving_on_loopback(sim.app()) as upstream:
        app = gateway_app(
            f"sqlite:///{tmp_path / 'g.db'}", upstream_url=f"{upstream}/v1", upstream_api_key=sim.api_key
        )
        with serving_on_loopback(app) as root:
            client = OpenAI(base_url=f"{root}/gateway/sessions/plain-1/v1", api_key=WRITER, max_retries=0)
            client.chat.completions.create(model="m", messages=USER)
            recorded = session(root, "plain-1")
    assert "return_token_ids" not in sim.requests[0]
    (call,) = recorded["llm_calls"]
    assert call["token_ids"] is None
    assert recorded["metadata"]["token_source"] == "retokenised"
