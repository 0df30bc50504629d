"""Executor faults as the engine records them: each becomes a tool call with its status and error code."""

from __future__ import annotations

from typing import Any

from orchestrator_support import MakeContract, MakeEngine

from sessionrl.orchestrator.guards import Refusal
from sessionrl.session import CallStatus
from sessionrl.skills import ManualClock, SkillError, callable_skill, simulated_skill


class Failing:
    """Fails with `code` for the first `failures` calls, then answers; counts its calls."""

    def __init__(self, code: str, failures: int) -> None:
        self.code = code
        self.failures = failures
        self.calls = 0

    def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise SkillError(self.code, f"failure {self.calls}")
        return {"call": self.calls}


async def test_a_timeout_is_recorded_as_a_timed_out_call(
    make_engine: MakeEngine, make_contract: MakeContract
) -> None:
    # the simulated skill sleeps 5 s on the manual clock; the contract allows 1 s
    slow = make_contract("slow", sla={"timeout_s": 1.0}, simulation={"mean_ms": 5000})
    engine = make_engine([simulated_skill(slow)], max_attempts=2)
    sid = await engine.init_session("q")
    result = await engine.execute_step(sid, "tool", {"tool": "slow"})
    assert not result.ok
    assert (result.status, result.error_code, result.retryable) == (CallStatus.TIMEOUT, "TIMEOUT", True)
    (call,) = (await engine.session(sid)).tool_calls
    assert (call.status, call.error_code, call.attempt) == (CallStatus.TIMEOUT, "TIMEOUT", 2)


async def test_retry_exhaustion_records_every_attempt(
    make_engine: MakeEngine, make_contract: MakeContract
) -> None:
    flaky = Failing("FLAKY", failures=10)
    contract = make_contract("flaky", errors={"FLAKY": {"retryable": True}})
    engine = make_engine([callable_skill(contract, flaky)], max_attempts=3)
    sid = await engine.init_session("q")
    result = await engine.execute_step(sid, "tool", {"tool": "flaky"})
    assert (result.status, result.error_code, result.retryable, result.attempts) == (
        CallStatus.ERROR,
        "FLAKY",
        True,
        3,
    )
    assert flaky.calls == 3
    assert (await engine.session(sid)).tool_calls[0].attempt == 3


async def test_an_open_breaker_masks_the_skill_until_it_recovers(
    make_engine: MakeEngine, make_contract: MakeContract, clock: ManualClock
) -> None:
    broken = Failing("BROKEN", failures=2)
    breaker = {"failure_rate": 0.5, "window": 2, "min_calls": 2, "cooldown_s": 10}
    contract = make_contract("fragile", errors={"BROKEN": {"retryable": False}}, sla={"breaker": breaker})
    engine = make_engine([callable_skill(contract, broken)])
    sid = await engine.init_session("q")
    for _ in range(2):
        assert (await engine.execute_step(sid, "tool", {"tool": "fragile"})).error_code == "BROKEN"
    refused = await engine.execute_step(sid, "tool", {"tool": "fragile"})
    assert refused.refused is Refusal.MASKED_SKILL
    assert refused.status is CallStatus.REFUSED
    assert refused.masked == ("fragile",)
    assert broken.calls == 2  # the refused step never reached the skill
    clock.advance(10)  # the cool-down passes: one probe call is let through, and it succeeds
    recovered = await engine.execute_step(sid, "tool", {"tool": "fragile"})
    assert recovered.ok
    assert recovered.masked == ()
    statuses = [c.status for c in (await engine.session(sid)).tool_calls]
    assert statuses == [CallStatus.ERROR, CallStatus.ERROR, CallStatus.REFUSED, CallStatus.SUCCESS]


async def test_a_rate_limited_call_is_recorded_with_its_code(
    make_engine: MakeEngine, make_contract: MakeContract
) -> None:
    calls = Failing("UNUSED", failures=0)
    contract = make_contract(
        "limited", sla={"timeout_s": 1.0, "rate_limit": {"max_calls": 1, "period_s": 100}}
    )
    engine = make_engine([callable_skill(contract, calls)], max_attempts=1)
    sid = await engine.init_session("q")
    assert (await engine.execute_step(sid, "tool", {"tool": "limited"})).ok
    limited = await engine.execute_step(sid, "tool", {"tool": "limited"})
    assert (limited.status, limited.error_code, limited.retryable) == (CallStatus.ERROR, "RATE_LIMITED", True)
    assert calls.calls == 1


async def test_a_fallback_is_recorded_under_the_skill_that_served(
    make_engine: MakeEngine, make_contract: MakeContract
) -> None:
    primary = make_contract("primary", errors={"BROKEN": {"retryable": False}}, fallback="backup")
    engine = make_engine(
        [
            callable_skill(primary, Failing("BROKEN", failures=99)),
            callable_skill(make_contract("backup"), lambda p: {"from": "backup"}),
        ]
    )
    sid = await engine.init_session("q")
    result = await engine.execute_step(sid, "tool", {"tool": "primary"})
    assert result.ok
    assert (result.tool, result.output) == ("backup", {"from": "backup"})
    assert any("primary failed with BROKEN" in w for w in result.warnings)
    (call,) = (await engine.session(sid)).tool_calls
    assert (call.tool, call.status) == ("backup", CallStatus.SUCCESS)


async def test_bad_parameters_and_unknown_skills_are_recorded_errors(
    make_engine: MakeEngine, make_contract: MakeContract
) -> None:
    strict = make_contract("strict", input_schema={"type": "object", "required": ["id"]})
    engine = make_engine([callable_skill(strict, lambda p: {})])
    sid = await engine.init_session("q")
    bad = await engine.execute_step(sid, "tool", {"tool": "strict", "params": {}})
    unknown = await engine.execute_step(sid, "tool", {"tool": "nope"})
    assert (bad.error_code, unknown.error_code) == ("INVALID_PARAMS", "UNKNOWN_SKILL")
    assert "id" in str(bad.error_message)
    assert [c.status for c in (await engine.session(sid)).tool_calls] == [CallStatus.ERROR, CallStatus.ERROR]
