"""PPO for the structured policy on a Gymnasium view of an environment.

Each round: sample ``num_envs × rollout_steps`` steps, estimate advantages with GAE (one fixed λ), then take
``epochs × minibatches`` Adam steps on the clipped surrogate, the reward critic's squared error and an
entropy bonus. Advantages are normalised per minibatch. The risk critic is not trained (see `aaac`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sessionrl.envs.gym import StructuredEnv
from sessionrl.policy.structured import StructuredPolicy
from sessionrl.train.losses import clipped_pg_loss, gae, value_loss
from sessionrl.train.structured_rollout import (
    IterationLog,
    StructuredRun,
    StructuredRunConfig,
    build_run,
    minibatches,
    normalise,
    round_log,
    torch_threads,
)


@dataclass(frozen=True, slots=True)
class PPOConfig:
    """PPO: the run's shape and the GAE λ."""

    run: StructuredRunConfig = field(
        default_factory=StructuredRunConfig, metadata={"help": "shape of the run"}
    )
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
    for the same `config.run`, e.g. by `structured_imitation.imitate`). `on_log` sees every round's log."""
    cfg = config.run
    policy, encoder, collector, optimizer = build_run(env, cfg, policy)
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    with torch_threads(cfg.threads):
        history = []
        for iteration in range(cfg.iterations):
            # rollout
            seen = len(collector.episodes)
            batch = collector.collect(policy)

            # advantages
            advantages, returns = (
                batch.flat(x)
                for x in gae(
                    batch.rewards, batch.values, batch.dones, cfg.gamma, config.gae_lambda, batch.next_value
                )
            )
            obs, text, mask = batch.flat(batch.obs), batch.flat(batch.text), batch.flat(batch.mask)
            action, old_logp = batch.flat_action(), batch.flat(batch.logp)

            # update
            stats = torch.zeros(5)
            for _ in range(cfg.epochs):
                for idx in minibatches(cfg.batch_size, cfg.minibatches, generator):
                    out = policy(obs[idx], text[idx], mask[idx])
                    taken = action[idx]
                    ones = torch.ones(len(idx))
                    logp = out.dist.log_prob(taken)
                    pg = clipped_pg_loss(logp, old_logp[idx], normalise(advantages[idx]), ones, cfg.clip_eps)
                    critic = value_loss(out.value, returns[idx], ones)
                    entropy = out.dist.entropy(taken.skill).mean()
                    loss = pg.loss + cfg.value_coef * critic - cfg.entropy_coef * entropy
                    optimizer.zero_grad(set_to_none=True)
                    torch.autograd.backward(loss)
                    torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                    optimizer.step()
                    stats += torch.tensor(
                        [pg.loss.item(), critic.item(), entropy.item(), pg.approx_kl, pg.clip_fraction]
                    )

            # log
            stats /= cfg.epochs * cfg.minibatches
            log = round_log(iteration, collector, seen, stats, mean_lambda=config.gae_lambda, kl_beta=0.0)
            history.append(log)
            if on_log is not None:
                on_log(log)
    return StructuredRun(policy, encoder, tuple(history))


__all__ = ["PPOConfig", "train_ppo"]
