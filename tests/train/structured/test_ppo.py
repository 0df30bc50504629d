"""PPO on the orders Gymnasium view: a short run beats a random policy; configs are validated."""

from __future__ import annotations

import pytest
import torch

from sessionrl.envs.base import Split
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.train.structured.ppo import PPOConfig, UpdateConfig, train_ppo
from sessionrl.train.structured.rollout import (
    IterationLog,
    StructuredRunConfig,
    Summary,
    build_run,
    evaluate,
)


def test_a_short_run_improves_completion_over_a_random_policy() -> None:
    """8 rounds of 512 steps from scratch, fixed seeds. The untrained policy (near-uniform over the allowed
    skills, sampled) solves almost no held-out ticket; the trained one, greedy, solves more, and wastes
    fewer steps. The sparse reward is first found on stock inquiries (one inventory check, then finish)."""
    env = OrdersEnv(DomainConfig(train=120, dev=0, test=60, time_factor=0, transient_failures=False))
    run = StructuredRunConfig(iterations=8, seed=0)
    logs: list[IterationLog] = []
    trained = train_ppo(env, PPOConfig(run=run), on_log=logs.append)
    untrained, encoder, _ = build_run(env, run)
    random = Summary.of(evaluate(untrained, encoder, env, Split.TEST, greedy=False))
    learned = Summary.of(evaluate(trained.policy, trained.encoder, env, Split.TEST))
    assert learned.completion >= random.completion + 0.1
    assert learned.mean_steps < random.mean_steps
    assert logs[-1].train.completion > logs[0].train.completion
    assert [log.env_steps for log in logs] == [512 * (i + 1) for i in range(8)]
    assert all(log.kl_beta == 0.0 and log.mean_lambda == 0.95 for log in logs)


def test_ppo_leaves_the_risk_critic_alone() -> None:
    """PPO's targets carry no risk returns, so the shared clipped loop gives the risk head no loss: after
    two rounds (four optimiser steps) it is exactly the starting one while the skill and value heads moved."""
    env = OrdersEnv(DomainConfig(train=24, dev=0, test=0, time_factor=0, transient_failures=False))
    run = StructuredRunConfig(iterations=2, num_envs=2, rollout_steps=16, seed=3)
    update = UpdateConfig(epochs=1, minibatches=2)
    trained = train_ppo(env, PPOConfig(run=run, update=update))
    initial, _, _ = build_run(env, run)  # the same seed builds the same starting policy
    torch.testing.assert_close(trained.policy.risk_head.weight, initial.risk_head.weight, rtol=0, atol=0)
    for name in ("skill_head", "value_head"):
        assert not torch.allclose(getattr(initial, name).weight, getattr(trained.policy, name).weight), name


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: PPOConfig(gae_lambda=1.5), "gae_lambda"),
        (lambda: StructuredRunConfig(num_envs=0), "num_envs"),
        (lambda: UpdateConfig(gamma=0.0), "gamma"),
    ],
)
def test_configs_are_validated(build: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        build()  # type: ignore[operator]


def test_run_shape_is_derived() -> None:
    run = StructuredRunConfig(iterations=3, num_envs=4, rollout_steps=10)
    assert (run.batch_size, run.total_steps) == (40, 120)
