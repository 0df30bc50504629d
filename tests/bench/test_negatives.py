"""Counterfactual hard negatives on a real failed orders episode: the expert's action at the failing step
scores best on replay, a plausible spoiled action worst, and the pair's prompt is the conversation there."""

from __future__ import annotations

import asyncio
import dataclasses
import random

from research.negatives import counterfactual_pair, random_pair
from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, IssueType, OrdersEnv, Ticket
from sessionrl.episodes import EpisodeSpec, ScriptedAgent, run_episodes
from sessionrl.store import SessionStore

ENV = OrdersEnv(DomainConfig(train=12, dev=1, test=1, time_factor=0))
SYSTEM = "You resolve fulfilment tickets."


def test_the_expert_action_is_chosen_against_the_worst_replayed_alternative() -> None:
    task = next(
        t for t in ENV.tasks(Split.TRAIN) if Ticket.from_payload(t.payload).issue is IssueType.DAMAGED_ITEM
    )
    plan = ENV.expert(task)
    wrong = tuple(
        dataclasses.replace(s, params={**s.params, "amount": 0.5}) if s.tool == "refund_trigger" else s
        for s in plan.steps
    )
    agent = ScriptedAgent("t", lambda _: dataclasses.replace(plan, steps=wrong))
    with SessionStore.open("sqlite://") as store:
        (ran,) = asyncio.run(run_episodes(ENV, [EpisodeSpec(task)], agent, store))
        failed = store.get(ran.session_id)
    assert not ran.success
    found = counterfactual_pair(ENV, task, failed, SYSTEM, 200)
    assert found is not None
    pair, ranked = found
    best = ranked[0]
    assert (best.kind, best.tool, best.score) == ("expert", "refund_trigger", 1.0)
    assert ranked[-1].score < 0  # its own call failed
    assert {a.kind for a in ranked} >= {"expert", "perturbed", "masked_tool", "taken"}
    assert '"refund_trigger"' in pair.chosen
    assert pair.rejected != pair.chosen
    assert pair.messages[1].content == task.instruction
    assert pair.messages[-1].role == "tool"  # the conversation up to the failing step
    easy = random_pair(pair, ENV, random.Random(0))
    assert (easy.messages, easy.chosen) == (pair.messages, pair.chosen)
    assert easy.rejected != pair.rejected
