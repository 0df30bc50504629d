"""The structured policy: masked skills get probability 0, parameters stay in bounds, log-probs by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionrl.envs.base import Split
from sessionrl.envs.gym import DecisionGymEnv, ParamSpec
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.policy.structured import (
    ActionLayout,
    StructuredAction,
    StructuredDist,
    build_policy,
    categorical_entropy,
    flatten_observation,
    masked_logits,
)

SPECS = {"a": (ParamSpec("amount", 0.0, 10.0),), "b": (ParamSpec("reason", choices=("x", "y", "z")),)}
LAYOUT = ActionLayout.of(("a", "b"), SPECS, width=1)
"""Skill a owns one number, skill b one choice of three; action 2 finishes."""


@pytest.fixture(scope="module")
def gym_env() -> DecisionGymEnv:
    env = OrdersEnv(DomainConfig(train=30, dev=0, test=0, time_factor=0, transient_failures=False))
    return DecisionGymEnv(env, Split.TRAIN, seed=0)


def test_layout_maps_heads_to_skills_and_slots() -> None:
    assert LAYOUT.numeric == ((0, 0),)
    assert LAYOUT.choices == ((1, 0, 3),)
    assert LAYOUT.actions == 3


def test_masked_skills_are_never_sampled(gym_env: DecisionGymEnv) -> None:
    """Random masks (finish always allowed), logits blown up to ±1e4: masked skills have probability
    exactly 0 and none of 20,000 draws picks one."""
    policy = build_policy(gym_env, text_dim=8)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        policy.skill_head.weight.normal_(0.0, 1e4, generator=generator)
    rows = 400
    mask = (torch.rand((rows, policy.layout.actions), generator=generator) < 0.4).long()
    mask[:, -1] = 1
    obs = torch.randn((rows, policy.obs_dim), generator=generator)
    dist = policy(obs, torch.randn((rows, 8), generator=generator), mask).dist
    probs = dist.skill_logits.softmax(-1)
    assert bool((probs[mask == 0] == 0).all())
    for _ in range(50):
        skill = dist.sample(generator).skill
        assert bool(mask.gather(1, skill[:, None]).all())
    assert bool(mask.gather(1, dist.mode().skill[:, None]).all())


def test_masking_zeroes_even_the_largest_logit() -> None:
    logits = torch.tensor([[1e30, 0.0, -1e30]])
    probs = masked_logits(logits, torch.tensor([[0, 1, 1]])).softmax(-1)
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_masked_entropy_has_finite_gradients() -> None:
    logits = torch.tensor([0.3, -1.0, 2.0], requires_grad=True)
    entropy = categorical_entropy(masked_logits(logits, torch.tensor([1, 1, 0])))
    entropy.backward()
    assert logits.grad is not None
    assert bool(torch.isfinite(logits.grad).all())
    assert logits.grad[2].item() == 0.0
    p = torch.tensor([0.3, -1.0]).softmax(-1)  # H = -Σ p ln p over the two allowed skills
    assert entropy.item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)


def test_an_index_first_built_in_inference_mode_still_serves_training() -> None:
    """The layout's cached index tensors outlive the mode they were first asked for in: a rollout in
    inference mode, then an update that backpropagates through the same layout's heads."""
    layout = ActionLayout.of(("c",), {"c": (ParamSpec("k", choices=(0, 1, 2, 3, 4, 5, 6)),)}, width=1)
    action = StructuredAction(torch.tensor([0]), torch.zeros((1, 0)), torch.tensor([[6]]))
    with torch.inference_mode():
        StructuredDist(layout, torch.zeros((1, 2)), torch.zeros((1, 0)), torch.zeros(0), torch.zeros((1, 7)))
    logits = torch.zeros((1, 7), requires_grad=True)
    dist = StructuredDist(layout, torch.zeros((1, 2)), torch.zeros((1, 0)), torch.zeros(0), logits)
    dist.log_prob(action).sum().backward()
    assert logits.grad is not None
    assert logits.grad[0, 6].item() == pytest.approx(1 - 1 / 7)


def test_log_prob_counts_only_the_chosen_skills_parameters() -> None:
    """Skill probabilities (1, 2, 1)/4, a standard normal number head, choice probabilities (1, 1, 2)/4.

    log π(a, u=0.5) = ln(1/4) + ln N(0.5; 0, 1) = -1.386294 - (0.125 + 0.918939) = -2.430233
    log π(b, z)     = ln(1/2) + ln(1/2)                                          = -1.386294
    log π(finish)   = ln(1/4)                                                    = -1.386294
    """
    ln2 = math.log(2.0)
    dist = StructuredDist(
        LAYOUT,
        torch.tensor([[0.0, ln2, 0.0]]).expand(3, 3),
        torch.zeros((3, 1)),
        torch.zeros(1),
        torch.tensor([[0.0, 0.0, ln2]]).expand(3, 3),
    )
    action = StructuredAction(
        torch.tensor([0, 1, 2]), torch.tensor([[0.5], [9.0], [9.0]]), torch.tensor([[1], [2], [0]])
    )
    assert dist.log_prob(action).tolist() == pytest.approx([-2.430233, -1.386294, -1.386294], abs=1e-6)


