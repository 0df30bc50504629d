"""Loss and advantage functions for the trainers, as small pure tensor functions.

Conventions shared by every function here:

* ``B`` is the batch (sequences or episodes), ``T`` the time axis (tokens or steps).
* A ``mask`` has the shape of the values it selects; it may be ``bool`` or float (1 = counted), or None when
  every element counts. Means over a mask are token-level: every unmasked element of the whole batch weighs
  the same (see :func:`masked_mean`).
* ``dones[t] = 1`` means the episode ended after step ``t``: nothing is bootstrapped across it.
* Log-probabilities are natural-log probabilities of the sampled tokens, one per position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from torch.nn import functional as F


def masked_mean(x: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of ``x`` over the positions where ``mask`` is set; 0 when nothing is set; the plain mean when
    ``mask`` is None (no weights to multiply in: fewer operations when every element counts).

    ``x`` and ``mask`` share any shape; the result is a 0-d tensor that keeps the gradient of ``x``.

    >>> masked_mean(torch.tensor([1.0, 2.0, 6.0]), torch.tensor([True, False, True])).item()
    3.5
    >>> masked_mean(torch.tensor([1.0, 2.0, 6.0]), None).item()
    3.0
    """
    if mask is None:
        return x.mean()
    weights = mask.to(x.dtype)
    return (x * weights).sum() / weights.sum().clamp_min(1.0)


