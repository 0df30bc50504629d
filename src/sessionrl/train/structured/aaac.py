"""AAAC (adaptive-λ, dual-critic actor-critic) for the structured policy on a Gymnasium view of an env.

What it adds to PPO (`sessionrl.train.structured.ppo`), round by round:

* **adaptive TD(λ)**: every episode gets its own λ from its length (`losses.adaptive_lambda`: short
  episodes lean on Monte Carlo returns, long ones on the critic), used for its advantages and its critics'
  TD(λ) targets. An episode still running when the round ends uses the length it has so far;
* **two critics**: the reward critic learns the environment's return, the risk critic the return of the
  risk signal ``-(new risk flags)``; the policy follows ``0.7·A_reward + 0.3·A_risk``
  (`losses.dual_critic_advantage`), normalised per minibatch. With ``run.risk_quantiles = K > 0`` the risk
  critic is distributional: ``K`` quantiles trained by the quantile Huber loss (`ppo.risk_loss`) on the
  TD(λ) targets, and its value, for the advantages and the bootstrap alike, is their lower-tail CVaR at
  ``run.cvar_alpha``; the risk advantage then compares what happened with the worst ``α`` share of what
  tends to happen, and bootstrapping on the CVaR makes the target an iterated (nested) CVaR;
* **a KL penalty to the previous policy**: ``β_t · KL(π_old ‖ π_θ)``, estimated on the round's own samples
  (k3), with ``β_t = β_0 · 0.999^t`` after ``t`` optimiser steps (`losses.decaying_beta`). The clipped
  surrogate stays, so the penalty adds to the clip rather than replacing it.

From a start policy with an anchor (``update.anchor_coef > 0``, see `ppo.Anchor`), the anchor is AAAC's
KL term and the penalty to the previous policy is off (`kl_penalised`). Both are decaying KL terms, and in
the first rounds ``π_old ≈ π_start``, so together they paid the same KL twice over: at ``β_0 = 2`` and an
anchor of 1 AAAC's rounds moved half as far as PPO's (mean KL(π_old ‖ π_θ) 0.017 against 0.036) and it
gained less from a weak clone (docs/structured-rl.md has the measurements).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from sessionrl.envs.gym import StructuredEnv
from sessionrl.policy.structured import StructuredPolicy
from sessionrl.train.losses import adaptive_lambda, decaying_beta, dual_critic_advantage, gae
from sessionrl.train.structured.ppo import RoundTargets, UpdateConfig, train_clipped
from sessionrl.train.structured.rollout import IterationLog, Rollout, StructuredRun, StructuredRunConfig


@dataclass(frozen=True, slots=True)
class AAACConfig:
    """AAAC: the run's shape, the update, the λ schedule, the critics' weights and the KL schedule."""

    run: StructuredRunConfig = field(
        default_factory=StructuredRunConfig, metadata={"help": "shape of the run"}
    )
    update: UpdateConfig = field(default_factory=UpdateConfig, metadata={"help": "each round's update"})
    short: float = field(default=5.0, metadata={"help": "episodes this long or shorter get lam_short"})
    long: float = field(default=25.0, metadata={"help": "episodes this long or longer get lam_long"})
    lam_short: float = field(default=0.95, metadata={"help": "λ of short episodes"})
    lam_long: float = field(default=0.55, metadata={"help": "λ of long episodes"})
    w_reward: float = field(default=0.7, metadata={"help": "weight of the reward critic's advantage"})
    w_risk: float = field(default=0.3, metadata={"help": "weight of the risk critic's advantage"})
    beta0: float = field(
        default=0.1,
        metadata={"help": "KL coefficient at the first optimiser step (unused when an anchor holds the run)"},
    )
    beta_decay: float = field(default=0.999, metadata={"help": "β shrinks by this factor per optimiser step"})

    def __post_init__(self) -> None:
        if not self.long > self.short:
            raise ValueError(f"AAACConfig.long ({self.long}) must be greater than short ({self.short})")
        for name in ("lam_short", "lam_long", "beta_decay"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"AAACConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.beta0 < 0 or self.w_reward < 0 or self.w_risk < 0:
            raise ValueError("AAACConfig needs beta0, w_reward and w_risk of at least 0")

    def lam(self, episode_length: float) -> float:
        """λ for an episode of `episode_length` steps."""
        return adaptive_lambda(episode_length, self.short, self.long, self.lam_short, self.lam_long)


@dataclass(frozen=True)
class EpisodeRows:
    """A round's steps regrouped as one row per episode segment, right-aligned (padding on the left).

    `index` ``[E, L]`` holds each step's position in the flattened ``[N·T]`` round (-1 for padding); `env`
    ``[E]`` the environment row; `ended` ``[E]`` whether the segment's last step ended its episode; `length`
    ``[E]`` the episode's length at that last step.
    """

    index: Tensor
    env: Tensor
    ended: Tensor
    length: Tensor


def episode_rows(dones: Tensor, episode_step: Tensor) -> EpisodeRows:
    """Cut each environment's ``[T]`` steps after every done; see `EpisodeRows`.

    ``dones`` and ``episode_step`` are ``[N, T]``; ``episode_step`` counts the steps the episode had taken
    before each step, so an episode's length at step ``t`` is ``episode_step[t] + 1``.
    """
    n, t = dones.shape
    segments: list[tuple[int, int, int]] = []  # env, first step, last step
    for env in range(n):
        start = 0
        for step in range(t):
            if dones[env, step] > 0 or step == t - 1:
                segments.append((env, start, step))
                start = step + 1
    width = max(last - first + 1 for _, first, last in segments)
    index = torch.full((len(segments), width), -1, dtype=torch.long)
    for row, (env, first, last) in enumerate(segments):
        size = last - first + 1
        index[row, width - size :] = torch.arange(env * t + first, env * t + last + 1)
    envs = torch.tensor([env for env, _, _ in segments])
    lasts = torch.tensor([last for _, _, last in segments])
    return EpisodeRows(
        index=index, env=envs, ended=dones[envs, lasts] > 0, length=episode_step[envs, lasts] + 1
    )


def adaptive_gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    episode_step: Tensor,
    bootstrap: Tensor,
    gamma: float,
    lam: Callable[[float], float],
) -> tuple[Tensor, Tensor, Tensor]:
    """GAE with one λ per episode, ``lam(episode length)``; returns ``(advantages, returns, λ)``, each
    ``[N, T]`` like the inputs. ``bootstrap`` ``[N]`` values the state after each environment's last step.

    Episodes are regrouped into right-aligned rows (`episode_rows`) so `losses.gae` runs once over them with
    a ``[E]`` λ; the left padding (reward 0, value 0, done) adds nothing to the real steps.
    """
    rows = episode_rows(dones, episode_step)
    valid = rows.index >= 0
    where = rows.index.clamp_min(0)

    def gather(x: Tensor, pad: float) -> Tensor:
        return torch.where(valid, x.reshape(-1)[where], torch.full_like(where, pad, dtype=x.dtype))

    row_dones = gather(dones.to(rewards.dtype), 1.0)
    lams = torch.tensor([lam(float(length)) for length in rows.length], dtype=rewards.dtype)
    boot = bootstrap[rows.env] * (~rows.ended).to(rewards.dtype)
    adv_rows, ret_rows = gae(gather(rewards, 0.0), gather(values, 0.0), row_dones, gamma, lams, boot)
    advantages, returns, per_step = (torch.zeros(rewards.numel(), dtype=rewards.dtype) for _ in range(3))
    advantages[rows.index[valid]] = adv_rows[valid]
    returns[rows.index[valid]] = ret_rows[valid]
    per_step[rows.index[valid]] = lams[:, None].expand_as(valid)[valid]
    return advantages.view_as(rewards), returns.view_as(rewards), per_step.view_as(rewards)


def dual_advantages(batch: Rollout, config: AAACConfig) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Flat ``[N·T]`` blended advantages ``w_r·A_reward + w_risk·A_risk``, the reward and risk critics'
    TD(λ) targets, and each step's λ (all from `adaptive_gae` with the episode-length schedule)."""
    common = (batch.dones, batch.episode_step)
    gamma = config.update.gamma
    adv_reward, ret_reward, lams = adaptive_gae(
        batch.rewards, batch.values, *common, batch.next_value, gamma, config.lam
    )
    adv_risk, ret_risk, _ = adaptive_gae(
        batch.risks, batch.risk_values, *common, batch.next_risk_value, gamma, config.lam
    )
    blended = dual_critic_advantage(adv_reward, adv_risk, config.w_reward, config.w_risk)
    return batch.flat(blended), batch.flat(ret_reward), batch.flat(ret_risk), lams


