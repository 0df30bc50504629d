"""The executor: validation, clipping, timeouts, retries, error mapping, output checks and fallback.

Backoff sleeps on a ManualClock, so no test here waits for it on the wall clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from skills_support import EXAMPLES, ContractFactory, Script

from sessionrl.skills import (
    ErrorCode,
    ExecutorConfig,
    ManualClock,
    SkillExecutor,
    callable_skill,
    load_contract,
    simulated_skill,
)

OK = {"total": 1.0}
NO_JITTER = ExecutorConfig(jitter_s=0.0)
MakeScript = Callable[..., Script]


async def test_invalid_params_name_the_field_and_the_rule(make_contract: ContractFactory, script: MakeScript):
    fn = script(OK)
    executor = SkillExecutor([callable_skill(make_contract(), fn)])
    result = await executor.call("probe", {"amount": 500, "unit": "kg"})
    assert result.error_code == ErrorCode.INVALID_PARAMS
    assert result.error_message == (
        "amount: 500 is greater than the maximum of 120; unit: 'kg' is not one of ['mg', 'ml']"
    )
    assert (result.retryable, result.attempts, fn.calls) == (False, 0, 0)


async def test_missing_required_field_is_reported_at_the_root():
    contract = load_contract(EXAMPLES / "crp_test_request.yaml")
    executor = SkillExecutor([simulated_skill(contract)])
    result = await executor.call("crp_test_request", {"priority": "asap"})
    assert result.error_message is not None
    assert "params: 'patient_id' is a required property" in result.error_message
    assert "priority: 'asap' is not one of ['routine', 'urgent', 'stat']" in result.error_message


async def test_defaults_are_filled_before_the_skill_runs(make_contract: ContractFactory, script: MakeScript):
    fn = script(OK)
    result = await SkillExecutor([callable_skill(make_contract(), fn)]).call("probe", {"amount": 5})
    assert result.ok
    assert fn.seen == [{"amount": 5, "unit": "mg"}]


async def test_clipping_moves_numbers_to_the_bound_and_warns(
    make_contract: ContractFactory, script: MakeScript
):
    fn = script(OK)
    executor = SkillExecutor([callable_skill(make_contract(), fn)], ExecutorConfig(clip=True))
    result = await executor.call("probe", {"amount": 500})
    assert result.ok
    assert fn.seen[0]["amount"] == 120
    assert result.warnings == ("amount: 500 clipped to the maximum of 120",)


async def test_a_slow_skill_times_out(make_contract: ContractFactory):
    async def slow(params: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(30)
        return OK

    contract = make_contract(sla={"timeout_s": 0.05})
    executor = SkillExecutor([callable_skill(contract, slow)], ExecutorConfig(max_attempts=1))
    result = await executor.call("probe", {"amount": 1})
    assert (result.error_code, result.retryable, result.attempts) == (ErrorCode.TIMEOUT, True, 1)


async def test_time_factor_scales_the_timeout(make_contract: ContractFactory):
    """A 10 s contract timeout at time_factor 0.005 is 50 ms of wall time, shorter than the skill's 30 s."""

    async def slow(params: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(30)
        return OK

    contract = make_contract(sla={"timeout_s": 10.0})
    config = ExecutorConfig(max_attempts=1, time_factor=0.005)
    result = await SkillExecutor([callable_skill(contract, slow)], config).call("probe", {"amount": 1})
    assert result.error_code == ErrorCode.TIMEOUT


async def test_a_simulated_latency_past_the_timeout_is_a_timeout_on_the_clock(
    make_contract: ContractFactory, clock: ManualClock
):
    contract = make_contract(sla={"timeout_s": 1.0}, simulation={"mean_ms": 5000})
    executor = SkillExecutor([simulated_skill(contract)], ExecutorConfig(max_attempts=1), clock=clock)
    result = await executor.call("probe", {"amount": 1})
    assert result.error_code == ErrorCode.TIMEOUT
    assert result.latency_ms == 5000.0


async def test_retryable_failures_are_retried_with_exponential_backoff(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    fn = script("FLAKY", "FLAKY", OK)
    executor = SkillExecutor([callable_skill(make_contract(), fn)], NO_JITTER, clock=clock)
    result = await executor.call("probe", {"amount": 1})
    assert result.ok
    assert (result.attempts, fn.calls) == (3, 3)
    # backoff after attempt n is 0.1 · 2^(n-1): 0.1 s + 0.2 s = 0.3 s on the clock
    assert clock.now() == pytest.approx(0.3)
    assert result.latency_ms == pytest.approx(300.0)


async def test_jitter_is_seeded(make_contract: ContractFactory, script: MakeScript):
    async def elapsed(seed: int) -> float:
        clock = ManualClock()
        skill = callable_skill(make_contract(), script("FLAKY", OK))
        await SkillExecutor([skill], ExecutorConfig(seed=seed), clock=clock).call("probe", {"amount": 1})
        return clock.now()

    first, again, other = await elapsed(1), await elapsed(1), await elapsed(2)
    assert first == again != other
    assert 0.1 <= first <= 0.2  # 0.1 s base plus jitter drawn from [0, 0.1]


async def test_retries_stop_after_max_attempts(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    fn = script("FLAKY")
    executor = SkillExecutor(
        [callable_skill(make_contract(), fn)], ExecutorConfig(max_attempts=4), clock=clock
    )
    result = await executor.call("probe", {"amount": 1})
    assert (result.error_code, result.retryable, result.attempts, fn.calls) == ("FLAKY", True, 4, 4)


async def test_backoff_keeps_doubling_across_every_retry(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    fn = script("FLAKY", "FLAKY", "FLAKY", "FLAKY")
    config = ExecutorConfig(max_attempts=4, jitter_s=0.0, backoff_max_s=0.3)
    result = await SkillExecutor([callable_skill(make_contract(), fn)], config, clock=clock).call(
        "probe", {"amount": 1}
    )
    assert (result.attempts, fn.calls) == (4, 4)
    # waits after attempts 1, 2, 3: min(0.3, 0.1 · 2^(n-1)) = 0.1 + 0.2 + 0.3 (capped) = 0.6 s
    assert clock.now() == pytest.approx(0.6)


async def test_non_retryable_failures_are_not_retried(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    fn = script("BROKEN", OK)
    result = await SkillExecutor([callable_skill(make_contract(), fn)], clock=clock).call(
        "probe", {"amount": 1}
    )
    assert (result.error_code, result.retryable, result.attempts, fn.calls) == ("BROKEN", False, 1, 1)
    assert result.error_message == "scripted failure 1"


async def test_a_contract_can_make_timeouts_non_retryable(make_contract: ContractFactory, clock: ManualClock):
    calls = 0

    async def slow(params: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(30)
        return OK

    contract = make_contract(sla={"timeout_s": 0.02}, errors={"TIMEOUT": {"retryable": False}})
    result = await SkillExecutor([callable_skill(contract, slow)], clock=clock).call("probe", {"amount": 1})
    assert (result.error_code, result.retryable, calls) == (ErrorCode.TIMEOUT, False, 1)


async def test_unexpected_exceptions_become_internal_errors(
    make_contract: ContractFactory, clock: ManualClock
):
    def broken(params: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("dose")

    result = await SkillExecutor([callable_skill(make_contract(), broken)], clock=clock).call(
        "probe", {"amount": 1}
    )
    assert (result.error_code, result.attempts) == (ErrorCode.INTERNAL, 1)
    assert result.error_message == "KeyError: 'dose'"


async def test_an_answer_that_breaks_the_output_schema_is_invalid_output(
    make_contract: ContractFactory, script: MakeScript
):
    result = await SkillExecutor([callable_skill(make_contract(), script({"sum": 3}))]).call(
        "probe", {"amount": 1}
    )
    assert result.error_code == ErrorCode.INVALID_OUTPUT
    assert result.error_message == "output: 'total' is a required property"


async def test_an_unknown_skill_is_an_error_result():
    result = await SkillExecutor([]).call("nope", {})
    assert (result.skill, result.error_code, result.attempts) == ("nope", ErrorCode.UNKNOWN_SKILL, 0)


async def test_stats_count_calls_failures_and_latency(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    contract = make_contract(simulation={"mean_ms": 100})
    executor = SkillExecutor([simulated_skill(contract)], clock=clock)
    for _ in range(3):
        assert (await executor.call("probe", {"amount": 1})).ok
    await executor.call("probe", {"amount": -1})
    stats = executor.stats("probe")
    assert (stats.calls, stats.failures, stats.errors_by_code) == (4, 1, {ErrorCode.INVALID_PARAMS: 1})
    # nearest-rank p95 of [100, 100, 100, 0] ms is the 4th smallest: 100 ms
    assert stats.p95_latency_ms == pytest.approx(100.0)
    assert stats.failure_rate == 0.25