def group_advantages(rewards: Tensor, group_ids: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """GRPO group-relative advantages ``(r - mean_g) / (std_g + eps)``.

    Two layouts, one computation:

    * ``rewards`` of shape ``[G, K]`` with ``group_ids=None``: each row is a group of K samples.
    * ``rewards`` of shape ``[N]`` with integer ``group_ids`` of shape ``[N]``: groups of any size.

    The std is the *population* std (divide by the group size n, not n - 1), so it is defined for every group.
    A group whose rewards are all equal (a group of one included) carries no signal and gets advantage 0
    exactly. Returns a tensor shaped like ``rewards``.
    """
    if group_ids is None:
        if rewards.dim() != 2:
            raise ValueError(f"rewards without group_ids must be [G, K], got shape {tuple(rewards.shape)}")
        rows, width = rewards.shape
        ids = torch.arange(rows, device=rewards.device).repeat_interleave(width)
        return group_advantages(rewards.reshape(-1), ids, eps).reshape(rows, width)
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        shapes = f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        raise ValueError(f"rewards and group_ids must both be [N], got {shapes}")
    labels, ids = torch.unique(group_ids, return_inverse=True)
    zeros = torch.zeros(labels.numel(), dtype=rewards.dtype, device=rewards.device)
    count = zeros.scatter_add(0, ids, torch.ones_like(rewards))
    mean = zeros.scatter_add(0, ids, rewards) / count
    centred = rewards - mean[ids]
    std = (zeros.scatter_add(0, ids, centred**2) / count).sqrt()
    highest = zeros.scatter_reduce(0, ids, rewards, reduce="amax", include_self=False)
    lowest = zeros.scatter_reduce(0, ids, rewards, reduce="amin", include_self=False)
    flat = (highest == lowest)[ids]
    return torch.where(flat, torch.zeros_like(rewards), centred / (std[ids] + eps))


@dataclass(frozen=True)
class PolicyLoss:
    """Result of :func:`clipped_pg_loss`: the loss to minimise and two diagnostics (plain floats)."""

    loss: Tensor
    clip_fraction: float
    approx_kl: float


def clipped_pg_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor | None,
    clip_eps: float = 0.2,
    weights: Tensor | None = None,
) -> PolicyLoss:
    """PPO clipped surrogate over token log-probs: ``-mean(w·min(ρ·A, clip(ρ, 1-ε, 1+ε)·A))``.

    ``ρ = exp(logp_new - logp_old)`` is the per-token probability ratio; ``w`` are per-token importance
    weights (1 when ``weights`` is None), taken as constants (see :func:`truncated_importance_weights`).

    ``logp_new``, ``logp_old``, ``mask`` and ``weights`` are ``[B, T]``; ``advantages`` is ``[B, T]`` or
    ``[B]`` (one per sequence, broadcast over its tokens). The mean is token-level over ``mask``.

    ``clip_fraction`` is the share of masked tokens where the clip is active (the gradient is cut):
    ``ρ > 1+ε`` with ``A > 0`` or ``ρ < 1-ε`` with ``A < 0``. ``approx_kl`` estimates KL(old ‖ new) with
    the k3 estimator ``(ρ - 1) - log ρ`` (non-negative, unbiased under samples from the old policy).
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == logp_new.dim() - 1 else advantages
    log_ratio = logp_new - logp_old
    ratio = log_ratio.exp()
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    surrogate = torch.minimum(unclipped, clipped)
    if weights is not None:
        surrogate = surrogate * weights.detach()
    loss = -masked_mean(surrogate, mask)
    with torch.no_grad():
        # the clipped term is the smaller exactly where the clip is active (ρ above 1+ε with A > 0, below 1-ε
        # with A < 0): there the minimum takes it, and its gradient in ρ is 0
        active = clipped < unclipped
        clip_fraction = masked_mean(active.to(ratio.dtype), mask).item()
        approx_kl = masked_mean((ratio - 1.0) - log_ratio, mask).item()
    return PolicyLoss(loss=loss, clip_fraction=clip_fraction, approx_kl=approx_kl)


@dataclass(frozen=True)
class ImportanceWeights:
    """Result of :func:`truncated_importance_weights`: the weights ``[B, T]`` (no gradient) and the
    mismatch they saw (plain floats, means over the masked tokens)."""

    weights: Tensor
    mean_abs_diff: float
    """Mean ``|logp_train - logp_behaviour|`` over the tokens with a behaviour log-prob."""
    truncated_fraction: float
    """Share of the tokens with a behaviour log-prob whose ratio the cap cut."""
    missing_fraction: float
    """Share of all masked tokens without a behaviour log-prob (trained on-policy, weight 1)."""


def truncated_importance_weights(
    logp_train: Tensor,
    logp_behaviour: Tensor,
    mask: Tensor | None,
    cap: float,
    known: Tensor | None = None,
) -> ImportanceWeights:
    """Truncated importance sampling: ``w = min(exp(logp_train - logp_behaviour), cap)``, detached.

    The sampler (the behaviour policy: an inference engine, an older version of the policy) and the
    trainer score the same tokens differently; ``w`` reweights each token from the behaviour policy's
    distribution to the trainer's, and the cap bounds the variance a rare token would add.

    ``logp_train``, ``logp_behaviour``, ``mask`` and ``known`` are ``[B, T]``. ``known`` marks the tokens
    whose behaviour log-prob was recorded (None: all); elsewhere the token is taken as on-policy, ``w = 1``,
    whatever ``logp_behaviour`` holds there, and it counts in ``missing_fraction``.

    >>> iw = truncated_importance_weights(
    ...     torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), None, cap=2.0
    ... )
    >>> iw.weights.tolist(), iw.truncated_fraction, iw.mean_abs_diff
    ([[2.0, 1.0]], 0.5, 0.5)
    """
    if cap < 1:
        raise ValueError(f"the importance weight cap must be at least 1, got {cap}")
    with torch.no_grad():
        seen = torch.ones_like(logp_train, dtype=torch.bool) if known is None else known.bool()
        diff = torch.where(seen, logp_train - logp_behaviour, torch.zeros_like(logp_train))
        weights = diff.exp().clamp(max=cap)
        counted = seen if mask is None else seen & mask.bool()
        mean_abs_diff = masked_mean(diff.abs(), counted).item()
        truncated_fraction = masked_mean((diff.exp() > cap).to(diff.dtype), counted).item()
        missing_fraction = masked_mean((~seen).to(diff.dtype), mask).item()
    return ImportanceWeights(weights, mean_abs_diff, truncated_fraction, missing_fraction)


KLKind = Literal["k1", "k2", "k3"]


def kl_penalty(logp: Tensor, logp_ref: Tensor, mask: Tensor | None, kind: KLKind = "k3") -> Tensor:
    """Estimate KL(π ‖ π_ref) per token from tokens sampled by π, averaged over ``mask``.

    With ``d = logp - logp_ref`` (shape ``[B, T]``) the per-token estimators are

    * ``k1 = d`` — unbiased, can be negative, high variance;
    * ``k2 = d² / 2`` — biased, non-negative, low variance;
    * ``k3 = e^(-d) - 1 + d`` — unbiased and non-negative (the usual choice for a penalty).

    Returns a 0-d tensor that keeps the gradient of ``logp``.
    """
    d = logp - logp_ref
    if kind == "k1":
        per_token = d
    elif kind == "k2":
        per_token = 0.5 * d**2
    elif kind == "k3":
        per_token = torch.expm1(-d) + d
    else:
        raise ValueError(f"unknown KL estimator {kind!r}; use 'k1', 'k2' or 'k3'")
    return masked_mean(per_token, mask)


def gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    gamma: float,
    lam: float | Tensor,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation; returns ``(advantages, returns)``, both shaped like ``rewards``.

    ``rewards``, ``values``, ``dones`` are ``[T]`` or ``[B, T]``. ``bootstrap`` is V of the state after the
    last step (shape ``[]`` or ``[B]``; 0 when omitted), used only where the last step is not done. ``lam`` is
    a float or a tensor of shape ``[]``/``[B]`` (one λ per episode, see :func:`adaptive_lambda`).

    ``δ_t = r_t + γ·(1-d_t)·V_{t+1} - V_t``, ``A_t = δ_t + γ·λ·(1-d_t)·A_{t+1}``, ``returns = A + V``
    (the λ-returns).
    """
    not_done = 1.0 - dones.to(rewards.dtype)
    next_value = torch.zeros_like(values[..., -1]) if bootstrap is None else bootstrap.to(values.dtype)
    carry = torch.zeros_like(next_value)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[..., t] + gamma * not_done[..., t] * next_value - values[..., t]
        carry = delta + gamma * lam * not_done[..., t] * carry
        advantages[..., t] = carry
        next_value = values[..., t]
    return advantages, advantages + values


