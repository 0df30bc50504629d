"""A structured actor-critic: a masked skill head, bounded parameter heads, a reward critic and a risk critic.

It acts on the action space of `sessionrl.envs.gym.DecisionGymEnv`: a skill index (the last one finishes
the episode) and a vector of parameters in [-1, 1], where slot ``j`` of a skill's parameters feeds its
``j``-th `ParamSpec`. The policy owns one head per (skill, parameter):

* a **number** gets a Gaussian head over an unbounded ``u``; the environment receives ``tanh(u)`` and maps it
  linearly onto the parameter's range, so the value is ``low + (high - low) · (tanh(u) + 1) / 2``, inside
  the bounds for every ``u`` (episode bounds such as "at most what is left to refund" included);
* a **choice** (an enum, a boolean) gets a categorical head; the chosen index ``j`` of ``k`` is sent as the
  centre of its bin, ``-1 + (2j + 1) / k``, which the environment decodes back to ``j``.

The **skill head** fills the logits of masked skills with ``-inf`` before the softmax, so a masked skill
has probability exactly 0 and is never sampled. The log-probability of an action is that of its skill plus
those of the chosen skill's own parameters (the other heads are drawn but do not count).

State: the observation's parts (`OBS_KEYS`) flattened in order, plus a text embedding of the task query
(`sessionrl.policy.encoder`). With ``state="flat"`` the actor and the critics read that vector through
separate trunks; with ``state="graph"`` one `graph.GraphEncoder` (shared by actor and critics) also reads
it as a heterogeneous graph (`graph.observation_graphs`), and the trunks take the graph's readout beside
the flat vector, so the graph adds relations without hiding the raw state. Optimisers take
`StructuredPolicy.param_groups`, which slow the graph encoder down (`GRAPH_LR_SCALE`).

The **risk critic** is one value, or with ``risk_quantiles = K > 0`` a quantile head of ``K`` outputs at the
levels `losses.quantile_midpoints`; its value is then their lower-tail CVaR at ``cvar_alpha``
(`losses.cvar`), so a trainer's risk advantage measures the worst outcomes rather than the mean.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from sessionrl.envs.gym import Observation, ParamSpec, batch_observations
from sessionrl.policy.graph import GraphEncoder, ObservationLayout, observation_graphs

StateKind = Literal["flat", "graph"]

OBS_KEYS: Final = ("step", "succeeded", "failed", "features", "action_mask")
"""Observation parts fed to the networks, in this order."""

LOG_2PI: Final = math.log(2 * math.pi)
LOG_STD_RANGE: Final = (-5.0, 2.0)
"""Bounds of the Gaussian heads' log standard deviation."""

GRAPH_LR_SCALE: Final = 0.1
"""The graph encoder learns at this share of the trunks' rate. Its readout is an input of the trunks: at the
trunks' own rate it moved so much between steps that the trunks, chasing a moving input, could not fit the
expert's demonstrations (imitation loss stuck near 2.7 where the flat policy reached 0.1)."""


