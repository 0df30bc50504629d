"""A tool output may be any JSON value: executed, recorded in the session, stored, read back equal, and
shown to the policy (and its value references) as it was returned."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.policy import act_messages
from sessionrl.policy.llm import tool_message
from sessionrl.policy.references import Context, resolve
from sessionrl.session import CallStatus, Session, ToolCall
from sessionrl.session.codec import dumps
from sessionrl.session.schema import load_session
from sessionrl.skills import ExecutorConfig, ManualClock, SkillContract, SkillExecutor, callable_skill
from sessionrl.store import SessionStore

OUTPUTS: list[Any] = [[1, 2], "ok", 7, None, [{"order_id": "#W1", "items": ["a", "b"]}], {"kept": "dict"}]


def contract(name: str) -> SkillContract:
    return SkillContract.model_validate(
        {"name": name, "description": f"The {name} skill.", "input_schema": {"type": "object"}}
    )


@pytest.fixture
async def engine() -> AsyncIterator[Orchestrator]:
    skills = [
        callable_skill(contract(f"tool{i}"), lambda params, value=value: value)
        for i, value in enumerate(OUTPUTS)
    ]
    with SessionStore.open("sqlite://") as store:
        executor = SkillExecutor(skills, ExecutorConfig(max_attempts=1), clock=ManualClock())
        engine = Orchestrator(store, executor)
        yield engine
        await engine.aclose()


@pytest.mark.parametrize("value", [[1, 2], "ok", None, {"a": [1, {"b": None}]}, 2.5])
def test_a_tool_call_keeps_any_json_output_through_its_document(value: Any) -> None:
    call = ToolCall(call_id="c1", tool="t", output=value, status=CallStatus.SUCCESS)
    again = ToolCall.model_validate(orjson.loads(dumps(call)))
    assert again == call
    assert again.output == value


async def test_outputs_of_every_json_kind_are_stored_and_read_back_equal(engine: Orchestrator) -> None:
    sid = await engine.init_session("look things up")
    for i, value in enumerate(OUTPUTS):
        step = await engine.execute_step(sid, "tool", {"tool": f"tool{i}"})
        assert step.ok, step
        assert step.output == value
    session = await engine.session(sid)
    assert [c.output for c in session.tool_calls] == OUTPUTS
    stored = engine.store.get(sid)
    assert [c.output for c in stored.tool_calls] == OUTPUTS
    assert load_session(orjson.loads(dumps(stored))) == stored  # the stored document reads back equal


async def test_the_policy_sees_list_and_string_outputs_as_returned(engine: Orchestrator) -> None:
    sid = await engine.init_session("look things up")
    for i in range(2):
        await engine.execute_step(sid, "tool", {"tool": f"tool{i}"})
    session: Session = await engine.session(sid)
    shown = [
        orjson.loads(m.content) for m in act_messages(session, engine.executor.contracts) if m.role == "tool"
    ]
    assert [m["output"] for m in shown] == [[1, 2], "ok"]
    message = tool_message(tool="lookup", ok=True, output=[{"order_id": "#W1"}])
    context = Context.from_messages([message])
    assert resolve({"order_id": "{{lookup.0.order_id}}"}, context) == {"order_id": "#W1"}
    said = Context.of("", [("status", "ok")])
    assert resolve("status was {{status}}", said) == "status was ok"
