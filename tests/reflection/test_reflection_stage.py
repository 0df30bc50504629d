"""Stage 3's data and trainer on a tiny model: root-cause answers after a failed transcript, weighted
sequences, and a weighted SFT step that lowers both the retry and the root-cause losses."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest
import torch

from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import EpisodeSpec, ScriptedAgent, run_episodes
from sessionrl.policy.llm import HFPolicy
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.reflection import ROOT_CAUSE_QUESTION, RootCause, reflect
from sessionrl.session import Session
from sessionrl.store import SessionStore
from sessionrl.train.llm.data import demonstration_turns, merge_turns
from sessionrl.train.llm.reflection import ReflectionTrainer, root_cause_turn, transcript, weighted
from sessionrl.train.llm.sft import SFTConfig

ENV = OrdersEnv(DomainConfig(train=6, dev=1, test=1, time_factor=0))
SYSTEM = "You resolve fulfilment tickets."


def sessions() -> tuple[Session, Session]:
    """A solved expert episode, and the same task with its final step left out (so it failed)."""
    task = ENV.tasks(Split.TRAIN)[0]
    plan = ENV.expert(task)
    short = dataclasses.replace(plan, steps=plan.steps[:-1])
    out = []
    with SessionStore.open("sqlite://") as store:
        for agent in (ScriptedAgent("expert", lambda _: plan), ScriptedAgent("short", lambda _: short)):
            (ran,) = asyncio.run(run_episodes(ENV, [EpisodeSpec(task)], agent, store))
            out.append(store.get(ran.session_id))
    return out[0], out[1]


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> HFPolicy:
    solved, _ = sessions()
    texts = [SYSTEM, solved.user_query, ROOT_CAUSE_QUESTION, *(str(c.params) for c in solved.tool_calls)]
    config = TinyModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model, tokenizer = build_tiny_policy(texts * 3, config, tmp_path_factory.mktemp("tiny"))
    return HFPolicy(model, tokenizer)


def test_a_weighted_step_lowers_retry_and_root_cause_losses(policy: HFPolicy) -> None:
    solved, failed = sessions()
    reflection = reflect(failed, ENV.expert(ENV.tasks(Split.TRAIN)[0]))
    assert reflection is not None
    assert reflection.root_cause is RootCause.MISSING_STEP
    turn = root_cause_turn(failed, reflection.root_cause, SYSTEM, policy, 120)
    assert policy.tokenizer.decode(turn.completion, skip_special_tokens=True) == "root cause: missing_step"
    assert ROOT_CAUSE_QUESTION in policy.tokenizer.decode(turn.prompt)
    assert transcript(failed, SYSTEM, 120)[1].content == failed.user_query
    retry = weighted(merge_turns(demonstration_turns(solved, SYSTEM, policy, 120)), 1.0)
    cause = weighted(merge_turns([turn]), -0.2)
    assert set(cause[0].advantages) == {0.0, -0.2}
    model = copy.deepcopy(policy.model)
    trainer = ReflectionTrainer(
        model, SFTConfig(lr=0.02, steps=8, warmup_steps=0, cosine=False), policy.tokenizer.pad_token_id
    )
    before = [p.detach().clone() for p in model.parameters()]
    first = trainer.step([*retry, *cause])
    for _ in range(3):
        last = trainer.step([*retry, *cause])
    assert last.parts["retry_nll"] < first.parts["retry_nll"]
    assert last.parts["root_cause_nll"] < first.parts["root_cause_nll"]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
