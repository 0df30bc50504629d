"""The tool-call head: masking, training on a tiny LM's states, forced prefixes, examples from sessions."""

from __future__ import annotations

import asyncio
import doctest
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch

from research import toolhead
from research.toolhead import (
    FINAL,
    HeadGuide,
    ToolHead,
    accuracy,
    fit_tool_head,
    prompt_states,
    tool_examples,
)
from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import EpisodeSpec, RolloutConfig, run_episodes
from sessionrl.episodes.llm import PolicyAgent
from sessionrl.orchestrator.policy import ScriptedBackend
from sessionrl.policy.llm import HFPolicy, SamplingConfig, final_action, tool_action
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.policy.toolcalls import ToolFormat
from sessionrl.session.model import CallPurpose, LLMCall, Message, Session
from sessionrl.store import SessionStore

CONFIG = TinyModelConfig(vocab_size=300, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
TOOLS = ("inventory_check", "refund_trigger")


def chat(question: str) -> tuple[Message, ...]:
    return (Message(role="system", content="You help."), Message(role="user", content=question))


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> HFPolicy:
    texts = [tool_action(t, {"sku": f"S-{i}"}) for t in TOOLS for i in range(20)]
    texts += [final_action("done"), "Is it in stock? Refund me please."]
    folder: Path = tmp_path_factory.mktemp("toolhead-llm")
    build_tiny_policy(texts, CONFIG, folder)
    return HFPolicy.load(folder, SamplingConfig(), device=torch.device("cpu"), dtype=torch.float32)  # type: ignore[arg-type]


def test_doctests_pass() -> None:
    assert doctest.testmod(toolhead).failed == 0


def test_masked_classes_get_probability_zero_and_final_stays_allowed() -> None:
    head = ToolHead(4, TOOLS)
    mask = head.mask([["refund_trigger"], []])
    assert mask.tolist() == [[False, True, True], [False, False, True]]
    probs = head(torch.randn(2, 4), mask).softmax(-1)
    assert probs[~mask].eq(0).all()
    assert probs[1, 2].item() == pytest.approx(1.0)


def test_the_head_learns_the_tool_from_the_lm_state(policy: HFPolicy) -> None:
    questions = {
        "Is it in stock?": "inventory_check",
        "Refund me please.": "refund_trigger",
        "Thanks!": FINAL,
    }
    prompts = [policy.encode_prompt(chat(q)) for q in questions]
    states = prompt_states(policy, prompts)
    assert states.shape == (3, CONFIG.hidden_size)
    head = ToolHead(CONFIG.hidden_size, TOOLS)
    # a random tiny LM puts the three prompts close together (distances ~0.1 at norm 4): a large step
    losses = fit_tool_head(head, states, list(questions.values()), epochs=300, lr=1.0)
    assert losses[-1] < 0.1 * losses[0]
    chosen = [head.classes[i] for i in head(states).argmax(-1).tolist()]
    assert accuracy(chosen, list(questions.values())) == 1.0
    # a mask overrides the head: with only finish allowed, every row answers
    only_final = head(states, head.mask([[], [], []])).argmax(-1)
    assert only_final.tolist() == [2, 2, 2]


def test_prompt_states_ignore_left_padding(policy: HFPolicy) -> None:
    short, long = (policy.encode_prompt(chat(q)) for q in ("Hi", "Is SKU 12 in stock, and refund it?"))
    alone = prompt_states(policy, [short])
    batched = prompt_states(policy, [short, long])
    assert torch.allclose(alone[0], batched[0], atol=1e-5)


def test_the_guide_imposes_the_heads_tool_before_the_lm_writes(policy: HFPolicy) -> None:
    messages = chat("Is it in stock?")
    head = ToolHead(CONFIG.hidden_size, TOOLS)
    with torch.no_grad():  # a head that always prefers refund_trigger, unless a mask forbids it
        head.score.weight.zero_()
        head.score.bias.copy_(torch.tensor([0.0, 5.0, 1.0]))
    allowed: list[str] = ["refund_trigger"]
    guided = policy.view(SamplingConfig(temperature=0.0, max_new_tokens=6))
    guided.guide = HeadGuide(guided, head, allowed=lambda _: allowed)
    plain = policy.encode_prompt(messages)
    ids, start = guided.guided_prompt(messages)
    assert start == '{"tool":"refund_trigger","params'
    # the cut falls where the tokenizer splits the whole reply, so the prompt holds the reply's own tokens
    whole = guided.tokenizer.encode(tool_action("refund_trigger", {"sku": "S"}), add_special_tokens=False)
    assert ids[len(plain) :] == whole[: len(ids) - len(plain)]
    assert ids[: len(plain)] == plain
    assert guided.tokenizer.decode(ids[len(plain) :]) == start
    [reply] = guided.generate_now([messages])
    assert reply.text.startswith(start)
    assert reply.prompt_token_ids == tuple(ids)
    allowed.clear()  # nothing allowed but final: the mask overrides the head's preference
    [reply] = guided.generate_now([messages])
    assert reply.text.startswith('{"final')
    assert policy.guide is None  # the guide sits on the view only


def test_examples_come_from_step_calls_whose_reply_is_an_action() -> None:
    now = datetime.now(UTC)
    messages = chat("Is it in stock?")
    calls = (
        LLMCall(call_id="1", messages=messages, response=tool_action("inventory_check", {"sku": "S"})),
        LLMCall(call_id="2", messages=messages, response="not an action"),
        LLMCall(call_id="3", purpose="judge", messages=messages, response=final_action("ok")),
        LLMCall(call_id="4", messages=messages, response=final_action("done")),
    )
    session = Session(
        session_id="s", trace_id="t", user_query="q", llm_calls=calls, created_at=now, updated_at=now
    )
    assert [e.label for e in tool_examples([session])] == ["inventory_check", FINAL]
    with pytest.raises(ValueError, match="as many"):
        accuracy(["a"], ["a", "b"])


def test_examples_come_from_a_real_episodes_calls(tmp_path: Path) -> None:
    """An episode's policy calls are tagged `act`: the head learns from them as from orchestrator steps."""
    env = OrdersEnv(DomainConfig(train=1, dev=0, test=0, time_factor=0, transient_failures=False))
    (task,) = env.tasks(Split.TRAIN)
    first = env.expert(task).steps[0]
    backend = ScriptedBackend([tool_action(first.tool, dict(first.params)), final_action("done")])
    with SessionStore.open(f"sqlite:///{tmp_path / 's.db'}") as store:
        spec = EpisodeSpec(task, "real")
        (ran,) = asyncio.run(run_episodes(env, [spec], PolicyAgent(backend), store, RolloutConfig()))
        session = store.get(ran.session_id)
    assert {c.purpose for c in session.llm_calls} == {CallPurpose.ACT}
    assert [e.label for e in tool_examples([session])] == [first.tool, FINAL]


def test_the_guide_refuses_a_policy_that_does_not_speak_the_action_language(policy: HFPolicy) -> None:
    tagged = HFPolicy(policy.model, policy.tokenizer, SamplingConfig(), tool_format=ToolFormat.TAGGED)
    with pytest.raises(ValueError, match="action language"):
        HeadGuide(tagged, ToolHead(CONFIG.hidden_size, TOOLS))
