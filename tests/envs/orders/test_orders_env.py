"""The orders environment: tasks and splits, conformance, the expert, skills' latency and failures, faults."""

from __future__ import annotations

import asyncio
import random
import statistics
from collections import Counter

import pytest

from sessionrl.envs import Faults, FaultSchedule, Split, inject_plan_faults
from sessionrl.envs.check import check_env, replay, run_plan
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv, Ticket
from sessionrl.envs.orders.expert import pattern
from sessionrl.skills import ErrorCode, ExecutorConfig, ManualClock, SkillError, SkillExecutor, check_skill

INSTANT = DomainConfig(time_factor=0.0)


@pytest.fixture(scope="module")
def env() -> OrdersEnv:
    return OrdersEnv(INSTANT)


def test_default_splits_have_the_configured_sizes(env: OrdersEnv) -> None:
    assert [len(env.tasks(split)) for split in Split] == [400, 50, 100]
    ids = [task.task_id for split in Split for task in env.tasks(split)]
    assert len(set(ids)) == len(ids)


def test_every_split_holds_every_issue_type_evenly(env: OrdersEnv) -> None:
    for split in Split:
        counts = Counter(task.payload["issue"] for task in env.tasks(split))
        assert set(counts) == set(IssueType)
        assert max(counts.values()) - min(counts.values()) <= 1  # dealt round-robin


def test_tasks_are_seeded_and_splits_independent() -> None:
    a = OrdersEnv(DomainConfig(seed=3, train=20, dev=5, test=5))
    b = OrdersEnv(DomainConfig(seed=3, train=20, dev=9, test=1))
    c = OrdersEnv(DomainConfig(seed=4, train=20, dev=5, test=5))
    assert a.tasks(Split.TRAIN) == b.tasks(Split.TRAIN)
    assert [t.instruction for t in a.tasks(Split.TRAIN)] == [t.instruction for t in b.tasks(Split.TRAIN)]
    assert [t.payload for t in a.tasks(Split.TRAIN)] == [t.payload for t in b.tasks(Split.TRAIN)]
    assert [t.instruction for t in a.tasks(Split.TRAIN)] != [t.instruction for t in c.tasks(Split.TRAIN)]


def test_instructions_carry_the_ticket_header_and_vary(env: OrdersEnv) -> None:
    first_lines: dict[str, set[str]] = {}
    for task in env.tasks(Split.TRAIN):
        ticket = Ticket.from_payload(task.payload)
        header = task.instruction.splitlines()[-1]
        assert header.startswith(f"[ticket: {ticket.issue.value.replace('_', ' ')}]")
        assert ticket.sku in header
        assert ticket.phone in header
        if ticket.order_id is not None:
            assert ticket.order_id in header
        first_lines.setdefault(ticket.issue, set()).add(task.instruction.splitlines()[0][:25])
    assert all(len(lines) >= 4 for lines in first_lines.values())


def test_payload_round_trips_through_the_ticket(env: OrdersEnv) -> None:
    for task in env.tasks(Split.DEV):
        assert Ticket.from_payload(task.payload).to_payload() == dict(task.payload)


def test_check_env_passes(env: OrdersEnv) -> None:
    check_env(env, tasks_per_split=5)


async def test_contracts_pass_check_skill_without_warnings(env: OrdersEnv) -> None:
    for contract in env.contracts():
        assert await check_skill(contract) == ()


def test_expert_solves_every_task_without_faults(env: OrdersEnv) -> None:
    for split in Split:
        failed = [t.task_id for t in env.tasks(split) if not replay(env.episode(t), env.expert(t))]
        assert failed == []


def test_each_issue_type_has_its_pattern(env: OrdersEnv) -> None:
    tools = {
        issue: tuple(step.tool for step in pattern(Ticket.from_payload(task.payload)))
        for task in env.tasks(Split.TRAIN)
        for issue in [IssueType(task.payload["issue"])]
    }
    assert tools[IssueType.WRONG_ADDRESS] == ("inventory_check", "sms_send", "order_update_address")
    assert tools[IssueType.STOCK_INQUIRY] == ("inventory_check",)
    assert tools[IssueType.DAMAGED_ITEM][:3] == ("inventory_check", "return_check", "refund_trigger")
    assert len(set(tools.values())) == len(IssueType)


