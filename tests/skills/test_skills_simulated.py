"""Simulated skills: seeded, reproducible, and as slow and as unreliable as their profile says."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from skills_support import ContractFactory

from sessionrl.skills import (
    ContractError,
    ExecutorConfig,
    ManualClock,
    SkillError,
    SkillExecutor,
    simulated_skill,
)
from sessionrl.skills.schema import validator_for

PROFILE = {"mean_ms": 300.0, "std_ms": 100.0, "fail_rate": 0.2, "fail_codes": ["FLAKY", "BROKEN"]}


async def _trace(contract_factory: ContractFactory, seed: int, calls: int) -> list[tuple[float, str]]:
    """(latency in ms, outcome) of each call, run through an executor on a manual clock."""
    contract = contract_factory(simulation=PROFILE, sla={"timeout_s": 10.0})
    executor = SkillExecutor(
        [simulated_skill(contract, seed=seed)], ExecutorConfig(max_attempts=1), clock=ManualClock()
    )
    results = [await executor.call("probe", {"amount": 1}) for _ in range(calls)]
    return [(r.latency_ms, r.error_code or "ok") for r in results]


async def test_the_same_seed_replays_the_same_calls(make_contract: ContractFactory):
    first = await _trace(make_contract, seed=7, calls=40)
    assert first == await _trace(make_contract, seed=7, calls=40)
    assert first != await _trace(make_contract, seed=8, calls=40)
    assert {outcome for _, outcome in first} == {"ok", "FLAKY", "BROKEN"}


async def test_failure_rate_and_latency_follow_the_profile(make_contract: ContractFactory):
    skill = simulated_skill(make_contract(simulation=PROFILE), seed=3)
    clock, codes, latencies = ManualClock(), [], []
    for _ in range(4000):
        before = clock.now()
        try:
            await skill.invoke({"amount": 1}, clock)
        except SkillError as error:
            codes.append(error.code)
        latencies.append((clock.now() - before) * 1000)
    failures = len(codes)
    assert set(codes) == {"FLAKY", "BROKEN"}
    # binomial standard error sqrt(0.2 · 0.8 / 4000) ≈ 0.0063: allow about 4 of them
    assert failures / 4000 == pytest.approx(0.2, abs=0.025)
    # standard error of the mean 100 / sqrt(4000) ≈ 1.6 ms; of the std a few ms
    assert statistics.fmean(latencies) == pytest.approx(300.0, abs=8.0)
    assert statistics.stdev(latencies) == pytest.approx(100.0, abs=12.0)
    assert min(latencies) > 0.0  # log-normal: never negative


async def test_default_output_satisfies_the_output_schema(make_contract: ContractFactory):
    contract = make_contract(simulation={"mean_ms": 0.0})
    output = await simulated_skill(contract).invoke({"amount": 1}, ManualClock())
    assert validator_for(contract.output_schema).is_valid(output)


async def test_an_output_function_shapes_the_answer(make_contract: ContractFactory):
    skill = simulated_skill(
        make_contract(simulation={"mean_ms": 10.0}), output=lambda p: {"total": p["amount"] * 2}
    )
    assert await skill.invoke({"amount": 4}, ManualClock()) == {"total": 8}


def test_a_contract_without_a_profile_cannot_be_simulated(make_contract: ContractFactory):
    with pytest.raises(ContractError, match="needs a `simulation` section"):
        simulated_skill(make_contract())


@pytest.mark.parametrize(
    "output_schema",
    [
        {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
        {
            "type": "object",
            "properties": {"rows": {"type": "array", "minItems": 1, "items": {"type": "integer"}}},
            "required": ["rows"],
        },
    ],
    ids=["flat", "nested"],
)
async def test_every_answer_is_a_fresh_copy_of_the_sample(make_contract: ContractFactory, output_schema):
    skill = simulated_skill(make_contract(simulation={"mean_ms": 0.0}, output_schema=output_schema))
    first = await skill.invoke({"amount": 1}, ManualClock())
    expected = {key: (list(value) if isinstance(value, list) else value) for key, value in first.items()}
    for value in first.values():
        if isinstance(value, list):
            value.append(99)
    first["extra"] = True
    assert await skill.invoke({"amount": 1}, ManualClock()) == expected


async def test_draws_follow_one_generator_seeded_with_the_seed(make_contract: ContractFactory):
    # The generator is built at the first draw; its draws are those of one seeded up front: per call a
    # log-normal latency, a failure draw, and a code when the call fails.
    skill = simulated_skill(make_contract(simulation=PROFILE), seed=11)
    clock, reference = ManualClock(), random.Random(11)
    sigma2 = math.log1p((100.0 / 300.0) ** 2)
    for _ in range(30):
        before = clock.now()
        expected = reference.lognormvariate(math.log(300.0) - sigma2 / 2, math.sqrt(sigma2))
        fails = reference.random() < 0.2
        code = reference.choice(["FLAKY", "BROKEN"]) if fails else None
        try:
            await skill.invoke({"amount": 1}, clock)
            got = None
        except SkillError as error:
            got = error.code
        assert got == code
        assert (clock.now() - before) * 1000 == pytest.approx(expected)


async def test_a_skill_whose_draws_change_nothing_builds_no_generator(make_contract: ContractFactory):
    fixed = simulated_skill(make_contract(simulation={"mean_ms": 5.0, "std_ms": 0.0}), seed=1)
    for _ in range(3):
        await fixed.invoke({"amount": 1}, ManualClock())
    assert fixed._rng is None
    noisy = simulated_skill(make_contract(simulation={"mean_ms": 5.0, "std_ms": 1.0}), seed=1)
    await noisy.invoke({"amount": 1}, ManualClock())
    assert noisy._rng is not None