@dataclass(frozen=True, slots=True)
class ActionLayout:
    """Which head feeds which (skill, parameter slot).

    `numeric[h] = (skill, slot)` for Gaussian head ``h``; `choices[h] = (skill, slot, k)` for categorical
    head ``h`` with ``k`` options. Skill index ``len(skills)`` is *finish*.
    """

    skills: tuple[str, ...]
    numeric: tuple[tuple[int, int], ...]
    choices: tuple[tuple[int, int, int], ...]
    width: int

    @classmethod
    def of(cls, skills: Sequence[str], specs: Mapping[str, Sequence[ParamSpec]], width: int) -> ActionLayout:
        """The layout for `skills` (in action-index order) with their parameter specs."""
        numeric, choices = [], []
        for s, name in enumerate(skills):
            for slot, spec in enumerate(specs[name]):
                if spec.choices:
                    choices.append((s, slot, len(spec.choices)))
                else:
                    numeric.append((s, slot))
        return cls(tuple(skills), tuple(numeric), tuple(choices), width)

    @property
    def actions(self) -> int:
        """Size of the skill head: every skill and finish."""
        return len(self.skills) + 1

    def action(self, skill: int, raw: Mapping[int, float], picks: Mapping[int, int]) -> StructuredAction:
        """One action (a batch of one): `skill`, the Gaussian draw ``u`` of each numeric slot in `raw` and
        the index of each choice slot in `picks`; heads the skill does not own are 0."""
        numbers = [raw.get(slot, 0.0) if s == skill else 0.0 for s, slot in self.numeric]
        choices = [picks.get(slot, 0) if s == skill else 0 for s, slot, _ in self.choices]
        return StructuredAction(
            torch.tensor([skill]),
            torch.tensor([numbers], dtype=torch.float32),
            torch.tensor([choices], dtype=torch.long),
        )

    def owned(self, skill: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, H]`` masks of the numeric and the choice heads that belong to each row's skill."""
        return layout_index(self).owned(skill)

    def env_params(self, action: StructuredAction) -> Tensor:
        """``[B, width]`` parameter vectors for the environment: ``tanh(u)`` for numbers, bin centres for
        choices, each in its skill's slot; slots the skill does not use stay 0."""
        index = layout_index(self)
        params = torch.zeros((action.skill.shape[0], self.width), device=action.raw.device)
        own_num, own_choice = index.owned(action.skill)
        params.index_add_(1, index.numeric_slot, torch.tanh(action.raw) * own_num)
        # the centre of bin j of k, -1 + (2j + 1) / k, as one multiply-add
        centre = torch.addcmul(index.centre_offset, action.choice.to(params.dtype), index.centre_scale)
        return params.index_add_(1, index.choice_slot, centre * own_choice)


@dataclass(frozen=True)
class LayoutIndex:
    """An `ActionLayout` as index tensors: each head's skill and slot, each choice head's size, and where
    choice head ``h``'s option ``j`` sits in the flat choice logits (`pad`, ``[H, K_max]``; the value
    ``sum(k)`` points at a padding column of ``-inf``). A bin's centre is ``j · centre_scale +
    centre_offset`` (``2 / k`` and ``1 / k - 1``)."""

    numeric_skill: Tensor
    numeric_slot: Tensor
    choice_skill: Tensor
    choice_slot: Tensor
    choice_size: Tensor
    pad: Tensor
    centre_scale: Tensor
    centre_offset: Tensor

    def owned(self, skill: Tensor) -> tuple[Tensor, Tensor]:
        """``[B, H]`` masks of the numeric and the choice heads that belong to each row's skill."""
        column = skill[:, None]
        return column == self.numeric_skill, column == self.choice_skill


@functools.cache
def layout_index(layout: ActionLayout) -> LayoutIndex:
    """The index tensors of `layout`, built once per layout (as ordinary tensors even when first asked for
    in inference mode: the cache outlives that mode, and autograd may save them later)."""
    with torch.inference_mode(False):
        return _built_index(layout)


def _built_index(layout: ActionLayout) -> LayoutIndex:
    sizes = [k for _, _, k in layout.choices]
    widest, total = max(sizes, default=1), sum(sizes)
    pad = torch.full((len(sizes), widest), total, dtype=torch.long)
    start = 0
    for h, k in enumerate(sizes):
        pad[h, :k] = torch.arange(start, start + k)
        start += k
    size = torch.tensor(sizes, dtype=torch.float32)
    return LayoutIndex(
        numeric_skill=torch.tensor([s for s, _ in layout.numeric], dtype=torch.long),
        numeric_slot=torch.tensor([slot for _, slot in layout.numeric], dtype=torch.long),
        choice_skill=torch.tensor([s for s, _, _ in layout.choices], dtype=torch.long),
        choice_slot=torch.tensor([slot for _, slot, _ in layout.choices], dtype=torch.long),
        choice_size=size,
        pad=pad,
        centre_scale=2.0 / size,
        centre_offset=1.0 / size - 1.0,
    )


