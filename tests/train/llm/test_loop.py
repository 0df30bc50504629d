"""The whole loop on a tiny model with every part real: store, orchestrator, skills, rewards, orders env."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from sessionrl.envs.base import Split
from sessionrl.episodes import RolloutConfig, run_episodes
from sessionrl.episodes.llm import PolicyAgent
from sessionrl.eval.collapse import CollapseWatch, Health
from sessionrl.policy.llm import SamplingConfig
from sessionrl.policy.tiny import TinyModelConfig
from sessionrl.session.model import SessionState
from sessionrl.store import SessionStore
from sessionrl.train.config import EnvSection, EvalSection, ModelSection, RLSection, RunConfig, SFTSection
from sessionrl.train.llm.checkpoint import read_state
from sessionrl.train.llm.evaluation import evaluate
from sessionrl.train.llm.grpo import GRPOConfig
from sessionrl.train.llm.loop import learn, resumed_policy, rl_specs, start_rl, train
from sessionrl.train.llm.reflection import attempt
from sessionrl.train.llm.run import open_run
from sessionrl.train.llm.sft import SFTConfig

pytestmark = pytest.mark.slow
SMALL = TinyModelConfig(vocab_size=700, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def tiny_run(folder: Path, iterations: int) -> RunConfig:
    return RunConfig(
        run_dir=folder,
        env=EnvSection(train=16, dev=4, test=4),
        model=ModelSection(tiny=SMALL),
        rollout=RolloutConfig(max_steps=3, full_schemas=False, domain_policy=False, max_tool_chars=120),
        sft=SFTSection(demos=6, trainer=SFTConfig(steps=3, batch_sessions=4, token_budget=4096)),
        rl=RLSection(
            iterations=iterations,
            tasks_per_iteration=2,
            sampling=SamplingConfig(max_new_tokens=16),
            trainer=GRPOConfig(group_size=2, token_budget=4096),
        ),
        evaluation=EvalSection(tasks=2, gate_tasks=2, max_new_tokens=16),
    )


def test_imitation_then_grpo_writes_everything_and_resumes(tmp_path: Path) -> None:
    config = tiny_run(tmp_path / "run", iterations=1)
    result = train(config)
    assert result.stage == "rl"
    assert result.gate is not None
    assert result.gate.metrics.n_tasks == 2
    assert [r["iteration"] for r in result.curve] == [0]
    folder = config.run_dir
    for name in (
        "config.yaml",
        "sessions.db",
        "sft_policy",
        "rl_policy",
        "checkpoint",
        "metrics.jsonl",
        "tb",
    ):
        assert (folder / name).exists(), name
    with pytest.raises(FileExistsError):
        train(config)

    # every RL session was judged and scored, and its policy calls carry tokens, logprobs and version 0
    with SessionStore.open(f"sqlite:///{folder / 'sessions.db'}") as store:
        rl = [store.get(s) for s in store.session_ids() if s.startswith("rl-")]
        assert len(rl) == 2 * 2
        for session in rl:
            assert session.state is SessionState.FINISHED
            assert session.metadata["group"].startswith("0:")
            assert store.reward(session.session_id).vector["long_term_reward"] is not None
            calls = session.llm_calls
            assert calls
            assert all(c.token_ids and c.logprobs and c.policy_version == 0 for c in calls)
        demos = [s for s in store.session_ids() if s.startswith("demo-")]
        assert len(demos) == 6

    # a run stopped after logging iteration 1 but before its checkpoint left a record the resume redoes
    with (folder / "metrics.jsonl").open("a", encoding="utf-8") as log:
        log.write(json.dumps({"stage": "rl", "step": 1, "time": time.time(), "iteration": 1}) + "\n")
    # resume with a longer schedule: iteration 0 is kept as it was, iteration 1 runs with version 1
    longer = tiny_run(folder, iterations=2)
    resumed = train(longer, resume=True)
    assert [r["iteration"] for r in resumed.curve] == [0, 1]
    assert resumed.curve[0] == result.curve[0]
    state = read_state(folder / "checkpoint")
    assert state is not None
    assert state.policy_version == 2
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records if r["stage"] == "rl"] == [0, 1]
    # every update reports the sampler/trainer mismatch; the sampler recorded every token's logprob
    updates = [r for r in records if r["stage"] == "rl" and "loss" in r]
    assert updates
    for r in updates:
        assert r["is_missing"] == 0.0
        assert 0.0 <= r["is_truncated"] <= 1.0
        assert 0.0 <= r["is_abs_diff"] < 0.05, "the in-process sampler scores tokens as the trainer does"
    # the watch said once which rules the imitation policy's rollouts left it unable to fire (the tiny
    # policy usually solves none of iteration 0's tasks; a baseline that leaves every rule able to fire
    # logs no such record)
    watch = CollapseWatch(longer.rl.collapse)
    watch.observe(0, Health.from_record(result.curve[0]))
    said = [r["rules"] for r in records if r["stage"] == "blind"]
    assert said == ([list(watch.blind)] if watch.blind else [])
    kinds = [(r["stage"], r["step"], r.get("label"), *sorted(set(r) - {"time"})) for r in records]
    assert len(kinds) == len(set(kinds)), "a resumed run logs each step once"
    # the imitation policy is the same, so its evaluation is read back; the RL policy trained further, so
    # it is evaluated anew rather than reported from the first run's sessions
    ids = {label: [s.session_id for s in e.sessions] for label, e in result.report.items()}
    assert [s.session_id for s in resumed.report["sft"].sessions] == ids["sft"]
    assert not {s.session_id for s in resumed.report["rl"].sessions} & set(ids["rl"])


def test_a_loaded_checkpoint_takes_the_same_next_batch_and_makes_the_same_update(tmp_path: Path) -> None:
    config = tiny_run(tmp_path / "run", iterations=1)
    train(config)
    # more scored sessions arrive after the checkpoint: a second run of iteration 0's episodes
    with open_run(config) as run:
        run.policy = resumed_policy(run)
        start_rl(run, resume=True)
        specs = [dataclasses.replace(s, session_id=s.session_id + "-again") for s in rl_specs(run, 0)]
        asyncio.run(run_episodes(run.env, specs, PolicyAgent(run.policy, 0), run.store, config.rollout))
        run.shaper.follow(run.state.reward_cursor)

    outcomes = []
    for _ in range(2):
        with open_run(config) as run:
            run.policy = resumed_policy(run)
            trainer = start_rl(run, resume=True)
            learned = learn(run, trainer)
            state = {k: v.clone() for k, v in run.need_policy().model.state_dict().items()}
            outcomes.append((learned.session_ids, state))
    (ids_a, weights_a), (ids_b, weights_b) = outcomes
    assert ids_a == ids_b
    assert len(ids_a) == 4
    assert all(i.endswith("-again") for i in ids_a)
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def test_rl_draws_unseen_tasks_when_asked_and_a_group_shares_its_faults(tmp_path: Path) -> None:
    config = tiny_run(tmp_path / "run", iterations=1)
    unseen = config.model_copy(update={"rl": config.rl.model_copy(update={"unseen_tasks": True})})
    with open_run(unseen) as run:
        imitated = {t.task_id for t in run.env.tasks(Split.TRAIN)[: unseen.sft.demos]}
        specs = [s for i in range(6) for s in rl_specs(run, i)]
    assert not imitated & {s.task.task_id for s in specs}
    seeds: dict[str, list[int]] = {}
    for spec in specs:
        seeds.setdefault(spec.metadata["group"], []).append(spec.seed)
    assert all(len(group) == unseen.rl.trainer.group_size == 2 for group in seeds.values())
    assert all(len(set(group)) == 1 for group in seeds.values())  # the same env seed: the same faults
    everything = unseen.model_copy(update={"sft": unseen.sft.model_copy(update={"demos": 16})})
    with open_run(everything) as run, pytest.raises(ValueError, match="unseen_tasks"):
        rl_specs(run, 0)


def test_a_seed_gives_the_same_run_twice(tmp_path: Path) -> None:
    """Two runs of one seed take the same samples, rewards and updates, and end with the same weights bit
    for bit: rollouts sample in lockstep rounds (identical conversations in the order of their sessions'
    ids), the shaper scores in the order of ids, updates read sequences in an order of their own, and
    feedback that gives no time is not late. Before those last three, runs differed in the 8th digit of a
    loss and then in their samples."""
    runs = []
    for name in ("first", "second"):
        config = tiny_run(tmp_path / name, iterations=2)
        result = train(config)
        timing = {"seconds", "rollout_s", "rewards_s", "learn_s"}
        curve = [{k: v for k, v in record.items() if k not in timing} for record in result.curve]
        weights = load_file(str(config.run_dir / "rl_policy" / "model.safetensors"))
        runs.append((curve, weights))
    (curve_a, weights_a), (curve_b, weights_b) = runs
    assert any("tokens" in record for record in curve_a)  # an update happened
    assert curve_a == curve_b
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def test_lora_adapters_start_from_the_seed_whatever_ran_before(tmp_path: Path) -> None:
    """Two runs of one seed must take the same first update: LoRA's B starts at zero, so only A's
    initialisation tells them apart, and it must not depend on the torch draws made before the build."""
    from sessionrl.policy.llm import LoRAConfig
    from sessionrl.train.llm.run import build_policy

    config = tiny_run(tmp_path, 0)
    config = config.model_copy(
        update={"model": config.model.model_copy(update={"lora": LoRAConfig(rank=2, top_blocks=1)})}
    )
    texts = ["orders and refunds", "order 1234 shipped"] * 20
    adapters = []
    for earlier_draws in (1, 7):
        torch.rand(earlier_draws)  # whatever ran before the build drew a different number of values
        policy = build_policy(config, texts, tmp_path / f"base-{earlier_draws}")
        adapters.append({n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_A" in n})
    assert adapters[0]
    assert adapters[0].keys() == adapters[1].keys()
    assert all(torch.equal(adapters[0][n], adapters[1][n]) for n in adapters[0])


def test_an_update_runs_after_the_engine_gave_back_the_rollouts_caches(tmp_path: Path) -> None:
    """The rollouts' key/value caches (gigabytes with a real model) must not sit beside the update's
    activations: no episode continues with the weights that computed them."""
    from sessionrl.policy.sampling import TorchEngine

    config = tiny_run(tmp_path / "run", iterations=1)
    train(config)
    with open_run(config) as run:
        run.policy = resumed_policy(run)
        trainer = start_rl(run, resume=True)
        engine = run.policy.engine
        assert isinstance(engine, TorchEngine)
        specs = [dataclasses.replace(s, session_id=s.session_id + "-again") for s in rl_specs(run, 0)]
        asyncio.run(run_episodes(run.env, specs, PolicyAgent(run.policy, 0), run.store, config.rollout))
        run.shaper.follow(run.state.reward_cursor)
        assert engine.store.entries, "the episodes' turns were kept while they ran"
        kept_at_update: list[int] = []
        step = trainer.step

        def watched(sequences: Any) -> Any:
            kept_at_update.append(len(engine.store.entries))
            return step(sequences)

        trainer.step = watched  # type: ignore[method-assign]
        learned = learn(run, trainer)
    assert learned.stats is not None
    assert kept_at_update == [0]


def test_an_evaluation_gives_back_what_its_episodes_kept(tmp_path: Path) -> None:
    """An evaluation's episodes and tool-accuracy turns, and reflection's attempts, are over when they
    return: the engine keeps none of their caches for a rollout that could never reuse them."""
    from sessionrl.policy.sampling import TorchEngine

    config = tiny_run(tmp_path / "run", iterations=0)
    train(config)
    with open_run(config) as run:
        policy = resumed_policy(run)
        engine = policy.engine
        assert isinstance(engine, TorchEngine)
        evaluated = evaluate(run, policy, Split.DEV, 2, "again", tools=True)
        assert evaluated.metrics.n_tasks == 2
        assert engine.store.builds + engine.store.hits > 0, "the engine kept caches while it ran"
        assert not engine.store.entries
        built = engine.store.builds + engine.store.hits
        tried = attempt(run, policy, run.env.tasks(Split.DEV)[:2], "retry", "cu-retry")  # reflection's
        assert len(tried) == 2
        assert engine.store.builds + engine.store.hits > built
        assert not engine.store.entries