def test_episode_mask_and_terminated(env: OrdersEnv) -> None:
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.WRONG_ADDRESS)
    episode = env.episode(task)
    assert not episode.terminated
    assert episode.action_mask() == {
        "erp_sync": False,
        "express_contact": True,
        "inventory_check": True,
        "order_update_address": False,
        "refund_trigger": False,
        "return_check": True,
        "sms_send": True,
        "waybill_generate": True,
    }
    plan = env.expert(task)
    asyncio.run(run_plan(episode, plan))
    assert episode.action_mask()["order_update_address"]
    assert episode.action_mask()["refund_trigger"]


def test_episodes_are_independent_and_reproducible(env: OrdersEnv) -> None:
    task = env.tasks(Split.TEST)[0]
    a, b = env.episode(task), env.episode(task)
    assert replay(a, env.expert(task))
    assert a.state_hash() != b.state_hash()
    assert replay(b, env.expert(task))
    assert a.state_hash() == b.state_hash()


async def test_logistics_latency_follows_its_profile() -> None:
    env = OrdersEnv(DomainConfig(train=6, dev=0, test=0))
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.LOST_PARCEL)
    latencies = []
    for seed in range(300):
        skill = {s.name: s for s in env.episode(task, seed=seed).skills()}["express_contact"]
        clock = ManualClock()
        await skill.invoke({"waybill": task.payload["waybill"], "request_type": "trace"}, clock)
        latencies.append(clock.now() * 1000.0)
    # 820 ± 340 ms: the mean of 300 draws has a standard error of 340 / sqrt(300) ≈ 20 ms
    assert statistics.mean(latencies) == pytest.approx(820.0, abs=80.0)
    assert statistics.stdev(latencies) == pytest.approx(340.0, rel=0.25)


async def test_time_factor_scales_latency_and_zero_means_no_sleep() -> None:
    half = OrdersEnv(DomainConfig(train=6, dev=0, test=0, time_factor=0.5))
    instant = OrdersEnv(DomainConfig(train=6, dev=0, test=0, time_factor=0.0))
    assert {c.name: c.simulation.mean_ms for c in half.contracts() if c.simulation}[
        "express_contact"
    ] == 410.0
    task = half.tasks(Split.TRAIN)[0]
    clock = ManualClock()
    skills = {s.name: s for s in instant.episode(task).skills()}
    await skills["inventory_check"].invoke({"sku": task.payload["sku"]}, clock)
    assert clock.now() == 0.0


async def test_transient_failures_are_retryable_and_change_nothing() -> None:
    env = OrdersEnv(DomainConfig(train=6, dev=0, test=0, time_factor=0.0, transient_failures=True))
    task = next(t for t in env.tasks(Split.TRAIN) if t.payload["issue"] == IssueType.LATE_DELIVERY)
    params = {"waybill": task.payload["waybill"], "request_type": "expedite"}
    codes: Counter[str] = Counter()
    unchanged = 0
    for seed in range(200):
        episode = env.episode(task, seed=seed)
        skill = {s.name: s for s in episode.skills()}["express_contact"]
        before = episode.state_hash()
        try:
            await skill.invoke(params, ManualClock())
        except SkillError as error:
            codes[error.code] += 1
            unchanged += episode.state_hash() == before
    # fail rate 0.08 over 200 calls: about 16 failures
    assert codes.keys() == {"LOGISTICS_TIMEOUT"}
    assert env.contracts()[1].name == "express_contact"
    assert env.contracts()[1].is_retryable("LOGISTICS_TIMEOUT")
    assert 5 <= codes["LOGISTICS_TIMEOUT"] <= 35
    assert unchanged == codes["LOGISTICS_TIMEOUT"]