@dataclass(frozen=True)
class StructuredAction:
    """A batch of actions: skill ``[B]`` (long), raw Gaussian draws ``[B, H_num]``, choice indices
    ``[B, H_choice]`` (long)."""

    skill: Tensor
    raw: Tensor
    choice: Tensor

    def __getitem__(self, index: Tensor | slice) -> StructuredAction:
        return StructuredAction(self.skill[index], self.raw[index], self.choice[index])


def masked_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """`logits` with ``-inf`` wherever `mask` is 0/False (every row needs one allowed entry).

    >>> masked_logits(torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 0]])).softmax(-1).tolist()
    [[1.0, 0.0]]
    """
    return logits.masked_fill(mask == 0, float("-inf"))


def categorical_entropy(logits: Tensor) -> Tensor:
    """Entropy over the last axis; entries of ``-inf`` (probability 0) add nothing, gradients included.

    >>> round(categorical_entropy(torch.tensor([0.0, 0.0, float("-inf")])).item(), 4)  # ln 2
    0.6931
    """
    return entropy_of(torch.log_softmax(logits, dim=-1))


def entropy_of(logp: Tensor) -> Tensor:
    """Entropy over the last axis from log-probabilities (``-inf`` entries add nothing, gradients included).

    >>> round(entropy_of(torch.log(torch.tensor([0.5, 0.5, 0.0]))).item(), 4)  # ln 2
    0.6931
    """
    finite = logp.clamp_min(torch.finfo(logp.dtype).min)
    return -(finite.exp() * finite).sum(-1)


def categorical_kl(logp: Tensor, logq: Tensor) -> Tensor:
    """``KL(p ‖ q) = Σ p·(log p - log q)`` over the last axis, from log-probabilities of the same shape.

    Entries where ``p`` is 0 (``-inf``) add nothing; ``q`` must not be 0 where ``p`` is not.

    >>> half, skewed = torch.log(torch.tensor([0.5, 0.5])), torch.log(torch.tensor([0.25, 0.75]))
    >>> round(categorical_kl(half, skewed).item(), 4)  # ½·ln 2 + ½·ln(2/3)
    0.1438
    """
    low = torch.finfo(logp.dtype).min
    p_finite, q_finite = logp.clamp_min(low), logq.clamp_min(low)
    return (p_finite.exp() * (p_finite - q_finite)).sum(-1)


def gaussian_kl(mean_p: Tensor, log_std_p: Tensor, mean_q: Tensor, log_std_q: Tensor) -> Tensor:
    """Elementwise ``KL(N(μ_p, σ_p²) ‖ N(μ_q, σ_q²)) = ln(σ_q/σ_p) + (σ_p² + (μ_p - μ_q)²) / (2σ_q²) - ½``
    (inputs broadcast together).

    >>> zero = torch.tensor(0.0)
    >>> gaussian_kl(torch.tensor(1.0), zero, zero, zero).item()  # a unit shift of a unit Gaussian: ½
    0.5
    """
    ratio = torch.exp(2.0 * (log_std_p - log_std_q))
    shift = (mean_p - mean_q).square() * torch.exp(-2.0 * log_std_q)
    return (log_std_q - log_std_p) + 0.5 * (ratio + shift) - 0.5


