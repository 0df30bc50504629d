"""The gateway answered by a real local causal LM (the tiny model): the prompt and completion token ids
and log-probabilities it sampled are recorded, and train as they are, with no re-tokenising."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from gateway_support import WRITER, gateway_app, serving_on_loopback
from openai import OpenAI

from sessionrl.gateway import ChatRequest
from sessionrl.gateway.backends import PolicyChat, read_action
from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.policy.toolcalls import ToolFormat, listed_tools
from sessionrl.session.model import Message, Session
from sessionrl.train.llm.captured import captured_sequences

TINY = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
TOOL = {"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}
TEXTS = [
    '{"tool":"lookup_order","params":{"order_id":"O-1"}}',
    '{"final":"It ships tomorrow."}',
    "where is O-1?",
]


def test_the_local_policy_s_sampled_tokens_are_recorded_and_trained_as_sampled(tmp_path: Path) -> None:
    build_tiny_policy(TEXTS * 20, TINY, tmp_path / "tiny")
    policy = HFPolicy.load(tmp_path / "tiny", SamplingConfig(max_new_tokens=6))
    policy.version = 3  # as after three updates: the recorded call names the weights that sampled it
    messages: list[Any] = [{"role": "user", "content": "where is O-1?"}]
    with serving_on_loopback(gateway_app(f"sqlite:///{tmp_path / 'g.db'}", backends=[policy])) as root:
        client = OpenAI(base_url=f"{root}/gateway/sessions/tiny-1/v1", api_key=WRITER, max_retries=0)
        answer = client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
        raw = httpx.get(f"{root}/v1/sessions/tiny-1", headers={"Authorization": f"Bearer {WRITER}"})
    session = Session.model_validate(raw.json())
    (call,) = session.llm_calls
    assert call.prompt_token_ids == tuple(
        policy.encode_prompt([Message(role="user", content="where is O-1?")])
    )
    assert call.token_ids
    assert call.policy_version == 3
    assert call.logprobs is not None
    assert len(call.logprobs) == len(call.token_ids)
    assert all(lp <= 0.0 for lp in call.logprobs)
    assert answer.usage is not None
    assert answer.usage.completion_tokens == len(call.token_ids)
    data = captured_sequences([session], policy)
    assert data.dropped == []
    (seq,) = data.sequences
    assert seq.input_ids == call.prompt_token_ids + call.token_ids
    assert [lp for lp, m in zip(seq.old_logprobs, seq.loss_mask, strict=True) if m] == list(call.logprobs)


def test_tool_choice_none_leaves_the_policy_s_tool_call_as_text() -> None:
    tool = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    user = [{"role": "user", "content": "boots?"}]
    action = '{"tool":"search","params":{"q":"boots"}}'
    auto = ChatRequest(messages=user, tools=[tool])
    (call,) = read_action(action, auto, seed="s")[1]
    assert (call.name, call.arguments) == ("search", '{"q":"boots"}')
    assert read_action(action, ChatRequest(messages=user, tools=[tool], tool_choice="none"), seed="s") == (
        action,
        (),
    )
    # a tool the request does not offer is no call either
    assert read_action('{"tool":"delete_all","params":{}}', auto, seed="s")[1] == ()


def test_references_in_the_policy_s_actions_reach_the_agent_as_the_values_they_name() -> None:
    tool = {"type": "function", "function": {"name": "stock", "parameters": {"type": "object"}}}
    asked = {"role": "assistant", "content": None, "tool_calls": [_call("c1", "stock", {"sku": "SKU-7"})]}
    conversation = [
        {"role": "user", "content": "Is it in stock? · item SKU-7 · phone 13800001234"},
        asked,
        {"role": "tool", "tool_call_id": "c1", "content": '{"sku": "SKU-7", "on_hand": 4}'},
    ]
    request = ChatRequest(messages=conversation, tools=[tool])
    (call,) = read_action('{"tool":"stock","params":{"sku":"{{user.item}}"}}', request, seed="s")[1]
    assert call.arguments == '{"sku":"SKU-7"}'
    answer = read_action('{"final":"{{stock.sku}}: {{stock.on_hand}} on hand."}', request, seed="s")
    assert answer == ("SKU-7: 4 on hand.", ())
    # a reference to nothing the conversation holds stays as written, for the agent to see
    assert read_action('{"final":"{{refund.id}}"}', request, seed="s") == ("{{refund.id}}", ())


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class _NativeEcho:
    """A policy backend that writes native tool calls and keeps the conversations it was given."""

    tool_format = ToolFormat.NATIVE

    def __init__(self) -> None:
        self.seen: list[list[Message]] = []

    async def generate(self, messages: list[Message], purpose: str = "step") -> PolicyReply:
        self.seen.append(list(messages))
        return PolicyReply(text="Nothing to call.")


def test_a_native_policy_is_shown_the_request_s_tools_where_its_chat_template_finds_them() -> None:
    backend = _NativeEcho()
    chat = PolicyChat([backend])
    with_system = ChatRequest(
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "O-1?"}],
        tools=[TOOL],
    )
    without_system = ChatRequest(messages=[{"role": "user", "content": "O-1?"}], tools=[TOOL])
    asyncio.run(chat.complete(with_system, "s-1"))
    asyncio.run(chat.complete(without_system, "s-2"))
    asyncio.run(chat.complete(ChatRequest(messages=[{"role": "user", "content": "hi"}]), "s-3"))
    first, second, untooled = backend.seen
    assert listed_tools(first[0].content) == ("Be brief.", [TOOL])
    assert [m.role for m in second] == ["system", "user"]
    assert listed_tools(second[0].content)[1] == [TOOL]
    assert [m.role for m in untooled] == ["user"]