def td_lambda_returns(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    gamma: float,
    lam: float | Tensor,
    bootstrap: Tensor | None = None,
) -> Tensor:
    """TD(λ) returns ``G^λ_t = A^GAE_t + V_t`` (the critic's target), shaped like ``rewards``.

    Same arguments and conventions as :func:`gae`, whose recursion computes them.
    """
    return gae(rewards, values, dones, gamma, lam, bootstrap)[1]


def value_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor | None,
    clip: float | None = None,
    old_values: Tensor | None = None,
) -> Tensor:
    """Critic loss ``½·mean((V - R)²)`` over ``mask``; all inputs share one shape (``[B]`` or ``[B, T]``).

    With ``clip`` (and the ``old_values`` the rollout saw), the PPO clipped form is used: the new value may
    move at most ``clip`` from the old one before the error stops shrinking,
    ``½·mean(max((V - R)², (V_old + clamp(V - V_old, -c, c) - R)²))``.
    """
    error = (values - returns) ** 2
    if clip is not None:
        if old_values is None:
            raise ValueError("value clipping needs old_values")
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        error = torch.maximum(error, (clipped - returns) ** 2)
    return 0.5 * masked_mean(error, mask)


def adaptive_lambda(
    episode_length: float,
    short: float = 5.0,
    long: float = 25.0,
    lam_short: float = 0.95,
    lam_long: float = 0.55,
) -> float:
    """λ for GAE / TD(λ) that shrinks as episodes grow longer.

    Episodes of at most ``short`` steps (default 5: a plan and a few tool calls) get ``lam_short`` = 0.95,
    i.e. nearly Monte Carlo returns; episodes of at least ``long`` steps (default 25) get ``lam_long`` = 0.55,
    leaning on the critic to keep the variance of long returns down. In between λ is interpolated linearly.

    >>> adaptive_lambda(3), adaptive_lambda(15), adaptive_lambda(40)
    (0.95, 0.75, 0.55)
    """
    if not long > short:
        raise ValueError(f"long ({long}) must be greater than short ({short})")
    position = min(max((episode_length - short) / (long - short), 0.0), 1.0)
    return lam_short + (lam_long - lam_short) * position


def dual_critic_advantage(
    a_reward: Tensor, a_risk: Tensor, w_reward: float = 0.7, w_risk: float = 0.3
) -> Tensor:
    """Blend the reward critic's and the risk critic's advantages: ``w_reward·A_r + w_risk·A_risk``.

    Both inputs share one shape (any); so does the result.

    >>> round(dual_critic_advantage(torch.tensor([1.0]), torch.tensor([-1.0])).item(), 6)
    0.4
    """
    return w_reward * a_reward + w_risk * a_risk


