"""PPO for the structured policy (`sessionrl.policy.structured`) on a Gymnasium view of an environment.

Each round: sample ``num_envs × rollout_steps`` steps, estimate advantages with GAE (one fixed λ), then take
``epochs × minibatches`` Adam steps on the clipped surrogate, the reward critic's squared error and an
entropy bonus. Advantages are normalised per minibatch. The risk critic is not trained (see `aaac`).

From a given start policy (a clone of the expert), each step also pays an `Anchor`: a decaying
``KL(π_start ‖ π_θ)`` that keeps RL from trading what imitation gave for noise in its first rounds
(``update.anchor_coef``, on by default; docs/structured-rl.md has the measurements). Optionally the first
``update.critic_warmup`` rounds train the critics alone.

`train_clipped` is that round loop with the advantage estimate passed in, and optionally a KL penalty and
the risk critic's targets: `train_ppo` runs it with plain GAE, `aaac.train_aaac` with its own estimate.
`UpdateConfig` holds the loop's update settings, which both trainers' configs carry.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sessionrl.envs.gym import StructuredEnv
from sessionrl.policy.structured import PolicyOutput, StructuredPolicy
from sessionrl.train.losses import (
    clipped_pg_loss,
    decaying_beta,
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
)
from sessionrl.train.threads import torch_threads


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
    critic_warmup: int = field(
        default=0,
        metadata={"help": "first rounds that train the critics alone, on the starting policy's rollouts"},
    )
    anchor_coef: float = field(
        default=1.0,
        metadata={"help": "weight of KL(start ‖ π) at the first step, when RL starts from a given policy"},
    )
    anchor_decay: float = field(
        default=0.999, metadata={"help": "the anchor's weight shrinks by this factor per policy step"}
    )

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.minibatches < 1:
            raise ValueError("UpdateConfig needs epochs >= 1 and minibatches >= 1")
        if self.lr <= 0 or not 0 < self.gamma <= 1 or self.clip_eps <= 0 or self.max_grad_norm <= 0:
            raise ValueError("UpdateConfig needs lr > 0, 0 < gamma <= 1, clip_eps > 0, max_grad_norm > 0")
        if self.critic_warmup < 0 or self.anchor_coef < 0 or not 0 <= self.anchor_decay <= 1:
            raise ValueError(
                "UpdateConfig needs critic_warmup >= 0, anchor_coef >= 0 and anchor_decay in [0, 1]"
            )


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


@dataclass(frozen=True)
class Anchor:
    """The policy RL started from (frozen) and the schedule of the penalty that keeps the trained policy
    near it: ``coef · decay^t · KL(π_start ‖ π_θ)`` after ``t`` policy steps, the exact KL of the whole
    action (`StructuredDist.kl`) on each minibatch's states. As the KL runs from the start policy, its
    gradient is that of behaviour cloning with the start policy's probabilities as soft targets."""

    reference: StructuredPolicy
    coef: float
    decay: float

    @classmethod
    def of(cls, start: StructuredPolicy | None, update: UpdateConfig) -> Anchor | None:
        """The anchor of a run from `start` (None without a start policy or with ``anchor_coef = 0``)."""
        if start is None or update.anchor_coef == 0:
            return None
        frozen = copy.deepcopy(start).requires_grad_(False)
        return cls(frozen, update.anchor_coef, update.anchor_decay)

    def weight(self, steps: int) -> float:
        """The penalty's weight after `steps` policy steps."""
        return decaying_beta(steps, self.coef, self.decay)

    def kl(self, out: PolicyOutput, obs: Tensor, text: Tensor, mask: Tensor) -> Tensor:
        """Mean ``KL(π_start ‖ π_θ)`` over the states, `out` being π_θ's pass over them."""
        with torch.no_grad():
            start = self.reference.act(obs, text, mask)
        return start.kl(out.dist).mean()


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

    The first ``update.critic_warmup`` rounds train the critics alone (the policy that samples them is the
    start policy). With `kl_beta`, each policy step also pays ``kl_beta(t) · KL(π_old ‖ π_θ)`` (k3, on the
    round's own samples) after ``t`` earlier policy steps, and the log's `kl_beta` is the last coefficient
    used (else 0). From a given `policy` with ``update.anchor_coef > 0``, each policy step also pays the
    `Anchor` penalty. `policy` and `on_log` are as for `train_ppo`.
    """
    anchor = Anchor.of(policy, update)
    policy, encoder, collector = build_run(env, cfg, policy)
    # fused: one kernel over every parameter; per-parameter steps cost more than the maths of a small net
    optimizer = torch.optim.Adam(policy.param_groups(update.lr), eps=1e-5, fused=True)
    parameters = list(policy.parameters())
    generator = torch.Generator().manual_seed(cfg.seed + 1)
    with torch_threads(cfg.threads), closing(collector):
        history, updates = [], 0
        weights = Weights()
        for iteration in range(cfg.iterations):
            # rollout
            seen = len(collector.episodes)
            batch = collector.collect(policy)

            # advantages
            target = targets(batch)
            warmup = iteration < update.critic_warmup

            # update
            steps: list[StepStats] = []
            for _ in range(update.epochs):
                for idx in minibatches(cfg.batch_size, update.minibatches, generator):
                    if not warmup:
                        beta = kl_beta(updates) if kl_beta is not None else 0.0
                        weights = Weights(True, beta, anchor.weight(updates) if anchor is not None else 0.0)
                    loss, stats = minibatch_loss(policy, batch, target, idx, update, weights, anchor)
                    optimizer.zero_grad(set_to_none=True)
                    torch.autograd.backward(loss)
                    torch.nn.utils.clip_grad_norm_(parameters, update.max_grad_norm, foreach=True)
                    optimizer.step()
                    updates += not warmup
                    steps.append(stats)

            # log
            mean = StepStats.mean(steps)
            log = round_log(
                iteration,
                collector,
                seen,
                mean,
                mean_lambda=target.mean_lambda,
                kl_beta=weights.kl_beta,
                anchor_coef=weights.anchor,
            )
            history.append(log)
            if on_log is not None:
                on_log(log)
    return StructuredRun(policy, encoder, tuple(history))


@dataclass(frozen=True, slots=True)
class Weights:
    """What one optimiser step trains: the policy too (False: a critic warm-up step) and, with it, the
    weights of the KL to the sampling policy and of the anchor to the start policy."""

    policy: bool = False
    kl_beta: float = 0.0
    anchor: float = 0.0


def minibatch_loss(
    policy: StructuredPolicy,
    batch: Rollout,
    target: RoundTargets,
    idx: Tensor,
    update: UpdateConfig,
    weights: Weights,
    anchor: Anchor | None,
) -> tuple[Tensor, StepStats]:
    """The loss of one minibatch (rows `idx` of the flattened round) and its diagnostics: the clipped
    surrogate, the critics' error, the entropy bonus and, with their `weights`, the KL to the sampling
    policy and the anchor; in a warm-up step (``weights.policy`` False) the critics' error alone."""
    obs, text, mask = (batch.flat(x)[idx] for x in (batch.obs, batch.text, batch.mask))
    old_logp, taken = batch.flat(batch.logp)[idx], batch.flat_action()[idx]
    out = policy(obs, text, mask)
    critics = value_loss(out.value, target.returns[idx], None)
    if target.risk_returns is not None:
        critics = critics + risk_loss(out, target.risk_returns[idx])
    logp = out.dist.log_prob(taken)
    # every step of a minibatch counts: no mask
    pg = clipped_pg_loss(logp, old_logp, normalise(target.advantages[idx]), None, update.clip_eps)
    entropy = out.dist.entropy(taken.skill).mean()
    drift = anchor.kl(out, obs, text, mask) if anchor is not None else torch.zeros(())
    loss = update.value_coef * critics
    if weights.policy:
        loss = loss + pg.loss - update.entropy_coef * entropy + weights.anchor * drift
        loss = loss + weights.kl_beta * kl_penalty(old_logp, logp, None)
    stats = (pg.loss.item(), critics.item(), entropy.item(), pg.approx_kl, pg.clip_fraction, drift.item())
    return loss, StepStats(*stats)


__all__ = [
    "Anchor",
    "PPOConfig",
    "RoundTargets",
    "UpdateConfig",
    "Weights",
    "gae_targets",
    "minibatch_loss",
    "risk_loss",
    "train_clipped",
    "train_ppo",
]
