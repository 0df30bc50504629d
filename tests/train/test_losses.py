"""Hand-worked checks of the training losses: every expected number is derived in the comment above it."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from sessionrl.policy.structured import cvar
from sessionrl.train import losses
from sessionrl.train.losses import (
    adaptive_lambda,
    clipped_pg_loss,
    decaying_beta,
    dpo_loss,
    dual_critic_advantage,
    gae,
    group_advantages,
    kl_penalty,
    masked_mean,
    quantile_huber_loss,
    quantile_midpoints,
    td_lambda_returns,
    truncated_importance_weights,
    value_loss,
)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_doctests_pass() -> None:
    result = doctest.testmod(losses)
    # two in masked_mean (a mask, and None), one each in adaptive_lambda, dual_critic_advantage,
    # decaying_beta, quantile_midpoints and quantile_huber_loss (cvar's lives with the policy), two in
    # truncated_importance_weights (the call, then its result)
    assert result.attempted == 9
    assert result.failed == 0


def test_masked_mean_counts_only_masked_positions_and_is_zero_when_empty() -> None:
    # (2 + 4) / 2 = 3 with a bool mask; with float weights [1, 0, 1, 0] the same.
    x = t(2.0, 100.0, 4.0, -100.0)
    assert masked_mean(x, torch.tensor([True, False, True, False])).item() == 3.0
    assert masked_mean(x, t(1.0, 0.0, 1.0, 0.0)).item() == 3.0
    assert masked_mean(x, torch.zeros(4, dtype=torch.bool)).item() == 0.0


def test_group_advantages_rows_use_population_std() -> None:
    # Row [1, 2, 3]: mean 2, population std sqrt(((−1)² + 0² + 1²) / 3) = sqrt(2/3) ≈ 0.8165,
    # so A = [−1, 0, 1] / 0.8165 = [−1.2247, 0, 1.2247]. Row [5, 5, 5] is flat: A = 0 exactly.
    adv = group_advantages(t(1.0, 2.0, 3.0, 5.0, 5.0, 5.0).reshape(2, 3), eps=0.0)
    expected = t(-math.sqrt(1.5), 0.0, math.sqrt(1.5), 0.0, 0.0, 0.0).reshape(2, 3)
    torch.testing.assert_close(adv, expected)


def test_group_advantages_with_ids_handle_singletons_and_arbitrary_labels() -> None:
    # Group 7 = {0, 1}: mean 0.5, population std 0.5 → A = [−1, +1] (eps = 0).
    # Groups 3 and 9 have one member each: no signal, A = 0.
    rewards = t(0.0, 4.0, 1.0, 2.0)
    ids = torch.tensor([7, 3, 7, 9])
    torch.testing.assert_close(group_advantages(rewards, ids, eps=0.0), t(-1.0, 0.0, 1.0, 0.0))


def test_group_advantages_eps_and_flat_groups_are_exact_zero() -> None:
    # [0, 1]: mean 0.5, std 0.5 → 0.5 / (0.5 + 0.5) = 0.5 with eps = 0.5.
    torch.testing.assert_close(
        group_advantages(t(0.0, 1.0).reshape(1, 2), eps=0.5), t(-0.5, 0.5).reshape(1, 2)
    )
    # 0.1 three times has a mean that is not exactly 0.1 in floating point; the result must still be 0.
    flat = group_advantages(torch.full((1, 3), 0.1))
    assert torch.equal(flat, torch.zeros(1, 3))


def test_group_advantages_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"\[G, K\]"):
        group_advantages(t(1.0, 2.0))
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(t(1.0, 2.0), torch.tensor([0]))


def test_clipped_pg_loss_clips_both_sides_of_the_ratio() -> None:
    # ε = 0.2, logp_old = 0, so ρ = exp(logp_new). Per token min(ρA, clip(ρ, 0.8, 1.2)A):
    #   ρ=1.5, A=+1 → min(1.5, 1.2) = 1.2   (upper clip active)
    #   ρ=0.5, A=−1 → min(−0.5, −0.8) = −0.8 (lower clip active)
    #   ρ=1.1, A=+1 → 1.1                  (inside the band)
    #   ρ=0.7, A=+1 → masked out
    # loss = −(1.2 − 0.8 + 1.1) / 3 = −0.5; clip fraction 2/3.
    # approx KL = mean(ρ − 1 − ln ρ) = ((0.5 − ln 1.5) + (−0.5 − ln 0.5) + (0.1 − ln 1.1)) / 3 ≈ 0.0974573.
    ratios = t(1.5, 0.5, 1.1, 0.7).reshape(1, 4)
    logp_new = ratios.log().requires_grad_(True)
    logp_old = torch.zeros(1, 4, dtype=torch.float64)
    advantages = t(1.0, -1.0, 1.0, 1.0).reshape(1, 4)
    result = clipped_pg_loss(logp_new, logp_old, advantages, torch.tensor([[1, 1, 1, 0]]), clip_eps=0.2)
    assert result.loss.item() == pytest.approx(-0.5)
    assert result.clip_fraction == pytest.approx(2 / 3)
    expected_kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5)) + (0.1 - math.log(1.1))) / 3
    assert result.approx_kl == pytest.approx(expected_kl)
    # Gradient: clipped and masked tokens get none; the free token gets −ρA/3 = −1.1/3.
    result.loss.backward()
    assert logp_new.grad is not None
    torch.testing.assert_close(logp_new.grad, t(0.0, 0.0, -1.1 / 3, 0.0).reshape(1, 4))


def test_truncated_importance_weights_by_hand() -> None:
    # cap c = 2; w = min(exp(logp_train − logp_behaviour), 2) per token:
    #   Δ = +0.5    → w = e^0.5 ≈ 1.648721
    #   Δ =  0      → w = 1
    #   Δ = −1.5    → w = e^−1.5 ≈ 0.223130
    #   Δ = ln 3    → 3 > 2, truncated: w = 2
    #   Δ = +4      → masked out (its weight is still capped: 2; it counts in no diagnostic)
    #   no record   → w = 1 whatever is stored there (0.0); counts as missing
    # mean |Δ| over the 4 masked, recorded tokens = (0.5 + 0 + 1.5 + ln 3) / 4; truncated 1 of those 4;
    # missing 1 of the 5 masked tokens.
    train = t(-1.0, -0.5, -2.0, math.log(3) - 3.0, 1.0, -0.7).reshape(1, 6)
    behaviour = t(-1.5, -0.5, -0.5, -3.0, -3.0, 0.0).reshape(1, 6)
    mask = torch.tensor([[True, True, True, True, False, True]])
    known = torch.tensor([[True, True, True, True, True, False]])
    iw = truncated_importance_weights(train.requires_grad_(True), behaviour, mask, cap=2.0, known=known)
    expected = t(math.exp(0.5), 1.0, math.exp(-1.5), 2.0, 2.0, 1.0).reshape(1, 6)
    torch.testing.assert_close(iw.weights, expected)
    assert not iw.weights.requires_grad
    assert iw.mean_abs_diff == pytest.approx((0.5 + 0.0 + 1.5 + math.log(3)) / 4)
    assert iw.truncated_fraction == pytest.approx(1 / 4)
    assert iw.missing_fraction == pytest.approx(1 / 5)
    with pytest.raises(ValueError, match="at least 1"):
        truncated_importance_weights(train, behaviour, mask, cap=0.5)


def test_clipped_pg_loss_weights_each_token_and_passes_no_gradient_to_the_weights() -> None:
    # ρ = 1 (logp_new = logp_old), A = [+1, −2], w = [2, 0.5]: surrogate = [2·1, 0.5·(−2)] = [2, −1],
    # loss = −(2 − 1) / 2 = −0.5; d loss / d logp_new = −w·A·ρ / 2 = [−1, +0.5].
    logp_new = t(-1.0, -2.0).reshape(1, 2).requires_grad_(True)
    weights = t(2.0, 0.5).reshape(1, 2).requires_grad_(True)
    result = clipped_pg_loss(logp_new, logp_new.detach(), t(1.0, -2.0).reshape(1, 2), None, 0.2, weights)
    assert result.loss.item() == pytest.approx(-0.5)
    result.loss.backward()
    assert logp_new.grad is not None
    torch.testing.assert_close(logp_new.grad, t(-1.0, 0.5).reshape(1, 2))
    assert weights.grad is None


def test_clipped_pg_loss_keeps_the_pessimistic_side_unclipped() -> None:
    # ρ=0.5 with A=+1 → min(0.5, 0.8) = 0.5; ρ=1.5 with A=−1 → min(−1.5, −1.2) = −1.5.
    # Neither clip is active; advantages [B] = [1, −1] broadcast over each sequence's single token.
    # loss = −(0.5 − 1.5) / 2 = 0.5.
    logp_new = t(0.5, 1.5).log().reshape(2, 1)
    logp_old = torch.zeros(2, 1, dtype=torch.float64)
    result = clipped_pg_loss(logp_new, logp_old, t(1.0, -1.0), torch.ones(2, 1), clip_eps=0.2)
    assert result.loss.item() == pytest.approx(0.5)
    assert result.clip_fraction == 0.0


def test_kl_penalty_estimators() -> None:
    # d = logp − logp_ref = [ln 2, 0, −ln 2], last position masked out.
    #   k1 = mean(ln 2, 0) = ln2 / 2 ≈ 0.34657
    #   k2 = mean((ln 2)² / 2, 0) = (ln 2)² / 4 ≈ 0.12011
    #   k3 = mean(e^(−ln 2) − 1 + ln 2, 0) = (0.5 − 1 + ln 2) / 2 ≈ 0.09657
    logp = t(math.log(2.0), 0.0, -math.log(2.0))
    ref = torch.zeros(3, dtype=torch.float64)
    mask = torch.tensor([True, True, False])
    ln2 = math.log(2.0)
    assert kl_penalty(logp, ref, mask, kind="k1").item() == pytest.approx(ln2 / 2)
    assert kl_penalty(logp, ref, mask, kind="k2").item() == pytest.approx(ln2**2 / 4)
    assert kl_penalty(logp, ref, mask, kind="k3").item() == pytest.approx((0.5 - 1 + ln2) / 2)
    assert kl_penalty(logp, ref, mask).item() == pytest.approx((0.5 - 1 + ln2) / 2)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_penalty(logp, ref, mask, kind="k9")  # type: ignore[arg-type]


def test_gae_three_steps_by_hand() -> None:
    # r = [1, 0, 2], V = [0.5, 1.0, 1.5], done after the last step, γ = 0.9, λ = 0.8 (γλ = 0.72).
    #   t=2: δ = 2 − 1.5 = 0.5                      A2 = 0.5
    #   t=1: δ = 0 + 0.9·1.5 − 1.0 = 0.35           A1 = 0.35 + 0.72·0.5 = 0.71
    #   t=0: δ = 1 + 0.9·1.0 − 0.5 = 1.4            A0 = 1.4 + 0.72·0.71 = 1.9112
    # returns = A + V = [2.4112, 1.71, 2.0]
    adv, ret = gae(t(1.0, 0.0, 2.0), t(0.5, 1.0, 1.5), t(0.0, 0.0, 1.0), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, t(1.9112, 0.71, 0.5))
    torch.testing.assert_close(ret, t(2.4112, 1.71, 2.0))


def test_gae_stops_at_dones_and_bootstraps_an_open_end() -> None:
    # r = [1, 2, 3], V = [1, 1, 1], episode ends after t=1, V(after t=2) = 2, γ = 0.5, λ = 1.
    #   t=2: δ = 3 + 0.5·2 − 1 = 3                   A2 = 3
    #   t=1: done, δ = 2 − 1 = 1, no carry           A1 = 1
    #   t=0: δ = 1 + 0.5·1 − 1 = 0.5                 A0 = 0.5 + 0.5·1 = 1.0
    # With λ = 1 these are Monte Carlo: G0 = 1 + 0.5·2 = 2 → A0 = 2 − 1 = 1.
    bootstrap = torch.tensor(2.0, dtype=torch.float64)
    adv, _ = gae(
        t(1.0, 2.0, 3.0), t(1.0, 1.0, 1.0), t(0.0, 1.0, 0.0), gamma=0.5, lam=1.0, bootstrap=bootstrap
    )
    torch.testing.assert_close(adv, t(1.0, 1.0, 3.0))


def test_gae_batch_with_one_lambda_per_episode() -> None:
    # Row 0 repeats the three-step example (λ = 0.8). Row 1 uses λ = 0, where A = δ = [1.4, 0.35, 0.5]
    # and the returns are the one-step TD targets r + γV' = [1.9, 1.35, 2.0].
    rewards = t(1.0, 0.0, 2.0).repeat(2, 1)
    values = t(0.5, 1.0, 1.5).repeat(2, 1)
    dones = t(0.0, 0.0, 1.0).repeat(2, 1)
    adv, ret = gae(rewards, values, dones, gamma=0.9, lam=t(0.8, 0.0))
    torch.testing.assert_close(adv, torch.stack([t(1.9112, 0.71, 0.5), t(1.4, 0.35, 0.5)]))
    torch.testing.assert_close(ret[1], t(1.9, 1.35, 2.0))


def test_td_lambda_returns_match_discounted_returns_at_lambda_one() -> None:
    # λ = 1, no bootstrap, done at the end: G_t = Σ γ^k r_{t+k} whatever V is.
    # r = [1, 2, 4], γ = 0.5: G2 = 4, G1 = 2 + 0.5·4 = 4, G0 = 1 + 0.5·4 = 3.
    returns = td_lambda_returns(t(1.0, 2.0, 4.0), t(9.0, -3.0, 0.7), t(0.0, 0.0, 1.0), gamma=0.5, lam=1.0)
    torch.testing.assert_close(returns, t(3.0, 4.0, 4.0))


def test_value_loss_plain_and_clipped() -> None:
    # Plain: V = [1, 2, 3], R = [0, 2, 5], last masked: ½·mean(1, 0) = 0.25.
    assert value_loss(t(1.0, 2.0, 3.0), t(0.0, 2.0, 5.0), torch.tensor([1, 1, 0])).item() == pytest.approx(
        0.25
    )
    # Clipped, c = 0.5, V_old = 0, V = 1 (so V_clip = 0.5):
    #   R = 2: max((1−2)², (0.5−2)²) = max(1, 2.25) = 2.25
    #   R = 0: max((1−0)², (0.5−0)²) = max(1, 0.25) = 1
    # ½·mean(2.25, 1) = 0.8125
    loss = value_loss(t(1.0, 1.0), t(2.0, 0.0), torch.ones(2), clip=0.5, old_values=t(0.0, 0.0))
    assert loss.item() == pytest.approx(0.8125)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(t(1.0), t(0.0), torch.ones(1), clip=0.5)


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, 0.95),  # below `short` = 5: λ_short
        (5, 0.95),  # at `short`
        (10, 0.85),  # 0.95 + (0.55 − 0.95)·(10 − 5)/(25 − 5) = 0.95 − 0.4·0.25
        (15, 0.75),  # halfway: 0.95 − 0.4·0.5
        (25, 0.55),  # at `long`
        (400, 0.55),  # beyond `long`: λ_long
    ],
)
def test_adaptive_lambda(length: int, expected: float) -> None:
    assert adaptive_lambda(length) == pytest.approx(expected)


def test_adaptive_lambda_custom_thresholds_and_bad_range() -> None:
    # short = 2, long = 4, λ 1.0 → 0.5: length 3 is halfway → 0.75.
    assert adaptive_lambda(3, short=2, long=4, lam_short=1.0, lam_long=0.5) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="greater than short"):
        adaptive_lambda(3, short=4, long=4)


def test_dual_critic_advantage() -> None:
    # 0.7·[1, −2] + 0.3·[−1, 0.5] = [0.7 − 0.3, −1.4 + 0.15] = [0.4, −1.25]
    torch.testing.assert_close(dual_critic_advantage(t(1.0, -2.0), t(-1.0, 0.5)), t(0.4, -1.25))
    # Custom weights: 0.5·2 + 0.5·4 = 3
    torch.testing.assert_close(dual_critic_advantage(t(2.0), t(4.0), w_reward=0.5, w_risk=0.5), t(3.0))


def test_decaying_beta_after_1000_steps() -> None:
    # β_1000 = 0.1 · 0.999^1000 = 0.1 · e^(1000·ln 0.999) = 0.1 · e^(−1.0005003) ≈ 0.1 · 0.3676954
    assert decaying_beta(1000, 0.1) == pytest.approx(0.03676954, rel=1e-6)
    assert decaying_beta(0, 0.1) == 0.1
    with pytest.raises(ValueError, match="step"):
        decaying_beta(-1, 0.1)


def test_dpo_loss_at_zero_margin_is_log_two() -> None:
    # Policy equals reference: both implicit rewards 0, margin 0, loss = −log σ(0) = log 2.
    logp = t(-3.0, -7.0)
    result = dpo_loss(logp, logp - 1.0, logp, logp - 1.0, beta=0.1)
    assert result.loss.item() == pytest.approx(math.log(2.0))
    assert torch.equal(result.margins, torch.zeros(2, dtype=torch.float64))


def test_dpo_loss_by_hand() -> None:
    # β = 0.5. Pair 0: π_c − ref_c = −1 − (−2) = 1 → r_c = 0.5; π_r − ref_r = −3 − (−2) = −1 → r_r = −0.5;
    #   margin 1 → −log σ(1) = log(1 + e^−1) ≈ 0.3132617.
    # Pair 1 swaps chosen and rejected: margin −1 → log(1 + e) ≈ 1.3132617.
    # Mean = 0.8132617; accuracy 1/2.
    result = dpo_loss(t(-1.0, -3.0), t(-3.0, -1.0), t(-2.0, -2.0), t(-2.0, -2.0), beta=0.5)
    assert result.loss.item() == pytest.approx((math.log1p(math.exp(-1.0)) + math.log1p(math.e)) / 2)
    torch.testing.assert_close(result.chosen_rewards, t(0.5, -0.5))
    torch.testing.assert_close(result.rejected_rewards, t(-0.5, 0.5))
    torch.testing.assert_close(result.margins, t(1.0, -1.0))
    assert result.accuracy == 0.5


def test_dpo_loss_gradient_raises_chosen_and_lowers_rejected() -> None:
    # d loss / d π_c = −β·σ(−m)/B; at m = 0, B = 1, β = 0.1: −0.1·0.5 = −0.05; rejected gets +0.05.
    chosen = torch.zeros(1, requires_grad=True)
    rejected = torch.zeros(1, requires_grad=True)
    dpo_loss(chosen, rejected, torch.zeros(1), torch.zeros(1), beta=0.1).loss.backward()
    assert chosen.grad is not None
    assert rejected.grad is not None
    assert chosen.grad.item() == pytest.approx(-0.05)
    assert rejected.grad.item() == pytest.approx(0.05)


def test_quantile_huber_loss_by_hand_on_both_sides_of_kappa() -> None:
    taus = torch.tensor([0.25, 0.75])
    # u = 1 - 0 = 1 (k=0, weight τ=0.25) and u = 1 - 2 = -1 (k=1, weight 1 - τ = 0.25); Huber ½·1² each
    assert quantile_huber_loss(torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0]]), taus).item() == 0.25
    # |u| = 3 > κ = 1: Huber 1·(3 - ½) = 2.5, weight τ = 0.5 (u > 0)
    one = quantile_huber_loss(torch.tensor([[0.0]]), torch.tensor([[3.0]]), torch.tensor([0.5]))
    assert one.item() == pytest.approx(1.25)
    # κ = 4 keeps u = 3 quadratic: ½·9 / 4 weighted 0.5, and u = -3 weighs 1 - 0.9
    two = quantile_huber_loss(
        torch.tensor([[0.0], [6.0]]), torch.tensor([[3.0], [3.0]]), torch.tensor([0.9]), kappa=4.0
    )
    assert two.item() == pytest.approx(((0.9 * 4.5 / 4) + (0.1 * 4.5 / 4)) / 2)


def test_quantile_huber_loss_averages_targets_and_moves_quantiles_towards_their_levels() -> None:
    # two targets per row are averaged: u = 1 and u = -1 against one quantile at τ = 0.5
    pair = quantile_huber_loss(torch.tensor([[0.0]]), torch.tensor([[1.0, -1.0]]), torch.tensor([0.5]))
    assert pair.item() == pytest.approx(0.25)
    samples = torch.tensor([[0.0, 1.0, 2.0, 3.0, 10.0]])
    quantiles = torch.zeros(1, 5, requires_grad=True)
    optimiser = torch.optim.SGD([quantiles], lr=0.5)
    for _ in range(400):
        optimiser.zero_grad()
        quantile_huber_loss(quantiles, samples, quantile_midpoints(5), kappa=0.01).backward()
        optimiser.step()
    # each quantile settles at its own sample (τ_k = 0.1, 0.3, ... of five points)
    assert quantiles.detach()[0].tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0, 10.0], abs=0.05)


def test_cvar_reads_the_lower_tail_and_rejects_bad_alpha() -> None:
    q = torch.tensor([[4.0, -2.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    assert cvar(q, 0.25).tolist() == [-2.0, 1.0]
    assert cvar(q, 1.0).tolist() == [0.75, 1.0]
    assert cvar(q, 0.1).tolist() == [-2.0, 1.0]  # at least one quantile
    with pytest.raises(ValueError, match="alpha"):
        cvar(q, 0.0)
    with pytest.raises(ValueError, match="taus"):
        quantile_huber_loss(q, torch.zeros(2), torch.tensor([0.5]))
