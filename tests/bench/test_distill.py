"""Trace distillation on real episodes: failed calls and redundant lookups go, lookups whose results a later
call reads stay, the rest replays."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from research.distill import distill, replays, savings
from sessionrl.envs.base import Split
from sessionrl.envs.faults import Faults
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv, Ticket
from sessionrl.envs.retail import RetailEnv
from sessionrl.episodes import EpisodeSpec, RolloutConfig, ScriptedAgent, run_episodes
from sessionrl.episodes.verdict import task_success
from sessionrl.policy.references import REFERENCE
from sessionrl.session import CallStatus
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import demonstration_replies

ENV = OrdersEnv(DomainConfig(train=12, dev=1, test=1, time_factor=0))


def test_distillation_keeps_the_shortest_path_that_still_verifies() -> None:
    task = next(
        t for t in ENV.tasks(Split.TRAIN) if Ticket.from_payload(t.payload).issue is IssueType.DAMAGED_ITEM
    )
    plan = ENV.expert(task)
    lookup = plan.steps[0]  # the stock check, made twice more: redundant
    extra = tuple(dataclasses.replace(lookup, id=f"x{i}") for i in range(2))
    noisy = dataclasses.replace(plan, steps=(*extra, *plan.steps))
    agent = ScriptedAgent("noisy", lambda _: noisy)
    with SessionStore.open("sqlite://") as store:
        # transient faults: some calls fail once and are called again
        specs = [EpisodeSpec(task, seed=seed, faults=Faults(tool_error=0.3)) for seed in range(6)]
        ran = asyncio.run(run_episodes(ENV, specs, agent, store, RolloutConfig(expert_retries=4)))
        sessions = [store.get(r.session_id) for r in ran if r.success]
    assert sessions
    assert any(c.status != CallStatus.SUCCESS for s in sessions for c in s.tool_calls)
    distilled = distill(ENV, sessions)
    for d in distilled:
        assert d.verified
        assert [c.tool for c in d.session.tool_calls] == [s.tool for s in plan.steps]
        assert all(c.status == CallStatus.SUCCESS for c in d.session.tool_calls)
        assert task_success(d.session) is True
    report = savings(distilled)
    assert report["calls_after"] == len(plan.steps) * len(sessions)
    assert report["calls_before"] >= report["calls_after"] + 2 * len(sessions)
    assert report["unverified"] == 0


def test_a_session_that_does_not_replay_is_kept_and_counted() -> None:
    task = ENV.tasks(Split.TRAIN)[0]
    with SessionStore.open("sqlite://") as store:
        (ran,) = asyncio.run(run_episodes(ENV, [EpisodeSpec(task)], ScriptedAgent("e", ENV.expert), store))
        session = store.get(ran.session_id)
    wrong = session.model_copy(update={"final_output": session.final_output.model_copy(update={"text": "?"})})
    (d,) = distill(ENV, [wrong])
    assert not d.verified
    assert d.session is wrong
    assert savings([d])["unverified"] == 1


def test_lookups_a_later_call_reads_stay_though_the_replay_needs_only_the_write(retail_data: Path) -> None:
    # retail's checker compares the final database, so the return alone replays; but the return's order
    # and item ids come from the user and order lookups, and the user lookup's id from the first one
    env = RetailEnv(retail_data)
    task = next(t for t in env.tasks(Split.TRAIN) if t.task_id == "retail-train-0")
    plan = env.expert(task)
    assert [s.tool for s in plan.steps] == [
        "find_user_id_by_name_zip",
        "get_user_details",
        "get_order_details",
        "return_delivered_order_items",
    ]
    again = dataclasses.replace(plan.steps[1], id="again")  # the user's details read twice: redundant
    noisy = dataclasses.replace(plan, steps=(*plan.steps[:2], again, *plan.steps[2:]))
    with SessionStore.open("sqlite://") as store:
        (ran,) = asyncio.run(
            run_episodes(env, [EpisodeSpec(task)], ScriptedAgent("e", lambda _: noisy), store)
        )
        session = store.get(ran.session_id)
    order = session.tool_calls[3]
    failed = order.model_copy(update={"call_id": "failed", "status": CallStatus.ERROR, "output": None})
    session = session.model_copy(
        update={"tool_calls": (*session.tool_calls[:3], failed, *session.tool_calls[3:])}
    )
    final = session.final_output.text if session.final_output else ""
    assert asyncio.run(replays(env, task, session.tool_calls[-1:], final, 0))

    (d,) = distill(env, [session])
    assert d.verified
    kept = d.session.tool_calls
    assert [c.call_id for c in kept] == [session.tool_calls[i].call_id for i in (0, 1, 4, 5)]
    assert d.saved == 2  # the second user lookup and the failed order lookup
    # the distilled demonstration still reads every id it needs: no lookup's value is typed out
    written = [r.text for r in demonstration_replies(d.session, "", 100_000)]
    full = [r.text for r in demonstration_replies(session, "", 100_000)]
    assert [len(REFERENCE.findall(t)) for t in written] == [
        len(REFERENCE.findall(full[i])) for i in (0, 1, 4, 5, 6)
    ]
    assert all(c.params["order_id"] not in written[-2] for c in kept[2:3])