class StructuredDist:
    """The policy's action distribution for a batch of states (see the module doc).

    The choice heads' logits are laid out as one ``[B, H, K_max]`` tensor (options past a head's ``k`` are
    ``-inf``), so every choice head samples, scores and adds its entropy in one tensor operation.
    `log_std` and `std` are one per numeric head (``[H_num]``, the same for every state).
    """

    def __init__(
        self, layout: ActionLayout, skill_logits: Tensor, mean: Tensor, log_std: Tensor, choice_logits: Tensor
    ) -> None:
        self.layout = layout
        self.index = layout_index(layout)
        self.skill_logits = skill_logits
        self.mean = mean
        self.log_std = log_std
        self.std = log_std.exp()
        pad = self.index.pad.to(choice_logits.device)
        padded = F.pad(choice_logits, (0, 1), value=float("-inf"))
        # index_select, not advanced indexing: its backward adds rows instead of sorting indices
        picked = padded.index_select(1, pad.reshape(-1))
        self.choice_logits = picked.reshape(choice_logits.shape[0], *pad.shape)
        """``[B, H, K_max]`` logits of every choice head."""

    @functools.cached_property
    def skill_logp(self) -> Tensor:
        """``[B, actions]`` log-probabilities of the skills (log-softmax once, for scores and entropy)."""
        return torch.log_softmax(self.skill_logits, -1)

    @functools.cached_property
    def choice_logp(self) -> Tensor:
        """``[B, H, K_max]`` log-probabilities of every choice head's options."""
        return torch.log_softmax(self.choice_logits, -1)

    def sample(self, generator: torch.Generator | None = None) -> StructuredAction:
        """Draw one action per state (masked skills have probability 0)."""
        skill = torch.multinomial(self.skill_logits.softmax(-1), 1, generator=generator).squeeze(-1)
        noise = torch.randn(self.mean.shape, generator=generator, dtype=self.mean.dtype)
        raw = self.mean + self.std * noise.to(self.mean.device)
        uniform = torch.rand(self.choice_logits.shape, generator=generator, dtype=self.choice_logits.dtype)
        gumbel = -torch.log(-torch.log(uniform.clamp(1e-20, 1.0 - 1e-7)))  # Gumbel-max: one draw per head
        picks = (self.choice_logits + gumbel.to(self.choice_logits.device)).argmax(-1)
        return StructuredAction(skill, raw, picks)

    def mode(self) -> StructuredAction:
        """The most likely action per state (greedy evaluation)."""
        return StructuredAction(self.skill_logits.argmax(-1), self.mean, self.choice_logits.argmax(-1))

    def log_prob(self, action: StructuredAction) -> Tensor:
        """``[B]`` log-probability of each action: its skill plus its skill's own parameters."""
        logp = self.skill_logp.gather(-1, action.skill[:, None]).squeeze(-1)
        own_num, own_choice = self.index.owned(action.skill)
        z = (action.raw - self.mean) / self.std
        gauss = -0.5 * z.square() - (self.log_std + 0.5 * LOG_2PI)
        chosen = self.choice_logp.gather(-1, action.choice[..., None]).squeeze(-1)
        return logp + (gauss * own_num).sum(-1) + (chosen * own_choice).sum(-1)

    def kl(self, other: StructuredDist) -> Tensor:
        """``[B]`` exact ``KL(self ‖ other)`` of the whole action per state (both over the same layout and
        masks): the skill heads' KL plus, for every parameter head, its KL weighted by the probability
        (under `self`) of the skill that owns it, since a head only counts when its skill is taken."""
        skill_p = self.skill_logp.exp()
        index = self.index
        numeric = gaussian_kl(self.mean, self.log_std, other.mean, other.log_std)
        choices = categorical_kl(self.choice_logp, other.choice_logp)
        return (
            categorical_kl(self.skill_logp, other.skill_logp)
            + (skill_p.index_select(1, index.numeric_skill) * numeric).sum(-1)
            + (skill_p.index_select(1, index.choice_skill) * choices).sum(-1)
        )

    def entropy(self, skill: Tensor) -> Tensor:
        """``[B]`` entropy of the skill head plus that of the parameter heads owned by `skill`."""
        own_num, own_choice = self.index.owned(skill)
        gauss = self.log_std + (0.5 + 0.5 * LOG_2PI)
        choices = entropy_of(self.choice_logp) * own_choice
        return entropy_of(self.skill_logp) + (gauss * own_num).sum(-1) + choices.sum(-1)


def _trunk(inputs: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())


@dataclass(frozen=True)
class PolicyOutput:
    """One forward pass: the action distribution and both critics' values (``[B]`` each); with a quantile
    risk critic also its quantiles ``[B, K]`` (`risk_value` is then their CVaR)."""

    dist: StructuredDist
    value: Tensor
    risk_value: Tensor
    risk_quantiles: Tensor | None = None


