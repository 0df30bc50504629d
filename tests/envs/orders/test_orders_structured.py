"""What structured policies see of an orders episode (features, bounds) and how their choices become calls."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionrl.envs import Split
from sessionrl.envs.check import run_plan
from sessionrl.envs.gym import param_specs
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv, Ticket
from sessionrl.envs.orders.structured import FEATURES
from sessionrl.skills.schema import validation_errors, validator_for


@pytest.fixture(scope="module")
def env() -> OrdersEnv:
    return OrdersEnv(DomainConfig(train=12, dev=0, test=0, time_factor=0.0))


def test_features_start_from_the_ticket(env: OrdersEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.DAMAGED_ITEM)
    ticket = Ticket.from_payload(task.payload)
    features = dict(zip(FEATURES, env.episode(task).features(), strict=True))
    assert features["issue:damaged_item"] == 1.0
    assert sum(features[f"issue:{issue.value}"] for issue in IssueType) == 1.0
    assert features["damaged_share"] == pytest.approx(ticket.damaged / ticket.quantity)
    assert features[f"courier:{ticket.courier}"] == 1.0  # the waybill in the header names the courier
    assert all(features[f"size:{size}"] == 0.0 for size in ["S", "M", "L", "XL"])  # not checked yet
    assert features["refunded"] == 0.0


def test_features_follow_what_was_done(env: OrdersEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.DAMAGED_ITEM)
    episode = env.episode(task)
    asyncio.run(run_plan(episode, env.expert(task)))
    features = dict(zip(FEATURES, episode.features(), strict=True))
    size = task.payload["package_size"]
    assert features[f"size:{size}"] == 1.0
    assert features["inventory_checked"] == features["return_confirmed"] == features["refunded"] == 1.0
    assert features["booked"] == features["customer_notified"] == 1.0
    assert features["shipped_again"] == features["code_sent"] == 0.0


def test_bounds_narrow_refunds_to_what_is_left_and_timestamps_to_the_order_life(env: OrdersEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.LATE_DELIVERY)
    ticket = Ticket.from_payload(task.payload)
    bounds = env.episode(task).param_bounds()
    assert bounds["refund_trigger"]["amount"] == (0.01, ticket.amount)
    assert bounds["erp_sync"]["timestamp"] == (ticket.placed_at, ticket.now)


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, 11), xs=st.lists(st.floats(-1.0, 1.0), min_size=2, max_size=2))
def test_bound_calls_always_satisfy_the_contracts(env: OrdersEnv, index: int, xs: list[float]) -> None:
    episode = env.episode(env.tasks(Split.TRAIN)[index])
    bounds = episode.param_bounds()
    for contract in env.contracts():
        specs = param_specs(contract)
        chosen = {
            spec.name: spec.decode(xs[i], bounds.get(contract.name, {}).get(spec.name))
            for i, spec in enumerate(specs)
        }
        params = episode.bind(contract.name, chosen)
        assert validation_errors(validator_for(contract.input_schema), params) == ()


def test_summary_states_what_happened(env: OrdersEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.WRONG_ADDRESS)
    episode = env.episode(task)
    assert episode.summary() == "We have received your request."
    asyncio.run(run_plan(episode, env.expert(task)))
    summary = episode.summary()
    assert task.payload["new_address"] in summary
    assert task.payload["order_id"] in summary
    assert episode.success([summary])
