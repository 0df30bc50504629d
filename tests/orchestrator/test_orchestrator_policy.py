"""Reading policy text as plans and tool calls, and the scripted backend."""

from __future__ import annotations

import pytest

from sessionrl.orchestrator.policy import (
    PolicyError,
    PolicyReply,
    ScriptedBackend,
    parse_plan,
    parse_tool_call,
)
from sessionrl.session import Message


def test_a_plan_wrapped_in_prose_and_a_fence_is_read() -> None:
    text = 'Here is my plan:\n```json\n{"root_goal": "r", "subgoals": [{"id": "a", "description": "d"}]}\n```'
    plan = parse_plan(text)
    assert plan is not None
    assert plan.root_goal == "r"
    assert [g.id for g in plan.subgoals] == ["a"]


@pytest.mark.parametrize(
    "text",
    ["", "no json", "{broken", '{"root_goal": 3}', '{"subgoals": []}', "} {"],
)
def test_text_that_is_not_a_plan_gives_none(text: str) -> None:
    assert parse_plan(text) is None


def test_a_tool_call_is_read_with_its_params_and_sub_goal() -> None:
    choice = parse_tool_call('{"tool": "find", "params": {"id": 7}, "subgoal_id": "a"}')
    assert choice is not None
    assert (choice.tool, choice.params, choice.subgoal_id) == ("find", {"id": 7}, "a")
    assert parse_tool_call('{"params": {}}') is None
    assert parse_tool_call('{"tool": "x", "extra": 1}') is None


async def test_the_scripted_backend_answers_in_order_then_fails() -> None:
    tokens = PolicyReply(text="two", token_ids=(5, 6), logprobs=(-0.1, -0.2), policy_version=9)
    backend = ScriptedBackend(["one", tokens], policy_version=4)
    hello = (Message(role="user", content="hi"),)
    first = await backend.generate(hello, purpose="plan")
    second = await backend.generate(hello, purpose="step")
    assert (first.text, first.policy_version) == ("one", 4)
    assert second == tokens
    assert [purpose for _, purpose in backend.calls] == ["plan", "step"]
    with pytest.raises(PolicyError, match="no reply left"):
        await backend.generate(hello, purpose="step")
