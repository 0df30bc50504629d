"""PPO for the structured policy (`sessionrl.policy.structured`) on a Gymnasium view of an environment.

Each round: sample ``num_envs × rollout_steps`` steps, estimate advantages with GAE (one fixed λ), then take
``epochs × minibatches`` Adam steps on the clipped surrogate, the reward critic's squared error and an
entropy bonus. Advantages are normalised per minibatch. The risk critic is not trained (see `aaac`).

`train_clipped` is that round loop with the advantage estimate passed in, and optionally a KL penalty and
the risk critic's targets: `train_ppo` runs it with plain GAE, `aaac.train_aaac` with its own estimate.
`UpdateConfig` holds the loop's update settings, which both trainers' configs carry.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sessionrl.envs.gym import StructuredEnv
from sessionrl.policy.structured import PolicyOutput, StructuredPolicy
from sessionrl.train.losses import (
    clipped_pg_loss,
    gae,
    kl_penalty,
    quantile_huber_loss,
    quantile_midpoints,
    value_loss,
)
from sessionrl.train.structured.rollout import (
    IterationLog,
    Rollout,
    StepStats,
    StructuredRun,
    StructuredRunConfig,
    build_run,
    minibatches,
    normalise,
    round_log,
    torch_threads,
)


@dataclass(frozen=True, slots=True)
class UpdateConfig:
    """How each round's data updates the policy: epochs of minibatch steps on the clipped surrogate, the
    critics' squared error and an entropy bonus."""

    epochs: int = field(default=4, metadata={"help": "passes over each round's data"})
    minibatches: int = field(default=4, metadata={"help": "minibatches per pass"})
    lr: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
    gamma: float = field(default=0.99, metadata={"help": "discount per step"})
    clip_eps: float = field(default=0.2, metadata={"help": "ratio clip ε"})
    value_coef: float = field(default=0.5, metadata={"help": "weight of the critic loss(es)"})
    entropy_coef: float = field(default=0.01, metadata={"help": "weight of the entropy bonus"})
    max_grad_norm: float = field(default=0.5, metadata={"help": "gradient norm clip"})

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.minibatches < 1:
            raise ValueError("UpdateConfig needs epochs >= 1 and minibatches >= 1")
        if self.lr <= 0 or not 0 < self.gamma <= 1 or self.clip_eps <= 0 or self.max_grad_norm <= 0:
            raise ValueError("UpdateConfig needs lr > 0, 0 < gamma <= 1, clip_eps > 0, max_grad_norm > 0")


@dataclass(frozen=True, slots=True)
class PPOConfig:
    """PPO: the run's shape, the update and the GAE λ."""

    run: StructuredRunConfig = field(
        default_factory=StructuredRunConfig, metadata={"help": "shape of the run"}
    )
    update: UpdateConfig = field(default_factory=UpdateConfig, metadata={"help": "each round's update"})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE λ, the same for every episode"})

    def __post_init__(self) -> None:
        if not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"PPOConfig.gae_lambda must be in [0, 1], got {self.gae_lambda}")


def train_ppo(
    env: StructuredEnv,
    config: PPOConfig,
    *,
    policy: StructuredPolicy | None = None,
    on_log: Callable[[IterationLog], None] | None = None,
) -> StructuredRun:
    """Train a structured policy on the training tasks of `env`: a fresh one, or a copy of `policy` (built
    for the same `config.run`, e.g. by `imitation.imitate`). `on_log` sees every round's log."""
    return train_clipped(
        env,
        config.run,
        config.update,
        lambda batch: gae_targets(batch, config),
        policy=policy,
        on_log=on_log,
    )


@dataclass(frozen=True)
class RoundTargets:
    """What one round's rollout teaches, flat over its ``[N·T]`` steps.

    `advantages` drive the clipped surrogate (normalised per minibatch), `returns` are the reward critic's
    targets and `risk_returns` the risk critic's (None: the risk critic is not trained); `mean_lambda` is
    the mean λ they were estimated with, for the round's log.
    """

    advantages: Tensor
    returns: Tensor
    risk_returns: Tensor | None
    mean_lambda: float