class StructuredPolicy(nn.Module):
    """An actor (masked skill head, Gaussian and categorical parameter heads) and two critics."""

    def __init__(
        self,
        layout: ActionLayout,
        obs_dim: int,
        text_dim: int,
        hidden: int = 64,
        *,
        state: StateKind = "flat",
        risk_quantiles: int = 0,
        cvar_alpha: float = 0.25,
    ) -> None:
        super().__init__()
        if risk_quantiles < 0 or not 0 < cvar_alpha <= 1:
            raise ValueError("StructuredPolicy needs risk_quantiles >= 0 and cvar_alpha in (0, 1]")
        self.layout = layout
        self.obs_dim = obs_dim
        self.text_dim = text_dim
        self.state = state
        self.risk_quantiles = risk_quantiles
        self.cvar_alpha = cvar_alpha
        inputs = obs_dim + text_dim
        self.graph: GraphEncoder | None = None
        if state == "graph":
            skills = len(layout.skills)
            self.obs_layout = ObservationLayout(skills, obs_dim - 3 * skills - 2, text_dim)
            self.graph = GraphEncoder(self.obs_layout.width, hidden)
            inputs += hidden
        self.actor = _trunk(inputs, hidden)
        self.skill_head = nn.Linear(hidden, layout.actions)
        self.mean_head = nn.Linear(hidden, len(layout.numeric))
        self.log_std = nn.Parameter(torch.full((len(layout.numeric),), -0.5))
        self.choice_head = nn.Linear(hidden, sum(k for _, _, k in layout.choices))
        self.critic = _trunk(inputs, hidden)
        self.value_head = nn.Linear(hidden, 1)
        self.risk_head = nn.Linear(hidden, max(1, risk_quantiles))
        for head in (self.skill_head, self.mean_head, self.choice_head):
            nn.init.orthogonal_(head.weight, gain=0.01)
            nn.init.zeros_(head.bias)

    def param_groups(self, lr: float) -> list[dict[str, Any]]:
        """Optimiser groups at rate `lr`; the graph encoder's at ``lr · GRAPH_LR_SCALE`` (see there)."""
        if self.graph is None:
            return [{"params": list(self.parameters()), "lr": lr}]
        graph = {id(p) for p in self.graph.parameters()}
        rest = [p for p in self.parameters() if id(p) not in graph]
        return [
            {"params": rest, "lr": lr},
            {"params": list(self.graph.parameters()), "lr": lr * GRAPH_LR_SCALE},
        ]

    def features(self, obs: Tensor, text: Tensor) -> Tensor:
        """The trunks' input: observation and query side by side, then the graph encoder's readout."""
        flat = torch.cat([obs, text], dim=-1)
        if self.graph is None:
            return flat
        readout: Tensor = self.graph(observation_graphs(obs, text, self.obs_layout))
        return torch.cat([flat, readout], dim=-1)

    def act(self, obs: Tensor, text: Tensor, mask: Tensor) -> StructuredDist:
        """The action distribution alone, without the critics: all that choosing an action needs (inputs as
        for `forward`)."""
        return self._distribution(self.features(obs, text), mask)

    def _distribution(self, state: Tensor, mask: Tensor) -> StructuredDist:
        hidden = self.actor(state)
        log_std = self.log_std.clamp(*LOG_STD_RANGE)
        return StructuredDist(
            self.layout,
            masked_logits(self.skill_head(hidden), mask),
            self.mean_head(hidden),
            log_std,
            self.choice_head(hidden),
        )

    def forward(self, obs: Tensor, text: Tensor, mask: Tensor) -> PolicyOutput:
        """`obs` ``[B, obs_dim]``, `text` ``[B, text_dim]``, `mask` ``[B, actions]`` (1 = allowed)."""
        state = self.features(obs, text)
        dist = self._distribution(state, mask)
        critic = self.critic(state)
        risk = self.risk_head(critic)
        value = self.value_head(critic).squeeze(-1)
        if not self.risk_quantiles:
            return PolicyOutput(dist, value, risk.squeeze(-1))
        return PolicyOutput(dist, value, cvar(risk, self.cvar_alpha), risk)