async def test_expert_through_the_executor_survives_transient_failures() -> None:
    env = OrdersEnv(DomainConfig(train=30, dev=0, test=0, transient_failures=True))
    solved = 0
    for task in env.tasks(Split.TRAIN):
        episode = env.episode(task, seed=1)
        plan = env.expert(task)
        executor = SkillExecutor(episode.skills(), ExecutorConfig(max_attempts=4), clock=ManualClock())
        async with executor as run:
            results = [await run.call(step.tool, dict(step.params)) for step in plan.steps]
        assert all(r.latency_ms > 0 for r in results)
        solved += episode.success([plan.final_message])
    assert solved == 30


async def test_executor_rejects_parameters_outside_the_contract(env: OrdersEnv) -> None:
    task = env.tasks(Split.TRAIN)[0]
    async with SkillExecutor(env.episode(task).skills(), clock=ManualClock()) as run:
        result = await run.call(
            "refund_trigger", {"order_id": "O-104233", "amount": 0.0, "reason": "quality"}
        )
        bad_enum = await run.call("refund_trigger", {"order_id": "O-104233", "amount": 5.0, "reason": "mood"})
    assert result.error_code == ErrorCode.INVALID_PARAMS
    assert "amount" in (result.error_message or "")
    assert bad_enum.error_code == ErrorCode.INVALID_PARAMS
    assert "reason" in (bad_enum.error_message or "")


def _fault_share(env: OrdersEnv, faults: Faults) -> float:
    """Share of expert calls that failed across the first 30 training tasks."""
    failed = total = 0
    for task in env.tasks(Split.TRAIN)[:30]:
        results = asyncio.run(run_plan(env.episode(task, seed=7, faults=faults), env.expert(task)))
        failed += sum(isinstance(result, SkillError) for result in results)
        total += len(results)
    return failed / total


def test_injected_faults_decay_with_the_schedule(env: OrdersEnv) -> None:
    schedule = FaultSchedule(start=0.8, end=0.0, steps=100)
    shares = [_fault_share(env, Faults.scheduled(schedule, step)) for step in (0, 50, 100)]
    # each call fails with probability tool_error + (1 - tool_error) * garbled_output = 1 - (1 - rate)^2
    assert shares[0] == pytest.approx(1 - 0.2**2, abs=0.08)
    assert shares[1] == pytest.approx(1 - 0.6**2, abs=0.1)
    assert shares[2] == 0.0


def test_plan_order_faults_break_every_multi_step_resolution(env: OrdersEnv) -> None:
    rng = random.Random(0)
    solved: Counter[str] = Counter()
    for task in env.tasks(Split.TRAIN)[:30]:
        expert = env.expert(task)
        plan = inject_plan_faults(expert, Faults(plan_order=1.0), rng)
        assert plan.steps == tuple(reversed(expert.steps))
        solved[task.payload["issue"]] += replay(env.episode(task), plan)
    # a reversed plan runs each step before what it depends on; only the one-step stock inquiry survives
    assert {issue for issue, count in solved.items() if count} == {IssueType.STOCK_INQUIRY}


async def test_injected_tool_errors_are_garbled_and_change_nothing(env: OrdersEnv) -> None:
    task = env.tasks(Split.TRAIN)[0]
    episode = env.episode(task, faults=Faults(tool_error=1.0))
    before = episode.state_hash()
    step = env.expert(task).steps[0]
    skill = {s.name: s for s in episode.skills()}[step.tool]
    with pytest.raises(SkillError) as caught:
        await skill.invoke(dict(step.params), ManualClock())
    assert caught.value.code == ErrorCode.UNAVAILABLE
    assert episode.state_hash() == before


def test_defaults_keep_real_latencies_and_no_transient_failures() -> None:
    profiles = {c.name: c.simulation for c in OrdersEnv(DomainConfig(train=1, dev=0, test=0)).contracts()}
    assert profiles["express_contact"] is not None
    assert (profiles["express_contact"].mean_ms, profiles["express_contact"].std_ms) == (820.0, 340.0)
    assert all(p is not None and p.fail_rate == 0.0 for p in profiles.values())


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="train"):
        DomainConfig(train=0)
    with pytest.raises(ValueError, match="time_factor"):
        DomainConfig(time_factor=-1.0)