def kl_penalised(config: AAACConfig, start: StructuredPolicy | None) -> bool:
    """Whether a run from `start` (None: from scratch) pays the KL penalty to the previous policy: yes
    unless an anchor to the start policy takes its place (see the module doc)."""
    return config.beta0 > 0 and (start is None or config.update.anchor_coef == 0)


def train_aaac(
    env: StructuredEnv,
    config: AAACConfig,
    *,
    policy: StructuredPolicy | None = None,
    on_log: Callable[[IterationLog], None] | None = None,
) -> StructuredRun:
    """Train a structured policy on the training tasks of `env`: a fresh one, or a copy of `policy` (built
    for the same `config.run`, e.g. by `imitation.imitate`). `on_log` sees every round's log.

    The rounds are PPO's (`ppo.train_clipped`) with `dual_advantages` as targets and the decaying KL penalty
    (or, from `policy` with an anchor, the anchor in its place: `kl_penalised`).
    """

    def targets(batch: Rollout) -> RoundTargets:
        advantages, ret_reward, ret_risk, lams = dual_advantages(batch, config)
        return RoundTargets(advantages, ret_reward, ret_risk, float(lams.mean()))

    def kl_beta(updates: int) -> float:
        return decaying_beta(updates, config.beta0, config.beta_decay)

    penalty = kl_beta if kl_penalised(config, policy) else None
    return train_clipped(
        env, config.run, config.update, targets, kl_beta=penalty, policy=policy, on_log=on_log
    )


__all__ = [
    "AAACConfig",
    "EpisodeRows",
    "adaptive_gae",
    "dual_advantages",
    "episode_rows",
    "kl_penalised",
    "train_aaac",
]