def flatten_observation(obs: Mapping[str, Any]) -> np.ndarray:
    """One observation's parts (`OBS_KEYS`) as a flat float32 vector."""
    return np.concatenate([np.asarray(obs[key], np.float32).ravel() for key in OBS_KEYS])


def flatten_batch(obs: Mapping[str, Any]) -> np.ndarray:
    """A batch of observations (each part ``[B, ...]``, as a vector environment gives them) as flat float32
    rows ``[B, obs_dim]``, each row what `flatten_observation` makes of that observation."""
    parts = [np.asarray(obs[key]) for key in OBS_KEYS]
    # cast while concatenating: one copy, not one per part and another to join them
    return np.concatenate([part.reshape(part.shape[0], -1) for part in parts], axis=1, dtype=np.float32)


def observation_size(space: Any) -> int:
    """Length of `flatten_observation` for a Gymnasium Dict observation space."""
    return sum(int(np.prod(space[key].shape)) for key in OBS_KEYS)


def build_policy(
    gym_env: Any,
    text_dim: int,
    hidden: int = 64,
    *,
    state: StateKind = "flat",
    risk_quantiles: int = 0,
    cvar_alpha: float = 0.25,
) -> StructuredPolicy:
    """A policy shaped for a `DecisionGymEnv` (its skills, parameter specs and observation space)."""
    width = int(gym_env.action_space["params"].shape[0])
    layout = ActionLayout.of(gym_env.skill_names, gym_env.param_specs, width)
    size = observation_size(gym_env.observation_space)
    return StructuredPolicy(
        layout, size, text_dim, hidden, state=state, risk_quantiles=risk_quantiles, cvar_alpha=cvar_alpha
    )


def cvar(quantiles: Tensor, alpha: float) -> Tensor:
    """Lower-tail CVaR of a quantile critic: the mean of its lowest ``max(1, ⌊α·K⌋)`` quantiles, ``[B]``
    from ``[B, K]``. Quantiles are sorted first, so an unordered head still reads its worst values.

    With returns where lower is worse (the risk signal is ``-(new risk flags)``), this is the expected
    return over the worst ``α`` share of outcomes; ``α = 1`` gives the mean.

    >>> cvar(torch.tensor([[3.0, -1.0, 0.0, 1.0]]), 0.5).tolist()
    [-0.5]
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    k = max(1, int(alpha * quantiles.shape[-1]))
    return quantiles.sort(dim=-1).values[..., :k].mean(-1)


def policy_step(
    policy: StructuredPolicy, obs: Observation | Sequence[Observation], text: Tensor
) -> tuple[PolicyOutput, Tensor, Tensor]:
    """One batched forward pass: the output, the flat observations and the masks. `obs` is a batch (each
    part ``[B, ...]``, as `DecisionVectorEnv` gives it) or a sequence of single observations."""
    flat, mask = observation_tensors(obs)
    return policy(flat, text, mask), flat, mask


def observation_tensors(obs: Observation | Sequence[Observation]) -> tuple[Tensor, Tensor]:
    """The flat observations ``[B, obs_dim]`` and the skill masks ``[B, actions]`` of a batch or a sequence
    of single observations (as for `policy_step`)."""
    batch = obs if isinstance(obs, Mapping) else batch_observations(obs)
    return torch.from_numpy(flatten_batch(batch)), torch.from_numpy(
        np.asarray(batch["action_mask"], np.int64)
    )


__all__ = [
    "GRAPH_LR_SCALE",
    "LOG_STD_RANGE",
    "OBS_KEYS",
    "ActionLayout",
    "LayoutIndex",
    "PolicyOutput",
    "StateKind",
    "StructuredAction",
    "StructuredDist",
    "StructuredPolicy",
    "build_policy",
    "categorical_entropy",
    "categorical_kl",
    "cvar",
    "entropy_of",
    "flatten_batch",
    "flatten_observation",
    "gaussian_kl",
    "layout_index",
    "masked_logits",
    "observation_size",
    "observation_tensors",
    "policy_step",
]
