"""The orders success checker: pattern and parameters, extra actions, risk, and the facts of the reply."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from sessionrl.envs import ExpertStep, Split, Task
from sessionrl.envs.check import run_plan
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv, OrdersEpisode, Ticket
from sessionrl.envs.orders.expert import key_facts, pattern
from sessionrl.envs.orders.judge import expected, said, tolerance


@pytest.fixture(scope="module")
def env() -> OrdersEnv:
    return OrdersEnv(DomainConfig(train=60, dev=0, test=0, time_factor=0.0))


def task_of(env: OrdersEnv, issue: IssueType) -> Task:
    return next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == issue)


def run(env: OrdersEnv, task: Task, steps: Sequence[ExpertStep]) -> OrdersEpisode:
    episode = env.episode(task)
    plan = env.expert(task)
    asyncio.run(run_plan(episode, type(plan)(plan.goal, tuple(steps), plan.final_message)))
    return episode


def with_params(step: ExpertStep, **params: Any) -> ExpertStep:
    return ExpertStep(step.id, step.description, step.tool, {**step.params, **params}, step.depends_on)


@pytest.mark.parametrize("issue", list(IssueType))
def test_the_expert_passes_every_check(env: OrdersEnv, issue: IssueType) -> None:
    task = task_of(env, issue)
    plan = env.expert(task)
    outcome = run(env, task, plan.steps).outcome([plan.final_message])
    assert outcome.checks == {"pattern": True, "no_extra_actions": True, "no_risk": True, "message": True}
    assert outcome.detail == ""


def test_episodes_of_one_ticket_are_judged_alike_against_its_one_pattern(env: OrdersEnv) -> None:
    """The pattern and key facts are built once per ticket; a second episode of the task, judged after a
    first that solved it, is judged afresh (it did nothing, so it fails) and the first still passes."""
    task = task_of(env, IssueType.DAMAGED_ITEM)
    ticket = Ticket.from_payload(task.payload)
    assert expected(ticket) is expected(Ticket.from_payload(task.payload))
    assert expected(ticket) == (pattern(ticket), key_facts(ticket))
    plan = env.expert(task)
    solved = run(env, task, plan.steps)
    assert solved.success([plan.final_message])
    assert not env.episode(task).success([plan.final_message])
    assert solved.success([plan.final_message])
    assert expected(ticket) == (pattern(ticket), key_facts(ticket))


def test_doing_nothing_fails_with_reasons(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.WRONG_ADDRESS)
    outcome = env.episode(task).outcome([])
    assert not outcome.success
    assert outcome.checks["pattern"] is False
    assert outcome.checks["message"] is False
    assert "no call did s1" in outcome.detail


def test_independent_steps_may_swap(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.DAMAGED_ITEM)
    plan = env.expert(task)
    s1, s2, *rest = plan.steps  # inventory and return checks depend on nothing
    assert run(env, task, [s2, s1, *rest]).success([plan.final_message])


def test_a_step_before_its_dependency_does_not_count(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.LATE_DELIVERY)
    plan = env.expert(task)
    expedite, check, refund, text = plan.steps
    # the text goes out before the refund it announces: it cannot match s4, which depends on s3
    outcome = run(env, task, [expedite, check, text, refund]).outcome([plan.final_message])
    assert outcome.checks["pattern"] is False
    assert "s4" in outcome.detail


def test_refund_amount_within_tolerance_counts(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.DAMAGED_ITEM)
    ticket = Ticket.from_payload(task.payload)
    plan = env.expert(task)
    steps = list(plan.steps)
    expected = ticket.refund_amount()
    # tolerance: 1% of the order amount, at least one cent
    assert tolerance(ticket) == pytest.approx(max(0.01, 0.01 * ticket.amount))
    near = round(expected - tolerance(ticket) / 2, 2)
    steps[2] = with_params(steps[2], amount=near)
    assert run(env, task, steps).outcome([plan.final_message]).checks["pattern"]


def test_a_reply_may_state_the_amount_actually_refunded(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.DAMAGED_ITEM)
    ticket = Ticket.from_payload(task.payload)
    plan = env.expert(task)
    steps = list(plan.steps)
    near = round(ticket.refund_amount() - 0.01, 2)
    steps[2] = with_params(steps[2], amount=near)
    episode = run(env, task, steps)
    # the refund is one cent off (within tolerance) and the reply states what was really refunded
    honest = f"Refunded {near:.2f} for order {ticket.require_order()}."
    assert episode.outcome([honest]).success
    # a reply stating an amount nobody refunded still fails the message check
    wrong = f"Refunded {near + 5:.2f} for order {ticket.require_order()}."
    assert episode.outcome([wrong]).checks["message"] is False


def test_a_refund_on_a_ticket_that_earns_none_is_judged_not_raised(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.LOST_PARCEL)
    ticket = Ticket.from_payload(task.payload)
    plan = env.expert(task)
    order = ticket.require_order()
    check = ExpertStep("c", "check stock", "inventory_check", {"sku": ticket.sku}, ())
    refund = ExpertStep(
        "x",
        "refund anyway",
        "refund_trigger",
        {"order_id": order, "amount": 1.0, "reason": "quality"},
        ("c",),
    )
    episode = run(env, task, [*plan.steps, check, refund])
    assert any(tool == "refund_trigger" for tool, _, _ in episode.world.calls), "the refund must have run"
    outcome = episode.outcome([plan.final_message])
    assert outcome.checks["no_extra_actions"] is False


def test_refund_amount_outside_tolerance_fails(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.DAMAGED_ITEM)
    ticket = Ticket.from_payload(task.payload)
    plan = env.expert(task)
    steps = list(plan.steps)
    steps[2] = with_params(steps[2], amount=round(ticket.refund_amount() - 2 * tolerance(ticket) - 0.01, 2))
    outcome = run(env, task, steps).outcome([plan.final_message])
    assert outcome.checks["pattern"] is False


def test_wrong_enum_fails_the_pattern(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.LOST_PARCEL)
    plan = env.expert(task)
    steps = list(plan.steps)
    other = "JD" if steps[2].params["courier"] != "JD" else "SF"
    steps[2] = with_params(steps[2], courier=other)
    outcome = run(env, task, steps).outcome([plan.final_message])
    assert outcome.checks["pattern"] is False


def test_address_matches_ignoring_case_commas_and_spacing(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.WRONG_ADDRESS)
    plan = env.expert(task)
    steps = list(plan.steps)
    typed = "  " + str(steps[2].params["new_address"]).upper().replace(",", " ")
    steps[2] = with_params(steps[2], new_address=typed)
    assert run(env, task, steps).outcome([plan.final_message]).checks["pattern"]


def test_an_unasked_for_refund_spoils_the_resolution(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.LATE_DELIVERY)  # a 10% compensation leaves money to refund
    plan = env.expert(task)
    refund = plan.steps[2]
    extra = with_params(refund, amount=0.01)
    outcome = run(env, task, [*plan.steps, extra]).outcome([plan.final_message])
    assert outcome.checks["no_extra_actions"] is False
    assert outcome.checks["no_risk"] is False  # a second refund is also flagged
    assert outcome.checks["pattern"] is True


def test_a_risky_order_fails_even_when_every_step_is_there(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.WRONG_ITEM)
    plan = env.expert(task)
    confirm, check, ship, book, text = plan.steps
    # shipping before the return is confirmed: flagged, and the ship step no longer follows s1
    episode = run(env, task, [check, ship, confirm, book, text])
    outcome = episode.outcome([plan.final_message])
    assert episode.risk_flags == ("unconfirmed_reshipment",)
    assert outcome.checks["no_risk"] is False
    assert not outcome.success


def test_the_reply_must_state_every_key_fact(env: OrdersEnv) -> None:
    task = task_of(env, IssueType.LOST_PARCEL)
    ticket = Ticket.from_payload(task.payload)
    plan = env.expert(task)
    episode = run(env, task, plan.steps)
    assert key_facts(ticket) == ((ticket.order_id,), (ticket.new_waybill(1),))
    assert episode.outcome([f"Order {ticket.order_id} is on its way again."]).checks["message"] is False
    assert episode.success(
        [f"Order {ticket.order_id} is on its way again.", f"Waybill: {ticket.new_waybill(1)}"]
    )


@pytest.mark.parametrize(
    ("fact", "message", "expected"),
    [
        ("23.40", "we refunded 23.40 yuan", True),
        ("23.4", "we refunded 23.40 yuan", False),
        ("23.4", "we refunded 23.4.", True),
        ("12", "SKU-48212 has 3 units", False),
        ("O-104233", "订单O-104233已处理", True),
        ("88 Nanjing Road, Shanghai 200001", "to 88 nanjing road shanghai 200001.", True),
    ],
)
def test_said_matches_whole_facts(fact: str, message: str, expected: bool) -> None:
    assert said(fact, message) is expected
