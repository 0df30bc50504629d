"""Structured rollouts: shapes, episode bookkeeping, masks respected, summaries by hand, and imitation."""

from __future__ import annotations

import pytest
import torch

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.policy.structured import StructuredAction
from sessionrl.train.structured.imitation import ImitationConfig, clone, demonstrations, expert_action
from sessionrl.train.structured.rollout import (
    EpisodeStats,
    StructuredRunConfig,
    Summary,
    build_run,
    minibatches,
    normalise,
)
from sessionrl.train.threads import torch_threads

ENV = OrdersEnv(DomainConfig(train=24, dev=0, test=0, time_factor=0, transient_failures=False))


def test_a_rollout_has_one_entry_per_env_and_step() -> None:
    """[N, T] tensors; episode_step restarts at 0 after every done; every taken skill was allowed; each done
    closed one recorded episode."""
    run = StructuredRunConfig(num_envs=3, rollout_steps=20, seed=1)
    policy, _, collector = build_run(ENV, run)
    with torch_threads(1):
        batch = collector.collect(policy)
    assert batch.rewards.shape == batch.dones.shape == batch.logp.shape == (3, 20)
    assert batch.obs.shape == (3, 20, policy.obs_dim)
    assert batch.next_value.shape == (3,)
    assert bool(batch.mask.gather(2, batch.action.skill[..., None]).all())
    after_done = batch.episode_step[:, 1:][batch.dones[:, :-1] > 0]
    assert bool((after_done == 0).all())
    assert int(batch.dones.sum()) == len(collector.episodes)
    assert collector.env_steps == 60
    assert sum(e.steps for e in collector.episodes) <= 60


def test_a_rollout_is_scored_as_its_steps_were_seen() -> None:
    """The one batched pass after the rollout gives each step the log-probability and values the policy
    gives that step alone, and each step keeps the query it was acted on: a query changes only at the step
    after a done (the next episode's first), never within an episode."""
    run = StructuredRunConfig(num_envs=3, rollout_steps=24, seed=2)
    policy, _, collector = build_run(ENV, run)
    with torch_threads(1):
        batch = collector.collect(policy)
    assert int(batch.dones.sum()) > 0
    with torch.no_grad():
        for step in range(24):
            out = policy(batch.obs[:, step], batch.text[:, step], batch.mask[:, step])
            taken = StructuredAction(
                *(x[:, step] for x in (batch.action.skill, batch.action.raw, batch.action.choice))
            )
            torch.testing.assert_close(out.dist.log_prob(taken), batch.logp[:, step], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(out.value, batch.values[:, step], rtol=1e-5, atol=1e-5)
    same = (batch.text[:, 1:] == batch.text[:, :-1]).all(-1)
    assert bool(same[batch.dones[:, :-1] == 0].all())


def test_summary_by_hand() -> None:
    """2 episodes, 1 solved: completion 1/2; steps (3 + 5)/2 = 4; risky calls 1 of 2 + 4 calls = 1/6."""
    episodes = [EpisodeStats("a", True, 3, 2, 0), EpisodeStats("b", False, 5, 4, 1)]
    summary = Summary.of(episodes)
    assert (summary.episodes, summary.completion, summary.mean_steps) == (2, 0.5, 4.0)
    assert summary.risk_share == pytest.approx(1 / 6)
    assert Summary.of([]) == Summary(0, 0.0, 0.0, 0.0)


def test_minibatches_partition_the_batch() -> None:
    parts = minibatches(10, 3, torch.Generator().manual_seed(0))
    assert sorted(torch.cat(parts).tolist()) == list(range(10))
    assert sorted(len(p) for p in parts) == [3, 3, 4]
    assert normalise(torch.tensor([5.0])).tolist() == [0.0]


def test_expert_plans_replay_as_policy_actions() -> None:
    """Every demonstrated plan solves its task through the Gymnasium view, so the write-back into the
    policy's coordinates (atanh of the scaled number, index of the choice) loses nothing that matters."""
    run = StructuredRunConfig(num_envs=1)
    policy, encoder, _ = build_run(ENV, run)
    tasks = list(ENV.tasks(Split.TRAIN))
    demos = demonstrations(ENV, tasks, policy.layout, encoder, run)
    assert (demos.solved, demos.tasks) == (len(tasks), len(tasks))
    finish = len(ENV.contracts())
    assert int((demos.action.skill == finish).sum()) == len(tasks)


def test_a_refund_is_written_back_exactly() -> None:
    """amount 23.4 in [0.01, 100] → x = 2·(23.4 - 0.01)/99.99 - 1, u = atanh(x); tanh(u) decodes to 23.4."""
    run = StructuredRunConfig(num_envs=1)
    policy, _, collector = build_run(ENV, run)
    gym_env = collector.envs[0]
    assert isinstance(gym_env, DecisionGymEnv)  # no prototypes: the atomic view
    task = next(t for t in ENV.tasks(Split.TRAIN) if t.payload["issue"] == "damaged_item")
    gym_env.reset(options={"task_id": task.task_id})
    bounds = gym_env.episode.param_bounds()["refund_trigger"]["amount"]
    action = expert_action(
        gym_env, policy.layout, "refund_trigger", {"amount": 23.4, "reason": "late_delivery"}
    )
    values = gym_env.decode("refund_trigger", policy.layout.env_params(action)[0].tolist())
    low, high = bounds
    assert values["amount"] == pytest.approx(23.4, abs=1e-4 * (high - low))
    assert values["reason"] == "late_delivery"


def test_cloning_fits_the_demonstrations() -> None:
    run = StructuredRunConfig(num_envs=1)
    policy, encoder, _ = build_run(ENV, run)
    demos = demonstrations(ENV, list(ENV.tasks(Split.TRAIN)), policy.layout, encoder, run)
    with torch_threads(1):
        losses = clone(policy, demos, ImitationConfig(epochs=200, lr=1e-2))
    assert losses[-1] < losses[0] / 5
    with torch.no_grad():
        greedy = policy(demos.obs, demos.text, demos.mask).dist.mode()
    assert (greedy.skill == demos.action.skill).float().mean().item() >= 0.95
