"""Tool-call formats: chosen from the chat template, written and read back into one structure, which the
episodes and the gateway both act on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
import torch

from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import EpisodeSpec, RolloutConfig, expert, run_episodes
from sessionrl.episodes.llm import PolicyAgent, prompt_messages
from sessionrl.gateway.backends import policy_view, read_action
from sessionrl.gateway.chat import ChatRequest
from sessionrl.orchestrator.policy import ScriptedBackend
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.policy.toolcalls import (
    TAGGED_INSTRUCTIONS,
    ToolFormat,
    format_for,
    parse_reply,
    tool_format_of,
    write_call,
    write_final,
)
from sessionrl.session.model import Message, ToolRequest
from sessionrl.store import SessionStore

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WITH_TOOLS = (
    "{% if tools %}<|im_start|>system\\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
    "<|im_end|>\\n{% endif %}" + CHATML
)


class Template:
    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-toolcalls")
    config = TinyModelConfig(vocab_size=300, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    build_tiny_policy(["<tool_call>{}</tool_call> hello tools"] * 10, config, folder)
    return folder


def test_the_format_follows_the_chat_template(tiny_dir: Path) -> None:
    tiny = HFPolicy.load(tiny_dir, device=torch.device("cpu"), dtype=torch.float32)
    assert tiny.tool_format is ToolFormat.ACTION
    assert format_for(Template(CHATML)) is ToolFormat.TAGGED
    assert format_for(Template(WITH_TOOLS)) is ToolFormat.NATIVE
    assert format_for(Template(None)) is ToolFormat.ACTION


@pytest.mark.parametrize("fmt", list(ToolFormat))
def test_written_calls_and_answers_read_back_the_same(fmt: ToolFormat) -> None:
    arguments = {"order_id": "#W123", "item_ids": ["1", "2"], "note": 'say "hi"'}
    reply = parse_reply(fmt, write_call(fmt, "cancel_order", arguments), seed="s")
    assert reply.valid
    assert not reply.is_final
    ((call),) = reply.tool_calls
    assert (call.name, orjson.loads(call.arguments)) == ("cancel_order", arguments)
    assert call.id == parse_reply(fmt, write_call(fmt, "cancel_order", arguments), seed="s").tool_calls[0].id
    final = parse_reply(fmt, write_final(fmt, "Your order is cancelled."))
    assert final.is_final
    assert final.text == "Your order is cancelled."


def test_native_syntaxes_become_openai_tool_calls() -> None:
    hermes = (
        'I will check both.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": "{\\"y\\": 2}"}\n</tool_call>'
    )
    reply = parse_reply(ToolFormat.NATIVE, hermes, seed="q")
    assert reply.text == "I will check both."
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [("a", '{"x":1}'), ("b", '{"y":2}')]
    assert len({c.id for c in reply.tool_calls}) == 2
    llama = parse_reply(ToolFormat.NATIVE, '{"name": "get_user", "parameters": {"user_id": "u1"}}')
    assert [(c.name, c.arguments) for c in llama.tool_calls] == [("get_user", '{"user_id":"u1"}')]
    tagged = parse_reply(ToolFormat.NATIVE, '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g"}')
    assert [c.name for c in tagged.tool_calls] == ["f", "g"]
    mistral = parse_reply(ToolFormat.NATIVE, '[TOOL_CALLS][{"name": "h", "arguments": {"k": [1]}}]')
    assert [(c.name, c.arguments) for c in mistral.tool_calls] == [("h", '{"k":[1]}')]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (ToolFormat.TAGGED, "<tool_call>{not json</tool_call>"),
        (ToolFormat.TAGGED, '<tool_call>{"arguments": {}}</tool_call>'),
        (ToolFormat.NATIVE, '<|python_tag|>{"name": "f", "parameters": 3}'),
        (ToolFormat.TAGGED, "   "),
        (ToolFormat.ACTION, "Sure, the order ships today."),
    ],
)
def test_broken_calls_and_empty_replies_are_not_answers(fmt: ToolFormat, text: str) -> None:
    reply = parse_reply(fmt, text)
    assert not reply.valid
    assert not reply.is_final
    assert reply.tool_calls == ()


def test_a_json_answer_that_is_no_call_stays_an_answer() -> None:
    reply = parse_reply(ToolFormat.TAGGED, '{"status": "shipped"}')
    assert reply.is_final
    assert reply.text == '{"status": "shipped"}'


def test_a_native_template_renders_the_tools_it_is_given(tiny_dir: Path) -> None:
    policy = HFPolicy.load(tiny_dir, device=torch.device("cpu"), dtype=torch.float32)
    policy.tokenizer.chat_template = WITH_TOOLS
    native = HFPolicy(policy.model, policy.tokenizer)
    assert native.tool_format is ToolFormat.NATIVE
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    chat = [Message(role="user", content="hi")]
    assert '"name": "lookup"' in native.render(chat, [tool])
    assert "<tools>" not in native.render(chat)
    plain = HFPolicy(policy.model, policy.tokenizer, tool_format=ToolFormat.TAGGED)
    assert "<tools>" not in plain.render(chat, [tool])


def test_an_episode_gives_a_native_template_its_tools(tiny_dir: Path) -> None:
    policy = HFPolicy.load(tiny_dir, device=torch.device("cpu"), dtype=torch.float32)
    policy.tokenizer.chat_template = WITH_TOOLS
    native = HFPolicy(
        policy.model,
        policy.tokenizer,
        SamplingConfig(max_new_tokens=4, temperature=0, max_prompt_tokens=4096),
    )
    env = OrdersEnv(DomainConfig(train=2, dev=1, test=1))
    task = env.tasks(Split.TRAIN)[0]
    config = RolloutConfig(full_schemas=False, domain_policy=False, max_steps=1)
    with SessionStore.open("sqlite://") as store:
        asyncio.run(run_episodes(env, [EpisodeSpec(task, "n")], PolicyAgent(native), store, config))
        (call,) = store.get("n").llm_calls
    assert call.prompt_token_ids is not None
    prompt = native.tokenizer.decode(list(call.prompt_token_ids))
    rendered = prompt[prompt.index("<tools>") : prompt.index("</tools>")]
    names = sorted(c.name for c in env.contracts())
    assert [
        orjson.loads(t)["function"]["name"] for t in rendered[7:].replace("}{", "}\n{").split("\n")
    ] == names
    assert "Tools:" not in prompt  # the listing left the system message for the template
    assert call.messages[0].content == prompt_messages(env, task, config, ToolFormat.NATIVE)[0].content
    assert native.encode_prompt(call.messages) == list(call.prompt_token_ids)  # trained on as sampled


def test_the_gateway_reads_and_writes_the_backends_format() -> None:
    tools = [{"type": "function", "function": {"name": "search"}}]
    request = ChatRequest(messages=[{"role": "user", "content": "boots?"}], tools=tools)
    text, calls = read_action(
        '<tool_call>{"name": "search", "arguments": {"q": "boots"}}</tool_call>',
        request,
        seed="s",
        fmt=ToolFormat.TAGGED,
    )
    assert (text, [(c.name, c.arguments) for c in calls]) == ("", [("search", '{"q":"boots"}')])
    unknown = '<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>'
    assert read_action(unknown, request, seed="s", fmt=ToolFormat.TAGGED) == (unknown, ())
    assert read_action("They are in stock.", request, seed="s", fmt=ToolFormat.TAGGED) == (
        "They are in stock.",
        (),
    )
    asked = Message(
        role="assistant", content="", tool_calls=(ToolRequest(id="c1", name="search", arguments='{"q":"x"}'),)
    )
    assert policy_view(asked, ToolFormat.TAGGED).content == write_call(
        ToolFormat.TAGGED, "search", {"q": "x"}
    )


class TaggedScript(ScriptedBackend):
    """Scripted replies in the tagged format, as a pretrained model without tool support writes them."""

    tool_format = ToolFormat.TAGGED


def test_an_episode_runs_tagged_tool_calls_and_ends_on_plain_text() -> None:
    env = OrdersEnv(DomainConfig(train=6, dev=1, test=1))
    task = env.tasks(Split.TRAIN)[0]
    config = RolloutConfig(full_schemas=False, domain_policy=False, max_steps=12)
    with SessionStore.open("sqlite://") as store:
        (demo,) = asyncio.run(run_episodes(env, [EpisodeSpec(task, "x")], expert(env), store, config))
        shown = store.get(demo.session_id)
        script = [write_call(ToolFormat.TAGGED, c.tool, c.params) for c in shown.tool_calls]
        assert shown.final_output is not None
        script.append(shown.final_output.text)
        agent = PolicyAgent(TaggedScript(script))
        (ran,) = asyncio.run(run_episodes(env, [EpisodeSpec(task, "t")], agent, store, config))
        session = store.get("t")
    assert ran.success, ran.reason
    assert [(c.tool, c.params) for c in session.tool_calls] == [(c.tool, c.params) for c in shown.tool_calls]
    system = session.llm_calls[0].messages[0].content
    assert TAGGED_INSTRUCTIONS in system
    assert system == prompt_messages(env, task, config, ToolFormat.TAGGED)[0].content


def test_lockstep_rounds_speak_the_policys_format(tiny_dir: Path) -> None:
    from sessionrl.train.llm.lockstep import Lockstep

    policy = HFPolicy.load(tiny_dir, device=torch.device("cpu"), dtype=torch.float32)
    tagged = HFPolicy(policy.model, policy.tokenizer, tool_format=ToolFormat.TAGGED)
    assert tool_format_of(Lockstep(tagged, 1)) is ToolFormat.TAGGED
    assert tool_format_of(Lockstep(policy, 1)) is ToolFormat.ACTION
