"""Circuit breakers, rate limits, concurrency caps and fallbacks, timed on a ManualClock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from skills_support import ContractFactory, Script

from sessionrl.skills import (
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    ErrorCode,
    ExecutorConfig,
    ManualClock,
    SkillExecutor,
    callable_skill,
)
from sessionrl.skills.breaker import Permit

OK = {"total": 1.0}
ONCE = ExecutorConfig(max_attempts=1)
MakeScript = Callable[..., Script]
BREAKER = {"breaker": {"failure_rate": 0.5, "window": 4, "min_calls": 4, "cooldown_s": 10.0}}


async def test_breaker_opens_fails_fast_masks_probes_and_recovers(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    fn = script(OK, OK, "BROKEN", "BROKEN", "BROKEN", OK)
    executor = SkillExecutor([callable_skill(make_contract(sla=BREAKER), fn)], ONCE, clock=clock)
    for _ in range(4):  # 2 failures of 4 calls reach the 0.5 failure rate
        await executor.call("probe", {"amount": 1})
    assert executor.breaker_state("probe") is BreakerState.OPEN
    assert executor.masked() == frozenset({"probe"})

    refused = await executor.call("probe", {"amount": 1})
    assert (refused.error_code, refused.attempts, fn.calls) == (ErrorCode.BREAKER_OPEN, 1, 4)

    clock.advance(10.0)  # cool-down over: one probe may pass
    assert executor.breaker_state("probe") is BreakerState.HALF_OPEN
    assert executor.masked() == frozenset()
    failed_probe = await executor.call("probe", {"amount": 1})
    assert (failed_probe.error_code, fn.calls) == ("BROKEN", 5)
    assert executor.breaker_state("probe") is BreakerState.OPEN  # a failed probe re-opens for a new cool-down

    clock.advance(10.0)
    assert (await executor.call("probe", {"amount": 1})).ok
    assert executor.breaker_state("probe") is BreakerState.CLOSED
    assert executor.masked() == frozenset()
    assert (await executor.call("probe", {"amount": 1})).ok


async def test_only_one_probe_passes_while_half_open(make_contract: ContractFactory):
    clock, release, runs = ManualClock(), asyncio.Event(), []

    async def gated(params: dict[str, Any]) -> dict[str, Any]:
        runs.append(params)
        if len(runs) > 4:
            await release.wait()
            return OK
        raise ValueError("down")

    executor = SkillExecutor([callable_skill(make_contract(sla=BREAKER), gated)], ONCE, clock=clock)
    for _ in range(4):
        await executor.call("probe", {"amount": 1})
    clock.advance(10.0)
    probe = asyncio.create_task(executor.call("probe", {"amount": 1}))
    await asyncio.sleep(0)
    assert executor.masked() == frozenset({"probe"})  # the probe holds the only slot
    assert (await executor.call("probe", {"amount": 2})).error_code == ErrorCode.BREAKER_OPEN
    release.set()
    assert (await probe).ok
    assert executor.breaker_state("probe") is BreakerState.CLOSED


async def test_refusals_and_bad_parameters_do_not_count_against_the_breaker(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    executor = SkillExecutor([callable_skill(make_contract(sla=BREAKER), script(OK))], ONCE, clock=clock)
    for _ in range(10):
        assert (await executor.call("probe", {"amount": -5})).error_code == ErrorCode.INVALID_PARAMS
    assert executor.breaker_state("probe") is BreakerState.CLOSED


def test_breaker_window_slides_and_needs_min_calls():
    clock = ManualClock()
    breaker = CircuitBreaker(BreakerPolicy(failure_rate=0.5, window=4, min_calls=3, cooldown_s=5), clock)
    for ok in (False, True):
        breaker.record(breaker.allow(), ok=ok)
    assert breaker.state is BreakerState.CLOSED  # 1 failure of 2 calls: under min_calls
    for ok in (True, True, True, False):  # window now [True, True, True, False]: 25 %
        breaker.record(breaker.allow(), ok=ok)
    assert (breaker.state, breaker.failure_rate) == (BreakerState.CLOSED, 0.25)
    breaker.record(breaker.allow(), ok=False)  # window [True, True, False, False]: 50 %
    assert breaker.state is BreakerState.OPEN


def test_an_abandoned_probe_frees_the_slot_for_the_next():
    clock = ManualClock()
    breaker = CircuitBreaker(BreakerPolicy(failure_rate=1.0, window=1, min_calls=1, cooldown_s=5), clock)
    breaker.record(breaker.allow(), ok=False)
    clock.advance(5)
    assert breaker.allow() is Permit.PROBE
    assert breaker.allow() is None
    breaker.record(Permit.PROBE, ok=None)  # cancelled before it answered
    assert breaker.allow() is Permit.PROBE


async def test_rate_limit_spaces_calls_on_the_clock(make_contract: ContractFactory, clock: ManualClock):
    started: list[float] = []

    def stamp(params: dict[str, Any]) -> dict[str, Any]:
        started.append(clock.now())
        return OK

    contract = make_contract(sla={"rate_limit": {"max_calls": 2, "period_s": 1.0}, "timeout_s": 5.0})
    executor = SkillExecutor([callable_skill(contract, stamp)], clock=clock)
    results = await asyncio.gather(*(executor.call("probe", {"amount": 1}) for _ in range(6)))
    assert all(r.ok for r in results)
    # a burst of 2, then one token per 1 / (2 per s) = 0.5 s
    assert started == pytest.approx([0.0, 0.0, 0.5, 1.0, 1.5, 2.0])


async def test_rate_limit_refuses_a_call_that_would_wait_past_the_timeout(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    fn = script(OK)
    contract = make_contract(sla={"rate_limit": {"max_calls": 1, "period_s": 100.0}, "timeout_s": 1.0})
    executor = SkillExecutor([callable_skill(contract, fn)], ONCE, clock=clock)
    assert (await executor.call("probe", {"amount": 1})).ok
    limited = await executor.call("probe", {"amount": 1})
    assert (limited.error_code, limited.retryable, fn.calls, clock.now()) == (
        ErrorCode.RATE_LIMITED,
        True,
        1,
        0.0,
    )
    assert executor.breaker_state("probe") is BreakerState.CLOSED


async def _peak_in_flight(executor_for: Callable[[Callable[..., Any]], SkillExecutor], calls: int) -> int:
    in_flight = peak = 0

    async def busy(params: dict[str, Any]) -> dict[str, Any]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        for _ in range(5):
            await asyncio.sleep(0)
        in_flight -= 1
        return OK

    executor = executor_for(busy)
    results = await asyncio.gather(*(executor.call("probe", {"amount": 1}) for _ in range(calls)))
    assert all(r.ok for r in results)
    return peak


async def test_max_concurrency_caps_calls_in_flight(make_contract: ContractFactory):
    capped = make_contract(sla={"max_concurrency": 2})
    assert await _peak_in_flight(lambda fn: SkillExecutor([callable_skill(capped, fn)]), 6) == 2
    assert await _peak_in_flight(lambda fn: SkillExecutor([callable_skill(make_contract(), fn)]), 6) == 6


async def test_a_cancelled_call_gives_its_concurrency_slot_back(make_contract: ContractFactory):
    gate = asyncio.Event()

    async def waits(params: dict[str, Any]) -> dict[str, Any]:
        if params["amount"] == 1:
            await gate.wait()
        return OK

    executor = SkillExecutor([callable_skill(make_contract(sla={"max_concurrency": 1}), waits)])
    stuck = asyncio.create_task(executor.call("probe", {"amount": 1}))
    await asyncio.sleep(0)
    stuck.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert (await executor.call("probe", {"amount": 2})).ok


async def test_fallback_serves_when_the_primary_fails(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    primary = callable_skill(make_contract(name="primary", fallback="backup"), script("BROKEN"))
    backup_fn = script({"total": 2.0})
    executor = SkillExecutor([primary, callable_skill(make_contract(name="backup"), backup_fn)], clock=clock)
    result = await executor.call("primary", {"amount": 1})
    assert result.ok
    assert (result.skill, result.fallback_from, result.output) == ("backup", "primary", {"total": 2.0})
    assert result.warnings == ("primary failed with BROKEN: scripted failure 1",)
    assert (executor.stats("primary").failures, executor.stats("backup").calls) == (1, 1)


async def test_fallback_also_serves_while_the_breaker_is_open(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    primary_fn = script("BROKEN")
    primary = callable_skill(make_contract(name="primary", fallback="backup", sla=BREAKER), primary_fn)
    executor = SkillExecutor(
        [primary, callable_skill(make_contract(name="backup"), script(OK))], ONCE, clock=clock
    )
    for _ in range(5):
        result = await executor.call("primary", {"amount": 1})
        assert (result.ok, result.skill) == (True, "backup")
    assert primary_fn.calls == 4
    assert "primary failed with BREAKER_OPEN" in result.warnings[0]


async def test_no_fallback_for_bad_parameters_and_a_failing_fallback_is_reported(
    make_contract: ContractFactory, script: MakeScript, clock: ManualClock
):
    backup_fn = script("BROKEN")
    primary = callable_skill(make_contract(name="primary", fallback="backup"), script("BROKEN"))
    executor = SkillExecutor([primary, callable_skill(make_contract(name="backup"), backup_fn)], clock=clock)
    invalid = await executor.call("primary", {"amount": 999})
    assert (invalid.skill, invalid.error_code, invalid.fallback_from, backup_fn.calls) == (
        "primary",
        ErrorCode.INVALID_PARAMS,
        None,
        0,
    )
    both = await executor.call("primary", {"amount": 1})
    assert (both.skill, both.error_code, both.fallback_from) == ("backup", "BROKEN", "primary")


def test_a_fallback_that_is_not_given_is_rejected_up_front(
    make_contract: ContractFactory, script: MakeScript
):
    with pytest.raises(ValueError, match="falls back to 'backup', which is not given"):
        SkillExecutor([callable_skill(make_contract(fallback="backup"), script(OK))])
    with pytest.raises(ValueError, match="names must be unique"):
        SkillExecutor(
            [callable_skill(make_contract(), script(OK)), callable_skill(make_contract(), script(OK))]
        )
