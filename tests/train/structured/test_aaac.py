"""AAAC: episode rows, per-episode λ against hand-computed GAE, the config, and a short run's plumbing."""

from __future__ import annotations

from contextlib import closing

import pytest
import torch

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.envs.prototypes import expert_prototypes
from sessionrl.policy.structured import PolicyOutput, policy_step
from sessionrl.train.losses import gae
from sessionrl.train.structured.aaac import AAACConfig, adaptive_gae, episode_rows, train_aaac
from sessionrl.train.structured.imitation import ImitationConfig, imitate
from sessionrl.train.structured.ppo import UpdateConfig, risk_loss
from sessionrl.train.structured.rollout import IterationLog, StructuredRunConfig, build_run, evaluate


def test_episode_rows_cut_after_each_done_and_align_right() -> None:
    dones = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 1.0]])
    steps = torch.tensor([[3, 4, 0, 1], [6, 0, 1, 2]])
    rows = episode_rows(dones, steps)
    assert rows.index.tolist() == [[-1, 0, 1], [-1, 2, 3], [-1, -1, 4], [5, 6, 7]]
    assert rows.env.tolist() == [0, 0, 1, 1]
    assert rows.ended.tolist() == [True, False, True, True]
    assert rows.length.tolist() == [5, 2, 7, 3]  # episode_step at the segment's last step + 1


def test_each_episode_gets_its_own_lambda() -> None:
    """One env, three steps: an episode of two steps that ends, then one step of an episode still running.

    γ = 1, V = 0.5 everywhere, bootstrap V(s_3) = 1, λ = 0.5 for 2-step episodes and 0.9 otherwise:
    δ_1 = 2 - 0.5 = 1.5, A_1 = 1.5; δ_0 = 1 + 0.5 - 0.5 = 1, A_0 = 1 + 0.5·1.5 = 1.75;
    δ_2 = 3 + 1·1 - 0.5 = 3.5, A_2 = 3.5 (nothing flows across the done). Returns are A + V.
    """
    rewards = torch.tensor([[1.0, 2.0, 3.0]])
    values = torch.full((1, 3), 0.5)
    dones = torch.tensor([[0.0, 1.0, 0.0]])
    steps = torch.tensor([[0, 1, 0]])

    def lam(length: float) -> float:
        return 0.5 if length == 2 else 0.9

    adv, ret, lams = adaptive_gae(rewards, values, dones, steps, torch.tensor([1.0]), 1.0, lam)
    assert adv[0].tolist() == pytest.approx([1.75, 1.5, 3.5])
    assert ret[0].tolist() == pytest.approx([2.25, 2.0, 4.0])
    assert lams[0].tolist() == pytest.approx([0.5, 0.5, 0.9])


def test_one_lambda_for_all_reduces_to_plain_gae() -> None:
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn((4, 9), generator=generator)
    values = torch.randn((4, 9), generator=generator)
    dones = (torch.rand((4, 9), generator=generator) < 0.3).float()
    steps = torch.randint(0, 5, (4, 9), generator=generator)
    bootstrap = torch.randn(4, generator=generator)
    adv, ret, _ = adaptive_gae(rewards, values, dones, steps, bootstrap, 0.97, lambda _: 0.8)
    want_adv, want_ret = gae(rewards, values, dones, 0.97, 0.8, bootstrap=bootstrap)
    torch.testing.assert_close(adv, want_adv)
    torch.testing.assert_close(ret, want_ret)


