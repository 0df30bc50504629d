"""Trace distillation on real orders episodes: failed calls and redundant lookups go, the rest replays."""

from __future__ import annotations

import asyncio
import dataclasses

from sessionrl.envs.base import Split
from sessionrl.envs.faults import Faults
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv, Ticket
from sessionrl.episodes import EpisodeSpec, RolloutConfig, ScriptedAgent, run_episodes
from sessionrl.eval.metrics import task_success
from sessionrl.session import CallStatus
from sessionrl.store import SessionStore
from sessionrl.train.llm.distill import distill, savings

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
