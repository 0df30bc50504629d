"""Stage 3's data and trainer on a tiny model: root-cause answers after a failed transcript, weighted
sequences, a weighted SFT step that lowers both the retry and the root-cause losses, the policy's own
reflection once it has learned to name a cause, and corrected retries that meet the failed episode's
faults."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.episodes import EpisodeSpec, RolloutConfig, ScriptedAgent, run_episodes
from sessionrl.policy.llm import HFPolicy
from sessionrl.policy.tiny import TinyModelConfig, build_tiny_policy
from sessionrl.reflection import (
    ANNOTATOR,
    ROOT_CAUSE_QUESTION,
    RootCause,
    reflect,
    root_cause_answer,
    with_reflection,
)
from sessionrl.session import CallStatus, Session
from sessionrl.store import SessionStore
from sessionrl.train.config import EnvSection, FaultSection, RunConfig
from sessionrl.train.llm.data import demonstration_turns, merge_turns
from sessionrl.train.llm.reflection import (
    ReflectionTrainer,
    attempt_faults,
    corrected_retries,
    root_cause_turn,
    self_reflect,
    transcript,
    weighted,
)
from sessionrl.train.llm.run import open_run
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


def test_a_policy_that_learned_root_causes_reflects_itself_once(tmp_path: Path) -> None:
    config = RunConfig(
        run_dir=tmp_path / "run",
        env=EnvSection(train=6, dev=1, test=1),
        rollout=RolloutConfig(max_steps=7, full_schemas=False, domain_policy=False, max_tool_chars=120),
    )
    with open_run(config) as run:
        task = run.env.tasks(Split.TRAIN)[0]
        plan = run.env.expert(task)
        short = ScriptedAgent("short", lambda _: dataclasses.replace(plan, steps=plan.steps[:-1]))
        (ran,) = asyncio.run(run_episodes(run.env, [EpisodeSpec(task)], short, run.store))
        failed = run.store.get(ran.session_id)
        texts = [run.system, failed.user_query, ROOT_CAUSE_QUESTION, root_cause_answer(RootCause.WRONG_ORDER)]
        shape = TinyModelConfig(
            vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64
        )
        model, tokenizer = build_tiny_policy(texts * 3, shape, tmp_path / "tiny")
        run.policy = policy = HFPolicy(model, tokenizer)
        # taught to name a cause (not the judge's: what the policy says is what it reflects)
        turn = root_cause_turn(failed, RootCause.WRONG_ORDER, run.system, policy, 120)
        config_sft = SFTConfig(lr=0.02, steps=40, warmup_steps=0, cosine=False)
        trainer = ReflectionTrainer(model, config_sft, tokenizer.pad_token_id)
        for _ in range(40):
            trainer.step(weighted(merge_turns([turn]), 1.0))
        notes = self_reflect(run, policy, [failed])
        assert notes[failed.session_id].root_cause is RootCause.WRONG_ORDER
        assert notes[failed.session_id].source == "policy"
        assert "Root cause: wrong_order" in with_reflection(task, notes[failed.session_id]).instruction
        self_reflect(run, policy, [run.store.get(failed.session_id)])  # a resumed run asks again
        stored = [f for f in run.store.get(failed.session_id).feedback if f.annotator == ANNOTATOR]
        assert [f.data["reflection"]["source"] for f in stored] == ["policy"]


def test_a_corrected_retry_meets_the_fault_its_attempt_ignored_and_calls_again(tmp_path: Path) -> None:
    config = RunConfig(
        run_dir=tmp_path / "run",
        env=EnvSection(train=6, dev=1, test=1),
        rollout=RolloutConfig(max_steps=7, full_schemas=False, domain_policy=False, expert_retries=2),
        faults=FaultSection(eval_rate=0.3, garbled=False),
    )
    giving_up = dataclasses.replace(config.rollout, expert_retries=0)
    with open_run(config) as run:
        task = run.env.tasks(Split.TRAIN)[0]
        plan = run.env.expert(task)
        # an attempt (with the faults `attempt` gives) that met a fault and went on without calling again
        specs = [
            EpisodeSpec(task, f"try-{seed}", seed=seed, faults=attempt_faults(config)) for seed in range(40)
        ]
        ran = asyncio.run(
            run_episodes(run.env, specs, ScriptedAgent("e", run.env.expert), run.store, giving_up)
        )
        failed = next(run.store.get(r.session_id) for r in ran if not r.success)
        reflection = reflect(failed, plan)
        assert reflection is not None
        assert reflection.root_cause is RootCause.IGNORED_ERROR
        ignored = next(c for c in failed.tool_calls if c.call_id == reflection.call_id)

        (corrected,) = corrected_retries(run, [(failed, reflection)])
    assert corrected.user_query.startswith(reflection.as_text())
    assert corrected.metadata["seed"] == failed.metadata["seed"]
    same_tool = [c for c in corrected.tool_calls if c.tool == ignored.tool]
    assert same_tool[0].status != CallStatus.SUCCESS, "the fault the attempt ignored is met again"
    assert same_tool[0].error_code == ignored.error_code
    assert same_tool[1].status == CallStatus.SUCCESS, "and the expert calls again"