def test_lambda_follows_episode_length() -> None:
    config = AAACConfig(short=2, long=12)
    assert [config.lam(n) for n in (1, 2, 7, 12, 30)] == pytest.approx([0.95, 0.95, 0.75, 0.55, 0.55])


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"short": 5, "long": 5}, "greater than short"),
        ({"lam_long": 1.5}, "lam_long"),
        ({"beta0": -1}, "beta0"),
    ],
)
def test_config_is_validated(kwargs: dict[str, float], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        AAACConfig(**kwargs)  # type: ignore[arg-type]


def test_a_short_run_trains_both_critics_and_decays_beta() -> None:
    """Two rounds of one epoch of two minibatches: four optimiser steps, so the last β is β0·0.999³; the
    policy, the reward critic and the risk critic all moved."""
    env = OrdersEnv(DomainConfig(train=24, dev=0, test=0, time_factor=0, transient_failures=False))
    run = StructuredRunConfig(iterations=2, num_envs=2, rollout_steps=16, seed=3)
    update = UpdateConfig(epochs=1, minibatches=2)
    logs: list[IterationLog] = []
    result = train_aaac(env, AAACConfig(run=run, update=update, beta0=0.2), on_log=logs.append)
    initial, _, _ = build_run(env, run)  # the same seed builds the same starting policy
    assert [log.env_steps for log in logs] == [32, 64]
    assert logs[-1].kl_beta == pytest.approx(0.2 * 0.999**3)
    for name in ("skill_head", "value_head", "risk_head"):
        before = getattr(initial, name).weight
        after = getattr(result.policy, name).weight
        assert not torch.allclose(before, after), name
    assert all(0.55 <= log.mean_lambda <= 0.95 for log in logs)


def test_a_short_run_with_a_graph_state_and_a_quantile_risk_critic() -> None:
    """The same plumbing with both options on: the GNN and every risk quantile move, and the rollout's risk
    values are the CVaR of the quantiles (the lowest quarter of eight: the two smallest)."""
    env = OrdersEnv(DomainConfig(train=24, dev=0, test=0, time_factor=0, transient_failures=False))
    run = StructuredRunConfig(
        iterations=2, num_envs=2, rollout_steps=8, seed=3, state="graph", risk_quantiles=8, cvar_alpha=0.25
    )
    result = train_aaac(env, AAACConfig(run=run, update=UpdateConfig(epochs=1, minibatches=2)))
    initial, _, collector = build_run(env, run)
    with closing(collector):
        batch = collector.collect(initial)
        out, _, _ = policy_step(initial, collector.obs, collector.text)
    assert out.risk_quantiles is not None
    assert out.risk_quantiles.shape == (2, 8)
    assert torch.allclose(out.risk_value, out.risk_quantiles.sort(-1).values[:, :2].mean(-1))
    assert batch.risk_values.shape == (2, 8)
    assert initial.graph is not None
    assert result.policy.graph is not None
    before = dict(initial.graph.named_parameters())
    moved = {name for name, p in result.policy.graph.named_parameters() if not torch.equal(p, before[name])}
    # everything but the sub-goal input projection: observations have no sub-goal nodes
    assert moved == set(before) - {"inputs.1.weight", "inputs.1.bias"}
    assert not torch.equal(initial.risk_head.weight, result.policy.risk_head.weight)


def test_risk_loss_is_squared_error_or_quantile_huber() -> None:
    dist = None  # the loss reads only the critics' outputs
    returns = torch.tensor([1.0, -1.0])
    scalar = PolicyOutput(dist, torch.zeros(2), torch.zeros(2))  # type: ignore[arg-type]
    assert risk_loss(scalar, returns).item() == pytest.approx(0.5)  # ½·mean(1, 1)
    quantiles = torch.tensor([[0.0, 2.0], [0.0, 2.0]])
    spread = PolicyOutput(dist, torch.zeros(2), torch.zeros(2), quantiles)  # type: ignore[arg-type]
    # row 1 as in the hand-checked loss test (0.25); row 2: u = -1 and -3, weights 1 - τ = 0.75 and 0.25,
    # Huber ½ and 2.5: 0.375 + 0.625 = 1.0
    assert risk_loss(spread, returns).item() == pytest.approx((0.25 + 1.0) / 2)


def test_imitation_then_aaac_with_prototypes_and_evaluation_on_the_same_view() -> None:
    """With prototypes the policy's skill head has the macros between the skills and finish; imitation,
    the trainer and evaluation all act on that view."""
    env = OrdersEnv(DomainConfig(train=24, dev=0, test=4, time_factor=0, transient_failures=False))
    run = StructuredRunConfig(iterations=1, num_envs=2, rollout_steps=8, seed=1, prototypes=4)
    cloned = imitate(env, run, ImitationConfig(demos=6, epochs=2))
    skills = len(DecisionGymEnv(env, Split.TRAIN).skill_names)
    assert cloned.policy.layout.actions == skills + 4 + 1
    result = train_aaac(env, AAACConfig(run=run), policy=cloned.policy)
    prototypes = expert_prototypes(env, 4)
    episodes = evaluate(result.policy, result.encoder, env, Split.TEST, prototypes=prototypes)
    assert len(episodes) == 4