def gae_targets(batch: Rollout, config: PPOConfig) -> RoundTargets:
    """PPO's targets: GAE with the one λ ``config.gae_lambda`` for the reward critic only."""
    advantages, returns = gae(
        batch.rewards, batch.values, batch.dones, config.update.gamma, config.gae_lambda, batch.next_value
    )
    return RoundTargets(batch.flat(advantages), batch.flat(returns), None, config.gae_lambda)


def risk_loss(out: PolicyOutput, returns: Tensor) -> Tensor:
    """The risk critic's loss against its targets ``[B]``: squared error of its one value, or the quantile
    Huber loss of its quantiles (each target one sample of the return's distribution)."""
    if out.risk_quantiles is None:
        return value_loss(out.risk_value, returns, None)
    taus = quantile_midpoints(out.risk_quantiles.shape[-1]).to(out.risk_quantiles)
    return quantile_huber_loss(out.risk_quantiles, returns[:, None], taus)


def train_clipped(
    env: StructuredEnv,
    cfg: StructuredRunConfig,
    update: UpdateConfig,
    targets: Callable[[Rollout], RoundTargets],
    *,
    kl_beta: Callable[[int], float] | None = None,
    policy: StructuredPolicy | None = None,
    on_log: Callable[[IterationLog], None] | None = None,
) -> StructuredRun:
    """Rounds of rollout, `targets` of the rollout, then clipped-surrogate updates (see the module doc).

    With `kl_beta`, each update also pays ``kl_beta(t) · KL(π_old ‖ π_θ)`` (k3, on the round's own samples)
    after ``t`` earlier optimiser steps, and the log's `kl_beta` is the last coefficient used (else 0).
    `policy` and `on_log` are as for `train_ppo`.
    """
    policy, encoder, collector = build_run(env, cfg, policy)
    # fused: one kernel over every parameter; per-parameter steps cost more than the maths of a small net
    optimizer = torch.optim.Adam(policy.param_groups(update.lr), eps=1e-5, fused=True)
    parameters = list(policy.parameters())
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    with torch_threads(cfg.threads), closing(collector):
        history, updates, beta = [], 0, 0.0
        for iteration in range(cfg.iterations):
            # rollout
            seen = len(collector.episodes)
            batch = collector.collect(policy)

            # advantages
            target = targets(batch)
            obs, text, mask = batch.flat(batch.obs), batch.flat(batch.text), batch.flat(batch.mask)
            action, old_logp = batch.flat_action(), batch.flat(batch.logp)

            # update
            steps: list[StepStats] = []
            for _ in range(update.epochs):
                for idx in minibatches(cfg.batch_size, update.minibatches, generator):
                    out = policy(obs[idx], text[idx], mask[idx])
                    taken = action[idx]
                    logp = out.dist.log_prob(taken)
                    advantages = normalise(target.advantages[idx])
                    # every step of a minibatch counts: no mask
                    pg = clipped_pg_loss(logp, old_logp[idx], advantages, None, update.clip_eps)
                    loss = pg.loss
                    if kl_beta is not None:
                        beta = kl_beta(updates)
                        loss = loss + beta * kl_penalty(old_logp[idx], logp, None)
                    critics = value_loss(out.value, target.returns[idx], None)
                    if target.risk_returns is not None:
                        critics = critics + risk_loss(out, target.risk_returns[idx])
                    entropy = out.dist.entropy(taken.skill).mean()
                    loss = loss + update.value_coef * critics - update.entropy_coef * entropy
                    optimizer.zero_grad(set_to_none=True)
                    torch.autograd.backward(loss)
                    torch.nn.utils.clip_grad_norm_(parameters, update.max_grad_norm, foreach=True)
                    optimizer.step()
                    updates += 1
                    stats = (pg.loss.item(), critics.item(), entropy.item(), pg.approx_kl, pg.clip_fraction)
                    steps.append(StepStats(*stats))

            # log
            mean = StepStats.mean(steps)
            log = round_log(iteration, collector, seen, mean, mean_lambda=target.mean_lambda, kl_beta=beta)
            history.append(log)
            if on_log is not None:
                on_log(log)
    return StructuredRun(policy, encoder, tuple(history))


__all__ = [
    "PPOConfig",
    "RoundTargets",
    "UpdateConfig",
    "gae_targets",
    "risk_loss",
    "train_clipped",
    "train_ppo",
]