def decaying_beta(step: int, beta0: float, decay: float = 0.999) -> float:
    """KL coefficient after ``step`` updates: ``β_t = β_0 · decay^t``.

    >>> decaying_beta(0, 0.1), decaying_beta(2, 0.1, decay=0.5)
    (0.1, 0.025)
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return beta0 * decay**step


def quantile_midpoints(count: int) -> Tensor:
    """The ``[K]`` quantile levels a QR critic's ``K`` outputs estimate: ``τ_i = (2i + 1) / 2K``.

    >>> quantile_midpoints(4).tolist()
    [0.125, 0.375, 0.625, 0.875]
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    return (2 * torch.arange(count, dtype=torch.float32) + 1) / (2 * count)


def quantile_huber_loss(quantiles: Tensor, targets: Tensor, taus: Tensor, kappa: float = 1.0) -> Tensor:
    """QR regression loss of a distributional critic: its quantiles ``[B, K]`` against target samples
    ``[B, M]`` (``M = 1`` for one TD(λ) return per state), at levels ``taus`` ``[K]``.

    With ``u = target_m - quantile_k``, each pair costs ``|τ_k - 1{u < 0}| · H_κ(u) / κ``, where the Huber
    term ``H_κ(u)`` is ``u²/2`` for ``|u| ≤ κ`` and ``κ(|u| - κ/2)`` beyond. Pairs are averaged over the
    targets, summed over the quantiles and averaged over the batch; the result is a 0-d tensor. Its minimiser
    puts quantile ``k`` at the ``τ_k``-quantile of the targets, so under- and over-estimates weigh
    ``1 - τ_k`` and ``τ_k``.

    >>> quantile_huber_loss(torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0]]), torch.tensor([0.25, 0.75]))
    tensor(0.2500)
    """
    if kappa <= 0:
        raise ValueError(f"kappa must be > 0, got {kappa}")
    if quantiles.dim() != 2 or targets.dim() != 2 or taus.shape != quantiles.shape[-1:]:
        shapes = f"{tuple(quantiles.shape)}, {tuple(targets.shape)}, {tuple(taus.shape)}"
        raise ValueError(f"quantiles [B, K], targets [B, M] and taus [K] expected, got {shapes}")
    u = targets[:, None, :] - quantiles[:, :, None]  # [B, K, M]
    huber = torch.where(u.abs() <= kappa, 0.5 * u**2, kappa * (u.abs() - 0.5 * kappa))
    weight = (taus.to(u.dtype)[None, :, None] - (u.detach() < 0).to(u.dtype)).abs()
    return (weight * huber / kappa).mean(-1).sum(-1).mean()


@dataclass(frozen=True)
class DPOLoss:
    """Result of :func:`dpo_loss`: the loss to minimise and the implicit rewards (detached, shape ``[B]``)."""

    loss: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor

    @property
    def margins(self) -> Tensor:
        """Implicit reward margin per pair, ``chosen - rejected``; positive when the pair is ranked right."""
        return self.chosen_rewards - self.rejected_rewards

    @property
    def accuracy(self) -> float:
        """Share of pairs whose margin is positive."""
        return (self.margins > 0).to(torch.float32).mean().item()


def dpo_loss(
    policy_chosen_logp: Tensor,
    policy_rejected_logp: Tensor,
    ref_chosen_logp: Tensor,
    ref_rejected_logp: Tensor,
    beta: float = 0.1,
) -> DPOLoss:
    """Direct preference optimisation: ``-mean(log σ(β·[(π_c - ref_c) - (π_r - ref_r)]))``.

    Every input is ``[B]``: the summed log-probability of a whole response (chosen or rejected) under the
    policy or the frozen reference. The implicit rewards are ``β·(π - ref)``. At zero margin the loss is
    ``log 2``.
    """
    chosen = beta * (policy_chosen_logp - ref_chosen_logp)
    rejected = beta * (policy_rejected_logp - ref_rejected_logp)
    loss = -F.logsigmoid(chosen - rejected).mean()
    return DPOLoss(loss=loss, chosen_rewards=chosen.detach(), rejected_rewards=rejected.detach())


__all__ = [
    "DPOLoss",
    "ImportanceWeights",
    "KLKind",
    "PolicyLoss",
    "adaptive_lambda",
    "clipped_pg_loss",
    "decaying_beta",
    "dpo_loss",
    "dual_critic_advantage",
    "gae",
    "group_advantages",
    "kl_penalty",
    "masked_mean",
    "quantile_huber_loss",
    "quantile_midpoints",
    "td_lambda_returns",
    "truncated_importance_weights",
    "value_loss",
]
