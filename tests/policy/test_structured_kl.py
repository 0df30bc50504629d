"""The exact KL between two structured action distributions, and its parts, on values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from sessionrl.envs.gym import ParamSpec
from sessionrl.policy.structured import (
    ActionLayout,
    StructuredDist,
    categorical_kl,
    gaussian_kl,
    masked_logits,
)

SPECS = {"a": (ParamSpec("amount", 0.0, 10.0),), "b": (ParamSpec("reason", choices=("x", "y", "z")),)}
LAYOUT = ActionLayout.of(("a", "b"), SPECS, width=1)
"""Skill a owns one number, skill b one choice of three; action 2 finishes."""

LN2 = math.log(2.0)


def test_categorical_kl_by_hand() -> None:
    """(1, 2, 1)/4 against (1, 1, 1)/3: ¼·ln(¾) + ½·ln(3/2) + ¼·ln(¾) = ½·ln(9/8) = 0.0588915."""
    p = torch.log(torch.tensor([0.25, 0.5, 0.25]))
    q = torch.log(torch.full((3,), 1 / 3))
    assert categorical_kl(p, q).item() == pytest.approx(0.5 * math.log(9 / 8), abs=1e-6)
    assert categorical_kl(p, p).item() == pytest.approx(0.0, abs=1e-7)


def test_categorical_kl_skips_options_both_rule_out() -> None:
    """A masked option (-inf in both) adds nothing, and its gradient stays finite."""
    logits = torch.tensor([0.0, LN2, 0.0], requires_grad=True)
    mask = torch.tensor([1, 1, 0])
    p = torch.log_softmax(masked_logits(torch.tensor([0.0, 0.0, 5.0]), mask), -1)
    q = torch.log_softmax(masked_logits(logits, mask), -1)
    kl = categorical_kl(p, q)  # ½ against (1, 2)/3: ½·ln(3/2) + ½·ln(3/4) = ½·ln(9/8)
    assert kl.item() == pytest.approx(0.5 * math.log(9 / 8), abs=1e-6)
    torch.autograd.backward(kl)
    assert logits.grad is not None
    assert torch.isfinite(logits.grad).all()


@pytest.mark.parametrize(
    ("mean_p", "log_std_p", "mean_q", "log_std_q", "expected"),
    [
        (0.0, 0.0, 1.0, LN2, LN2 + (1 + 1) / 8 - 0.5),  # ln 2 + (σp² + Δ²)/(2σq²) - ½ = 0.443147
        (3.0, LN2, 3.0, 0.0, -LN2 + 4 / 2 - 0.5),  # a wider p than q: -ln 2 + 2 - ½ = 0.806853
        (2.0, 0.5, 2.0, 0.5, 0.0),
    ],
)
def test_gaussian_kl_by_hand(
    mean_p: float, log_std_p: float, mean_q: float, log_std_q: float, expected: float
) -> None:
    got = gaussian_kl(*(torch.tensor(x) for x in (mean_p, log_std_p, mean_q, log_std_q)))
    assert got.item() == pytest.approx(expected, abs=1e-6)


def dist(
    skill: list[float], mean: float, log_std: float, choice: list[float], mask: list[int] | None = None
) -> StructuredDist:
    """One state's distribution over `LAYOUT`, from skill logits (masked where `mask` is 0), the number
    head and the choice logits."""
    logits = torch.tensor([skill])
    if mask is not None:
        logits = masked_logits(logits, torch.tensor([mask]))
    return StructuredDist(
        LAYOUT, logits, torch.tensor([[mean]]), torch.tensor([log_std]), torch.tensor([choice])
    )


def test_structured_kl_weighs_each_head_by_its_skills_probability() -> None:
    """p: skills (1, 2, 1)/4, number N(0, 1), choices (1, 1, 2)/4; q: skills and choices uniform, number
    N(1, 2²). KL = KL(skills) + P(a)·KL(number) + P(b)·KL(choice)
       = ½·ln(9/8) + ¼·(ln 2 + 2/8 - ½) + ½·(½·ln(3/4) + ½·ln(3/2))
       = 0.0588915 + ¼·0.4431472 + ½·0.0588915 = 0.1991240."""
    p = dist([0.0, LN2, 0.0], 0.0, 0.0, [0.0, 0.0, LN2])
    q = dist([0.0, 0.0, 0.0], 1.0, LN2, [0.0, 0.0, 0.0])
    half_ln_9_8 = 0.5 * math.log(9 / 8)
    expected = half_ln_9_8 + 0.25 * (LN2 + 0.25 - 0.5) + 0.5 * half_ln_9_8
    assert expected == pytest.approx(0.1991240, abs=1e-6)
    assert p.kl(q).item() == pytest.approx(expected, abs=1e-6)
    assert p.kl(p).item() == pytest.approx(0.0, abs=1e-7)


def test_structured_kl_ignores_heads_of_skills_p_never_takes() -> None:
    """With skill a masked, p never draws the number, so q's number head may differ at no cost: only the
    skills ((1, 1)/2 over b and finish against (2, 1)/3: ½·ln(3/4) + ½·ln(3/2) = ½·ln(9/8)) count."""
    p = dist([0.0, 0.0, 0.0], 0.0, 0.0, [0.0, 0.0, 0.0], mask=[0, 1, 1])
    q = dist([0.0, LN2, 0.0], 5.0, -2.0, [0.0, 0.0, 0.0], mask=[0, 1, 1])
    assert p.kl(q).item() == pytest.approx(0.5 * math.log(9 / 8), abs=1e-6)
