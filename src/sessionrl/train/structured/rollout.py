"""Rollouts of a `StructuredPolicy` on Gymnasium views of an environment, for PPO and AAAC, and evaluation.

`StructuredRunConfig` is what imitation and both trainers share (the run's shape); each trainer's own
settings sit beside the trainer (`ppo.PPOConfig`, `aaac.AAACConfig`).

`Collector` steps ``num_envs`` `DecisionGymEnv`s (with ``prototypes``, `prototypes.MacroGymEnv`s) as one
`DecisionVectorEnv` (one batched forward pass and one event-loop run per step; an environment restarts in
the step its episode ends), encodes each distinct task query once, and returns a `Rollout` of
``[N, T]`` tensors (env-major, time last, as `sessionrl.train.losses.gae` expects). Besides the
environment's reward it records a *risk* signal per step, ``-(new risk flags)``, for the risk critic.
Finished episodes are kept as `EpisodeStats`.

`evaluate` runs every task of a split once (greedy by default); `Summary` reports completion, steps per
task and the share of risky calls. A *risky call* is a skill call that raised at least one of the domain's
risk flags (a refund before the return was confirmed, a second refund, a reshipment before a loss or
return was confirmed).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sessionrl.envs.base import Split, Task
from sessionrl.envs.gym import (
    DecisionGymEnv,
    DecisionVectorEnv,
    GymConfig,
    StructuredEnv,
)
from sessionrl.envs.prototypes import MacroGymEnv, Prototype, expert_prototypes
from sessionrl.policy.encoder import EncoderKind, TextEncoder, build_encoder
from sessionrl.policy.structured import (
    StateKind,
    StructuredAction,
    StructuredPolicy,
    build_policy,
    observation_tensors,
    policy_step,
)


@dataclass(frozen=True, slots=True)
class StructuredRunConfig:
    """The shape of a structured run, shared by imitation, PPO and AAAC: rounds, environments stepped side
    by side, the policy's size and query encoder, the episodes, and the seed."""

    iterations: int = field(default=40, metadata={"help": "rollout-then-update rounds"})
    num_envs: int = field(default=8, metadata={"help": "environments stepped side by side"})
    rollout_steps: int = field(default=64, metadata={"help": "steps per environment per round"})
    hidden: int = field(default=64, metadata={"help": "width of the actor and critic trunks"})
    encoder: EncoderKind = field(default="hash", metadata={"help": "task-query encoder: hash, minilm, auto"})
    text_dim: int = field(default=32, metadata={"help": "width of the hashed query embedding"})
    state: StateKind = field(
        default="flat", metadata={"help": "flat: the observation as one vector; graph: as a graph, via a GNN"}
    )
    risk_quantiles: int = field(
        default=0,
        metadata={"help": "quantiles of the risk critic (0: one value); AAAC then acts on their CVaR"},
    )
    cvar_alpha: float = field(default=0.25, metadata={"help": "tail share the risk critic's CVaR averages"})
    prototypes: int = field(
        default=0,
        metadata={"help": "macro-actions mined from the expert's training plans (0: atomic skills only)"},
    )
    gym: GymConfig = field(default_factory=GymConfig, metadata={"help": "episode length and reward weights"})
    seed: int = field(default=0, metadata={"help": "seeds the networks, the sampling and the task draws"})
    threads: int = field(
        default=1, metadata={"help": "torch CPU threads while training (small nets: 1 is fastest)"}
    )

    def __post_init__(self) -> None:
        for name in ("iterations", "num_envs", "rollout_steps", "hidden", "text_dim", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"StructuredRunConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.state not in ("flat", "graph"):
            raise ValueError(f"StructuredRunConfig.state must be flat or graph, got {self.state!r}")
        if self.risk_quantiles < 0 or self.prototypes < 0 or not 0 < self.cvar_alpha <= 1:
            raise ValueError(
                "StructuredRunConfig needs risk_quantiles >= 0, prototypes >= 0 and cvar_alpha in (0, 1]"
            )

    @property
    def batch_size(self) -> int:
        """Steps gathered per round."""
        return self.num_envs * self.rollout_steps

    @property
    def total_steps(self) -> int:
        """Environment steps over the whole run."""
        return self.iterations * self.batch_size


@dataclass(frozen=True, slots=True)
class EpisodeStats:
    """One finished episode: solved or not, policy steps (finish included), skill calls, risky calls."""

    task_id: str
    success: bool
    steps: int
    calls: int
    risky_calls: int


@dataclass(frozen=True)
class Rollout:
    """One round of experience; every tensor is ``[N, T, ...]``, plus the bootstrap values ``[N]``."""

    obs: Tensor
    text: Tensor
    mask: Tensor
    action: StructuredAction
    logp: Tensor
    rewards: Tensor
    risks: Tensor
    dones: Tensor
    episode_step: Tensor
    """Steps the episode had taken before each step (0 at an episode's first step)."""
    values: Tensor
    risk_values: Tensor
    next_value: Tensor
    next_risk_value: Tensor

    def flat(self, x: Tensor) -> Tensor:
        """`x` ``[N, T, ...]`` as ``[N·T, ...]``."""
        return x.reshape(-1, *x.shape[2:])

    def flat_action(self) -> StructuredAction:
        """The actions as one batch of ``N·T``."""
        a = self.action
        return StructuredAction(self.flat(a.skill), self.flat(a.raw), self.flat(a.choice))


@dataclass(frozen=True, slots=True)
class Summary:
    """Completion, mean policy steps per episode and risky-call share over some episodes."""

    episodes: int
    completion: float
    mean_steps: float
    risk_share: float

    @classmethod
    def of(cls, episodes: Sequence[EpisodeStats]) -> Summary:
        """The summary of `episodes` (zeros when there are none)."""
        n = len(episodes)
        calls = sum(e.calls for e in episodes)
        return cls(
            episodes=n,
            completion=sum(e.success for e in episodes) / n if n else 0.0,
            mean_steps=sum(e.steps for e in episodes) / n if n else 0.0,
            risk_share=sum(e.risky_calls for e in episodes) / calls if calls else 0.0,
        )


GymView = DecisionGymEnv | MacroGymEnv
"""What a structured policy acts on: the atomic skills, or those and prototypes."""


def gym_view(
    env: StructuredEnv, split: Split, *, seed: int, gym: GymConfig | None, prototypes: Sequence[Prototype]
) -> GymView:
    """A Gymnasium view of `env`'s `split`, with `prototypes` as macro-actions when there are any."""
    inner = DecisionGymEnv(env, split, seed=seed, config=gym)
    return MacroGymEnv(inner, prototypes) if prototypes else inner


def env_action(params: Tensor, skill: Tensor, row: int) -> dict[str, Any]:
    """The Gymnasium action of batch row `row`."""
    return {"skill": int(skill[row]), "params": params[row].numpy()}


class Collector:
    """Steps `num_envs` Gymnasium views of `env` (split `split`) with a policy; see the module doc."""

    def __init__(
        self,
        env: StructuredEnv,
        config: StructuredRunConfig,
        encoder: TextEncoder,
        split: Split = Split.TRAIN,
    ) -> None:
        self.config = config
        self.encoder = encoder
        self.prototypes = expert_prototypes(env, config.prototypes) if config.prototypes else ()
        """The macro-actions the environments offer (mined once from the expert's plans)."""
        self.vector = DecisionVectorEnv(
            [
                gym_view(env, split, seed=config.seed * 1000 + i, gym=config.gym, prototypes=self.prototypes)
                for i in range(config.num_envs)
            ]
        )
        self.generator = torch.Generator().manual_seed(config.seed)
        self._queries: dict[str, Tensor] = {}
        self.obs, info = self.vector.reset()
        self.task_ids: list[str] = list(info["task_id"])
        self._texts = [self._query(q) for q in info["instruction"]]
        self.text = torch.stack(self._texts)
        """``[N, text_dim]`` query embeddings of the running episodes: replaced (never written in place) when
        an episode restarts, so a rollout may keep each step's tensor as it is."""
        self._counts = np.zeros((config.num_envs, 3), np.int64)  # steps, calls, risky calls
        self.episodes: list[EpisodeStats] = []
        """Every episode finished so far, in order."""
        self.env_steps = 0

    @property
    def envs(self) -> tuple[GymView, ...]:
        """The Gymnasium views stepped side by side."""
        return self.vector.envs  # type: ignore[return-value]

    def _query(self, instruction: str) -> Tensor:
        """The query embedding of `instruction` (each distinct one encoded once)."""
        if instruction not in self._queries:
            self._queries[instruction] = self.encoder.encode([instruction])[0]
        return self._queries[instruction]

    def _step(self, params: Tensor, skill: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Step every environment; returns rewards, risk signals and dones ``[N]``, recording the episodes
        that ended (their environments restart at once)."""
        actions = {"skill": skill.numpy(), "params": params.numpy()}
        self.obs, reward, terminated, truncated, info = self.vector.step(actions)
        counts = self._counts
        counts[:, 0] += 1
        counts[:, 1] += info["calls"]
        counts[:, 2] += info["risky_calls"]
        done = terminated | truncated
        ended = np.flatnonzero(done)
        if ended.size:
            success, task_ids, instructions = info["success"], info["task_id"], info["instruction"]
            for i, (steps, calls, risky) in zip(ended.tolist(), counts[ended].tolist(), strict=True):
                self.episodes.append(EpisodeStats(self.task_ids[i], bool(success[i]), steps, calls, risky))
                self.task_ids[i] = str(task_ids[i])
                self._texts[i] = self._query(str(instructions[i]))
            counts[ended] = 0
            self.text = torch.stack(self._texts)
        risks = -torch.from_numpy(info["risk_flags"].astype(np.float32))
        return torch.from_numpy(reward.astype(np.float32)), risks, torch.from_numpy(done.astype(np.float32))

    def close(self) -> None:
        """Close every environment and the vector's event loop."""
        self.vector.close()

    @torch.inference_mode()
    def collect(self, policy: StructuredPolicy) -> Rollout:
        """`config.rollout_steps` steps of every environment, sampled from `policy`.

        Each step runs the actor alone (`StructuredPolicy.act`); the critics' values and the taken actions'
        log-probabilities are scored after the last step in one batched pass over the round's states (the
        policy does not change within a round, so this is the step-by-step score in fewer, larger tensor
        operations). All in inference mode: no autograd bookkeeping (the update reads the rollout through
        indexing, which makes ordinary tensors).
        """
        keys = ("obs", "text", "mask", "skill", "raw", "choice", "episode_step", "rewards", "risks", "dones")
        rows: dict[str, list[Tensor]] = {key: [] for key in keys}
        for _ in range(self.config.rollout_steps):
            flat, mask = observation_tensors(self.obs)
            action = policy.act(flat, self.text, mask).sample(self.generator)
            before = (flat, self.text, mask, action.skill, action.raw, action.choice)
            steps = torch.from_numpy(self._counts[:, 0].copy())
            after = self._step(policy.layout.env_params(action), action.skill)
            for key, value in zip(keys, (*before, steps, *after), strict=True):
                rows[key].append(value)
        self.env_steps += self.config.batch_size
        stacked = {key: torch.stack(value, dim=1) for key, value in rows.items()}
        return self._scored(policy, stacked)

    def _scored(self, policy: StructuredPolicy, stacked: Mapping[str, Tensor]) -> Rollout:
        """The round's `Rollout`: the stacked ``[N, T, ...]`` steps, scored by `policy` in one pass, and the
        values of the states after the last step (to bootstrap from)."""
        n, t = self.config.num_envs, self.config.rollout_steps
        action = StructuredAction(stacked["skill"], stacked["raw"], stacked["choice"])
        obs, text, mask = (stacked[key].reshape(n * t, -1) for key in ("obs", "text", "mask"))
        out = policy(obs, text, mask)
        flat_action = StructuredAction(
            *(x.reshape(n * t, *x.shape[2:]) for x in (action.skill, action.raw, action.choice))
        )
        last, _, _ = policy_step(policy, self.obs, self.text)
        return Rollout(
            obs=stacked["obs"],
            text=stacked["text"],
            mask=stacked["mask"],
            action=action,
            logp=out.dist.log_prob(flat_action).reshape(n, t),
            rewards=stacked["rewards"],
            risks=stacked["risks"],
            dones=stacked["dones"],
            episode_step=stacked["episode_step"],
            values=out.value.reshape(n, t),
            risk_values=out.risk_value.reshape(n, t),
            next_value=last.value,
            next_risk_value=last.risk_value,
        )


def minibatches(size: int, count: int, generator: torch.Generator) -> list[Tensor]:
    """A random split of ``range(size)`` into `count` near-equal index tensors."""
    return list(torch.randperm(size, generator=generator).tensor_split(count))


def normalise(x: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)``; a single element is only centred.

    >>> normalise(torch.tensor([1.0, 3.0])).tolist()
    [-0.7071067690849304, 0.7071067690849304]
    """
    if x.numel() < 2:
        return x - x.mean()
    return (x - x.mean()) / (x.std() + eps)


@torch.no_grad()
def evaluate(
    policy: StructuredPolicy,
    encoder: TextEncoder,
    env: StructuredEnv,
    split: Split = Split.TEST,
    *,
    gym: GymConfig | None = None,
    greedy: bool = True,
    seed: int = 0,
    limit: int | None = None,
    prototypes: Sequence[Prototype] = (),
) -> list[EpisodeStats]:
    """Run the first `limit` tasks of `split` (all by default) once each (see `Summary.of` to sum up); a
    policy trained with macro-actions needs the same `prototypes` (`Collector.prototypes`)."""
    generator = torch.Generator().manual_seed(seed)
    with gym_view(env, split, seed=seed, gym=gym, prototypes=prototypes) as gym_env:
        tasks = list(env.tasks(split))[:limit]
        episodes = [_evaluated(policy, encoder, gym_env, task, greedy, generator) for task in tasks]
    return episodes


def _evaluated(
    policy: StructuredPolicy,
    encoder: TextEncoder,
    gym_env: GymView,
    task: Task,
    greedy: bool,
    generator: torch.Generator,
) -> EpisodeStats:
    """One episode of `task`, played by `policy`."""
    obs, info = gym_env.reset(options={"task_id": task.task_id})
    text = encoder.encode([info["instruction"]])
    steps = calls = risky = 0
    done, success = False, False
    while not done:
        flat, mask = observation_tensors([obs])
        dist = policy.act(flat, text, mask)
        action = dist.mode() if greedy else dist.sample(generator)
        obs, _, terminated, truncated, step_info = gym_env.step(
            env_action(policy.layout.env_params(action), action.skill, 0)
        )
        steps += 1
        if int(action.skill[0]) != gym_env.finish_action:
            calls += step_info.get("macro_steps", 1)
            risky += step_info.get("risky_calls", step_info.get("risk_flags", 0) > 0)
        done, success = terminated or truncated, bool(step_info.get("success", False))
    return EpisodeStats(task.task_id, success, steps, calls, risky)


def build_run(
    env: StructuredEnv, config: StructuredRunConfig, policy: StructuredPolicy | None = None
) -> tuple[StructuredPolicy, TextEncoder, Collector]:
    """The seeded pieces every structured trainer starts from: policy, encoder and collector.

    With `policy` (say, one cloned from the expert), a copy of it is trained instead of a fresh one.
    """
    encoder = build_encoder(config.encoder, dim=config.text_dim)
    collector = Collector(env, config, encoder)
    if policy is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            policy = build_policy(
                collector.envs[0],
                encoder.dim,
                config.hidden,
                state=config.state,
                risk_quantiles=config.risk_quantiles,
                cvar_alpha=config.cvar_alpha,
            )
    else:
        if policy.text_dim != encoder.dim:
            raise ValueError(
                f"the policy reads {policy.text_dim}-wide queries; the encoder gives {encoder.dim}"
            )
        policy = copy.deepcopy(policy)
    return policy, encoder, collector


@dataclass(frozen=True, slots=True)
class StepStats:
    """Diagnostics of optimiser steps (plain floats): the surrogate's loss, the critics' loss, the skill
    entropy, the approximate KL to the sampling policy, the share of clipped ratios and the KL from the
    start policy."""

    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    anchor_kl: float = 0.0
    """KL(start policy ‖ policy) on the minibatch's states (0 without an anchor)."""

    @classmethod
    def mean(cls, steps: Sequence[StepStats]) -> StepStats:
        """Each diagnostic averaged over `steps` (at least one).

        >>> StepStats.mean([StepStats(1, 2, 3, 4, 0), StepStats(3, 2, 1, 0, 1)]).policy_loss
        2.0
        """
        if not steps:
            raise ValueError("StepStats.mean needs at least one step")
        return cls(*(sum(getattr(s, f.name) for s in steps) / len(steps) for f in fields(cls)))


@dataclass(frozen=True, slots=True)
class IterationLog:
    """One round of a structured trainer: data, training-episode results and update diagnostics."""

    iteration: int
    env_steps: int
    train: Summary
    """Episodes that finished during this round's rollout."""
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    mean_lambda: float
    """Mean λ of the advantage estimate over the round's steps."""
    kl_beta: float
    """KL coefficient at the end of the round (0 for PPO)."""
    anchor_kl: float = 0.0
    """Mean KL(start policy ‖ policy) over the round's minibatches (0 without an anchor)."""
    anchor_coef: float = 0.0
    """The anchor's weight at the end of the round (0 without one, and in critic warm-up rounds)."""


def round_log(
    iteration: int,
    collector: Collector,
    seen: int,
    stats: StepStats,
    *,
    mean_lambda: float,
    kl_beta: float,
    anchor_coef: float = 0.0,
) -> IterationLog:
    """The log of one round: `stats` are its updates' mean diagnostics; the training summary covers the
    episodes finished after the first `seen`."""
    return IterationLog(
        iteration=iteration,
        env_steps=collector.env_steps,
        train=Summary.of(collector.episodes[seen:]),
        policy_loss=stats.policy_loss,
        value_loss=stats.value_loss,
        entropy=stats.entropy,
        approx_kl=stats.approx_kl,
        clip_fraction=stats.clip_fraction,
        mean_lambda=mean_lambda,
        kl_beta=kl_beta,
        anchor_kl=stats.anchor_kl,
        anchor_coef=anchor_coef,
    )


@dataclass(frozen=True)
class StructuredRun:
    """What a structured trainer returns: the trained policy, its query encoder and one log per round."""

    policy: StructuredPolicy
    encoder: TextEncoder
    history: tuple[IterationLog, ...]


__all__ = [
    "Collector",
    "EpisodeStats",
    "GymView",
    "IterationLog",
    "Rollout",
    "StepStats",
    "StructuredRun",
    "StructuredRunConfig",
    "Summary",
    "build_run",
    "env_action",
    "evaluate",
    "gym_view",
    "minibatches",
    "normalise",
    "round_log",
]
