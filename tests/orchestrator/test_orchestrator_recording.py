"""Record mode: LLM and tool steps the agent ran itself, recorded through the engine's guards and keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from orchestrator_support import MakeContract, MakeEngine

from sessionrl.errors import InvalidEvent
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.results import KeyReused, StepKind
from sessionrl.session import CallStatus, SessionCreate
from sessionrl.skills import callable_skill

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}},
    "required": ["order_id"],
}


@pytest.fixture
def engine(make_engine: MakeEngine, make_contract: MakeContract) -> Orchestrator:
    contract = make_contract(
        "find", input_schema=ORDER_SCHEMA, output_schema={"type": "object", "required": ["status"]}
    )
    ran: list[Any] = []
    return make_engine([callable_skill(contract, lambda p: ran.append(p) or {"status": "here"})])


REPLY = {
    "text": "",
    "tool_calls": [{"id": "call_1", "name": "find", "arguments": '{"order_id": "7"}'}],
    "model": "gpt-test",
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    "latency_ms": 42.0,
    "prompt_token_ids": [1, 2, 3],
    "token_ids": [4, 5],
    "logprobs": [-0.5, -0.25],
}


async def test_a_recorded_llm_step_keeps_everything_the_agent_reported(engine: Orchestrator) -> None:
    sid = await engine.init_session("where is order 7?")
    messages = [{"role": "user", "content": "where is order 7?"}]
    result = await engine.execute_step(
        sid, "llm", {"messages": messages, "reply": REPLY, "call_id": "cmpl-1"}
    )
    assert result.ok
    assert result.call_id == "cmpl-1"
    (call,) = (await engine.session(sid)).llm_calls
    assert call.recorded
    assert call.model == "gpt-test"
    assert call.usage["total_tokens"] == 15
    assert call.token_ids == (4, 5)
    assert call.logprobs == (-0.5, -0.25)
    assert call.prompt_token_ids == (1, 2, 3)
    assert call.tool_calls[0].name == "find"
    assert call.tokens_used == 15
    assert (call.finished_at - call.started_at).total_seconds() == pytest.approx(0.042)


async def test_a_recorded_llm_step_ends_when_the_agent_says_in_utc(engine: Orchestrator) -> None:
    sid = await engine.init_session("q")
    reply = {**REPLY, "finished_at": "2026-03-01T09:30:00.250+01:00"}
    assert (await engine.execute_step(sid, "llm", {"reply": reply})).ok
    (call,) = (await engine.session(sid)).llm_calls
    assert call.finished_at == datetime(2026, 3, 1, 8, 30, 0, 250000, tzinfo=UTC)
    assert call.finished_at.utcoffset() == timedelta(0)
    assert call.started_at == call.finished_at - timedelta(milliseconds=42)


async def test_a_failed_model_call_is_recorded_as_failed(engine: Orchestrator) -> None:
    sid = await engine.init_session("q")
    result = await engine.execute_step(sid, "llm", {"reply": {"error": "upstream 503"}})
    assert not result.ok
    assert result.error_message == "upstream 503"
    assert (await engine.session(sid)).llm_calls[0].status is CallStatus.ERROR


async def test_a_recorded_tool_call_runs_nothing_and_is_checked_against_its_contract(
    engine: Orchestrator,
) -> None:
    sid = await engine.init_session("q")
    good = {"tool": "find", "params": {"order_id": "7"}, "result": {"output": {"status": "here"}}}
    result = await engine.execute_step(sid, "tool", {**good, "call_id": "call_1"})
    assert result.ok
    assert result.call_id == "call_1"
    assert result.warnings == ()
    bad = {"tool": "find", "params": {"order": 7}, "result": {"output": {"nope": 1}, "latency_ms": 5}}
    broken = await engine.execute_step(sid, "tool", bad)
    assert broken.ok  # it did happen; the record says how it broke the contract
    assert any("params" in w and "order_id" in w for w in broken.warnings)
    assert any(w.startswith("contract: output") for w in broken.warnings)
    calls = (await engine.session(sid)).tool_calls
    assert all(c.recorded and not c.free_form for c in calls)
    assert calls[1].latency_ms == 5


async def test_unknown_tools_need_free_form_allowed(make_engine: MakeEngine, engine: Orchestrator) -> None:
    step = {"tool": "my_own_tool", "params": {}, "result": {"status": "error", "error_message": "boom"}}
    sid = await engine.init_session("q")
    with pytest.raises(InvalidEvent, match="free_form_tools"):
        await engine.execute_step(sid, "tool", step)
    assert (await engine.session(sid)).tool_calls == ()
    allowed = await engine.init_session(SessionCreate(user_query="q", metadata={"free_form_tools": True}))
    result = await engine.execute_step(allowed, "tool", step)
    assert not result.ok
    assert result.status is CallStatus.ERROR
    assert (await engine.session(allowed)).tool_calls[0].free_form
    server_wide = make_engine([], config=OrchestratorConfig(free_form_tools=True))
    sid = await server_wide.init_session("q")
    assert (await server_wide.execute_step(sid, "tool", step)).call_id is not None


async def test_a_retry_replays_and_a_different_body_with_the_key_is_refused(engine: Orchestrator) -> None:
    sid = await engine.init_session("q")
    step = {"tool": "find", "params": {"order_id": "7"}, "result": {"output": {"status": "here"}}}
    first = await engine.execute_step(sid, "tool", step, key="k1")
    assert await engine.execute_step(sid, "tool", step, key="k1") == first
    other = {**step, "params": {"order_id": "8"}}
    with pytest.raises(KeyReused, match="Idempotency-Key"):
        await engine.execute_step(sid, "tool", other, key="k1")
    assert len((await engine.session(sid)).tool_calls) == 1


async def test_a_key_reused_for_another_step_kind_is_refused_not_a_crash(engine: Orchestrator) -> None:
    sid = await engine.init_session("q")
    step = {"tool": "find", "params": {"order_id": "7"}, "result": {"output": {"status": "here"}}}
    await engine.execute_step(sid, StepKind.TOOL, step, key="k2")
    with pytest.raises(KeyReused):
        await engine.execute_step(sid, StepKind.LLM, {"reply": REPLY}, key="k2")
    named = {**step, "call_id": "call_9"}
    await engine.execute_step(sid, StepKind.TOOL, named, key="k3")
    with pytest.raises(KeyReused):  # the session shows no call of the key's own ids: the log still tells
        await engine.execute_step(sid, StepKind.LLM, {"reply": REPLY}, key="k3")
    session = await engine.session(sid)
    assert len(session.tool_calls) == 2
    assert session.llm_calls == ()