def test_parameters_stay_inside_bounds_for_extreme_outputs(gym_env: DecisionGymEnv) -> None:
    """Mean heads pushed to ±1e6 and the widest noise: every decoded number lies in its (episode) range and
    every choice is one of the contract's values."""
    policy = build_policy(gym_env, text_dim=8)
    generator = torch.Generator().manual_seed(1)
    obs, _ = gym_env.reset(seed=3)
    gym_env.step({"skill": gym_env.skill_names.index("inventory_check"), "params": np.zeros(2, np.float32)})
    obs = gym_env._observation()
    flat = torch.from_numpy(flatten_observation(obs))[None].expand(64, -1)
    mask = torch.ones((64, policy.layout.actions), dtype=torch.long)
    for sign in (-1.0, 1.0):
        with torch.no_grad():
            policy.mean_head.bias.fill_(sign * 1e6)
            policy.log_std.fill_(10.0)
        dist = policy(flat, torch.zeros((64, 8)), mask).dist
        for _ in range(10):
            action = dist.sample(generator)
            params = policy.layout.env_params(action).detach()
            assert bool((params.abs() <= 1.0).all())
            for row in range(64):
                skill = int(action.skill[row])
                if skill == gym_env.finish_action:
                    continue
                name = gym_env.skill_names[skill]
                bounds = gym_env.episode.param_bounds().get(name, {})
                for spec, (key, value) in zip(
                    gym_env.param_specs[name], gym_env.decode(name, params[row]).items(), strict=True
                ):
                    if spec.choices:
                        assert value in spec.choices
                    else:
                        low, high = bounds.get(key, (spec.low, spec.high))
                        assert low <= value <= high


@settings(max_examples=300, deadline=None)
@given(
    u=st.floats(allow_nan=False),
    low=st.floats(-1e6, 1e6),
    width=st.floats(1e-3, 1e6),
)
def test_tanh_squash_lands_in_any_range(u: float, low: float, width: float) -> None:
    """low + (high - low)·(tanh(u) + 1)/2 ∈ [low, high] for every u, infinite ones included."""
    x = torch.tanh(torch.tensor(u, dtype=torch.float64)).item()
    value = ParamSpec("v", low, low + width).decode(x)
    assert low <= value <= low + width


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_choice_centres_decode_to_their_index(k: int) -> None:
    layout = ActionLayout.of(("c",), {"c": (ParamSpec("c", choices=tuple(range(k))),)}, width=1)
    action = StructuredAction(torch.zeros(k, dtype=torch.long), torch.zeros((k, 0)), torch.arange(k)[:, None])
    params = layout.env_params(action)
    assert [layout_spec_decode(float(x), k) for x in params[:, 0]] == list(range(k))


def layout_spec_decode(x: float, k: int) -> object:
    return ParamSpec("c", choices=tuple(range(k))).decode(x)


def test_the_greedy_action_is_the_most_likely_allowed_one() -> None:
    dist = StructuredDist(
        LAYOUT,
        masked_logits(torch.tensor([[5.0, 1.0, 0.0]]), torch.tensor([[0, 1, 1]])),
        torch.tensor([[0.7]]),
        torch.zeros(1),
        torch.tensor([[0.0, 3.0, 1.0]]),
    )
    mode = dist.mode()
    assert (int(mode.skill), float(mode.raw), int(mode.choice)) == (1, pytest.approx(0.7), 1)


def test_choice_heads_of_different_sizes_sample_their_own_probabilities() -> None:
    """Two choice heads of 2 and 3 options laid out side by side (padded to 3): each draws its options at
    its softmax rates, the padding never, and the entropy adds only the chosen skill's own heads."""
    specs = {"a": (ParamSpec("p", choices=(0, 1)), ParamSpec("q", choices=(0, 1, 2)))}
    layout = ActionLayout.of(("a",), specs, width=2)
    logits = torch.log(torch.tensor([[0.25, 0.75, 0.2, 0.3, 0.5]])).expand(4000, 5)
    dist = StructuredDist(layout, torch.zeros((4000, 2)), torch.zeros((4000, 0)), torch.zeros(0), logits)
    picks = dist.sample(torch.Generator().manual_seed(0)).choice
    assert int(picks[:, 0].max()) <= 1
    rates = [picks[:, 0].eq(1).float().mean(), *(picks[:, 1].eq(j).float().mean() for j in range(3))]
    assert [float(r) for r in rates] == pytest.approx([0.75, 0.2, 0.3, 0.5], abs=0.03)
    own = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)) - sum(p * math.log(p) for p in (0.2, 0.3, 0.5))
    two = StructuredDist(layout, torch.zeros((2, 2)), torch.zeros((2, 0)), torch.zeros(0), logits[:2])
    entropy = two.entropy(torch.tensor([0, 1]))  # skill a owns both heads; finish owns none
    assert entropy[0].item() == pytest.approx(math.log(2) + own, abs=1e-5)
    assert entropy[1].item() == pytest.approx(math.log(2), abs=1e-5)
    assert layout.env_params(
        StructuredAction(torch.tensor([0]), torch.zeros((1, 0)), torch.tensor([[1, 2]]))
    ).tolist() == [[pytest.approx(0.5), pytest.approx(2 / 3)]]
