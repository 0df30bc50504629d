"""Fault schedules, garbling and plan-order faults."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessionrl.envs import ExpertPlan, ExpertStep
from sessionrl.envs.faults import (
    FaultKind,
    Faults,
    FaultSchedule,
    garble_json,
    inject_plan_faults,
    with_faults,
)
from sessionrl.skills import ErrorCode, ManualClock, Skill, SkillContract, SkillError, callable_skill

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def test_linear_schedule_interpolates_then_holds() -> None:
    schedule = FaultSchedule(start=1.0, end=0.05, steps=10)
    assert schedule.rate(0) == 1.0
    assert schedule.rate(5) == pytest.approx(0.525)  # 1 + (0.05 - 1) * 5/10
    assert schedule.rate(10) == pytest.approx(0.05)
    assert schedule.rate(1000) == pytest.approx(0.05)
    assert schedule.rate(-3) == 1.0


def test_exponential_schedule_falls_by_a_constant_factor() -> None:
    schedule = FaultSchedule(start=0.8, end=0.05, steps=4, shape="exponential")
    rates = [schedule.rate(step) for step in range(5)]
    factor = (0.05 / 0.8) ** (1 / 4)  # equal ratio between consecutive steps
    for before, after in itertools.pairwise(rates):
        assert after / before == pytest.approx(factor)
    assert rates[0] == pytest.approx(0.8)
    assert rates[-1] == pytest.approx(0.05)


@given(
    start=st.floats(0.01, 1.0),
    end=st.floats(0.01, 1.0),
    steps=st.integers(1, 500),
    shape=st.sampled_from(["linear", "exponential"]),
    step=st.integers(-10, 600),
)
def test_rate_stays_between_its_ends(start: float, end: float, steps: int, shape: str, step: int) -> None:
    rate = FaultSchedule(start=start, end=end, steps=steps, shape=shape).rate(step)  # type: ignore[arg-type]
    assert min(start, end) - 1e-12 <= rate <= max(start, end) + 1e-12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": 1.5}, "start must be a probability"),
        ({"end": -0.1}, "end must be a probability"),
        ({"steps": 0}, "steps must be at least 1"),
        ({"end": 0.0, "shape": "exponential"}, "use shape='linear'"),
    ],
)
def test_bad_schedules_are_refused_with_the_fix(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FaultSchedule(**kwargs)  # type: ignore[arg-type]


def test_faults_validate_and_follow_the_schedule() -> None:
    with pytest.raises(ValueError, match="tool_error must be a probability"):
        Faults(tool_error=2.0)
    schedule = FaultSchedule(start=1.0, end=0.0, steps=4)
    faults = Faults.scheduled(schedule, 1, kinds=frozenset({FaultKind.TOOL_ERROR, FaultKind.PLAN_ORDER}))
    assert faults == Faults(tool_error=0.75, garbled_output=0.0, plan_order=0.75)  # 1 - 1/4
    assert faults.tool_faults
    assert not Faults(plan_order=1.0).tool_faults


@given(value=json_values, seed=st.integers(0, 2**32))
def test_garbled_json_never_parses(value: object, seed: int) -> None:
    text = json.dumps(value)
    garbled = garble_json(text, random.Random(seed))
    with pytest.raises(json.JSONDecodeError):
        json.loads(garbled)


def test_garbling_is_reproducible_from_the_seed() -> None:
    text = json.dumps({"order_id": "#W1", "items": [1, 2, 3], "status": "pending"})
    assert garble_json(text, random.Random(7)) == garble_json(text, random.Random(7))


def _plan() -> ExpertPlan:
    steps = (
        ExpertStep("s1", "find", "find_user", {"email": "a@b.c"}),
        ExpertStep("s2", "read", "get_user", {"user_id": "u"}, ("s1",)),
        ExpertStep("s3", "act", "cancel", {"order_id": "#W1"}, ("s2",)),
    )
    return ExpertPlan(goal="g", steps=steps, final_message="done")


def test_plan_order_faults_reverse_the_steps_at_their_rate() -> None:
    plan = _plan()
    assert inject_plan_faults(plan, Faults(plan_order=1.0), random.Random(0)).step_ids == ("s3", "s2", "s1")
    assert inject_plan_faults(plan, Faults(), random.Random(0)) is plan
    rng = random.Random(11)
    reversed_count = sum(
        inject_plan_faults(plan, Faults(plan_order=0.3), rng).step_ids[0] == "s3" for _ in range(4000)
    )
    # Binomial(4000, 0.3): mean 1200, sd ≈ 29; ±150 is over five sd.
    assert 1050 <= reversed_count <= 1350


# the skill wrapper

COUNTER = SkillContract.model_validate(
    {
        "name": "bump",
        "description": "Add one to a counter.",
        "input_schema": {"type": "object", "properties": {}},
    }
)


def counting_skill() -> tuple[Skill, list[int]]:
    calls: list[int] = []

    def bump(params: dict[str, object]) -> dict[str, object]:
        calls.append(1)
        return {"count": len(calls), "note": "ok"}

    return callable_skill(COUNTER, bump), calls


async def test_a_tool_error_refuses_the_call_with_a_garbled_retryable_error() -> None:
    skill, calls = counting_skill()
    (faulty,) = with_faults([skill], Faults(tool_error=1.0), seed=0)
    with pytest.raises(SkillError) as caught:
        await faulty.invoke({}, ManualClock())
    assert caught.value.code == ErrorCode.UNAVAILABLE
    assert faulty.contract.is_retryable(caught.value.code)
    assert calls == []  # nothing ran
    with pytest.raises(json.JSONDecodeError):
        json.loads(caught.value.message)


async def test_a_garbled_output_runs_the_call_but_loses_its_answer() -> None:
    skill, calls = counting_skill()
    (faulty,) = with_faults([skill], Faults(garbled_output=1.0), seed=0)
    with pytest.raises(SkillError) as caught:
        await faulty.invoke({}, ManualClock())
    assert caught.value.code == ErrorCode.INVALID_OUTPUT
    assert not faulty.contract.is_retryable(caught.value.code)
    assert calls == [1]  # the effect happened
    answer = '{"count":1,"note":"ok"}'
    assert answer.startswith(caught.value.message[:-1])  # a cut of the answer plus one stray token
    with pytest.raises(json.JSONDecodeError):
        json.loads(caught.value.message)


def test_no_tool_faults_leave_the_skills_unwrapped() -> None:
    skill, _ = counting_skill()
    assert with_faults([skill], None, seed=0)[0] is skill
    assert with_faults([skill], Faults(plan_order=1.0), seed=0)[0] is skill


async def outcomes(skill: Skill, calls: int) -> list[str]:
    """`ok`, or the error code, for each of `calls` calls."""
    seen = []
    for _ in range(calls):
        try:
            await skill.invoke({}, ManualClock())
            seen.append("ok")
        except SkillError as error:
            seen.append(error.code)
    return seen


async def test_tool_faults_are_seeded_and_drawn_at_their_rates() -> None:
    faults = Faults(tool_error=0.2, garbled_output=0.25)

    def wrapped(seed: int) -> Skill:
        return with_faults([counting_skill()[0]], faults, seed=seed)[0]

    first = await outcomes(wrapped(5), 4000)
    assert first == await outcomes(wrapped(5), 4000)
    assert first != await outcomes(wrapped(6), 4000)
    # P(refused) = 0.2 → mean 800, sd ≈ 25; P(garbled) = 0.8 · 0.25 = 0.2 → mean 800, sd ≈ 25. ±130 > 5 sd.
    assert 670 <= first.count(ErrorCode.UNAVAILABLE) <= 930
    assert 670 <= first.count(ErrorCode.INVALID_OUTPUT) <= 930
