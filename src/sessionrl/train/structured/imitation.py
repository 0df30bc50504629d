"""Imitation for the structured policy: expert plans replayed as Gymnasium actions, then behaviour cloning.

The expert of a `DecisionEnv` writes plans of tool calls with full parameters. `demonstrations` replays
each plan on a `DecisionGymEnv` and records, before every step, the observation, the query embedding, the
mask and the action the policy would have had to take: the tool's skill index and, for each of its
bounded parameters (`ParamSpec`), the value written back into the policy's coordinates:

* a number ``v`` in the episode's range ``[low, high]`` becomes ``x = 2 (v - low) / (high - low) - 1`` and
  the Gaussian draw ``u = atanh(x)`` (``x`` kept within ``±(1 - 1e-6)`` so ``u`` is finite);
* a choice becomes its index among the spec's choices.

The plan ends with *finish*. With ``run.prototypes`` the replay runs on the same macro-action view as the
trainers, so the layouts agree, but the demonstrations stay atomic calls: a macro's later steps may have
bounds that only its earlier steps settle. `clone` then fits a policy to those actions by maximum likelihood
(``-mean log π(a|s)``), which is the imitation stage that RL (`ppo`, `aaac`) continues from. Last,
`refit_log_std` sets each number head's σ to its error on the demonstrations, so the clone samples (as RL
does) nearly as well as it acts greedily.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from sessionrl.envs.base import Split, Task
from sessionrl.envs.gym import StructuredEnv
from sessionrl.envs.prototypes import expert_prototypes
from sessionrl.policy.encoder import TextEncoder
from sessionrl.policy.structured import (
    LOG_STD_RANGE,
    ActionLayout,
    StructuredAction,
    StructuredPolicy,
    flatten_observation,
)
from sessionrl.train.structured.rollout import (
    GymView,
    StructuredRun,
    StructuredRunConfig,
    build_run,
    env_action,
    gym_view,
    minibatches,
)
from sessionrl.train.threads import torch_threads

EDGE = 1.0 - 1e-6
"""Largest ``|x|`` written back for a number, so ``atanh(x)`` stays finite."""


@dataclass(frozen=True, slots=True)
class ImitationConfig:
    """How the structured policy imitates the expert."""

    demos: int = field(default=60, metadata={"help": "training tasks demonstrated (the first ones)"})
    epochs: int = field(default=30, metadata={"help": "passes over the demonstrations"})
    batch_size: int = field(default=64, metadata={"help": "steps per gradient step"})
    lr: float = field(default=3e-3, metadata={"help": "Adam learning rate"})
    refit_std: bool = field(
        default=True,
        metadata={"help": "set each number head's σ to its RMS error on the demonstrations after fitting"},
    )

    def __post_init__(self) -> None:
        if self.demos < 1 or self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("ImitationConfig needs demos, epochs and batch_size >= 1 and lr > 0")


@dataclass(frozen=True)
class Demonstrations:
    """Expert steps as one batch: flat observations, query embeddings, masks and actions (``[S, ...]``)."""

    obs: Tensor
    text: Tensor
    mask: Tensor
    action: StructuredAction
    solved: int
    """Replayed plans the environment judged solved."""
    tasks: int


def expert_action(
    gym_env: GymView, layout: ActionLayout, tool: str, params: Mapping[str, Any]
) -> StructuredAction:
    """The policy's action for a call to `tool` with `params`, in the current episode (see module doc)."""
    skill = gym_env.skill_names.index(tool)
    bounds = gym_env.episode.param_bounds().get(tool, {})
    raw: dict[int, float] = {}
    picks: dict[int, int] = {}
    for slot, spec in enumerate(gym_env.param_specs[tool]):
        value = params[spec.name]
        if spec.choices:
            picks[slot] = spec.choices.index(value)
            continue
        low, high = bounds.get(spec.name, (spec.low, spec.high))
        x = 2.0 * (float(value) - low) / (high - low) - 1.0 if high > low else 0.0
        raw[slot] = math.atanh(min(max(x, -EDGE), EDGE))
    return layout.action(skill, raw, picks)


def demonstrations(
    env: StructuredEnv,
    tasks: Sequence[Task],
    layout: ActionLayout,
    encoder: TextEncoder,
    config: StructuredRunConfig,
) -> Demonstrations:
    """Replay the expert's plan of every task (all of one split) on a Gymnasium view of `env` and record
    each step, the actions laid out for a policy of `layout`."""
    if not tasks:
        raise ValueError("demonstrations need at least one task")
    obs_rows, text_rows, mask_rows, actions = [], [], [], []
    solved = 0
    prototypes = expert_prototypes(env, config.prototypes) if config.prototypes else ()
    with gym_view(env, tasks[0].split, seed=config.seed, gym=config.gym, prototypes=prototypes) as gym_env:
        for task in tasks:
            obs, info = gym_env.reset(options={"task_id": task.task_id})
            text = encoder.encode([info["instruction"]])
            plan = env.expert(task)
            calls = [(step.tool, dict(step.params)) for step in plan.steps]
            for tool, params in [*calls, (None, {})]:
                action = (
                    expert_action(gym_env, layout, tool, params)
                    if tool is not None
                    else layout.action(gym_env.finish_action, {}, {})
                )
                obs_rows.append(torch.from_numpy(flatten_observation(obs)))
                text_rows.append(text[0])
                mask_rows.append(torch.from_numpy(np.asarray(obs["action_mask"], np.int64)))
                actions.append(action)
                vector = layout.env_params(action)
                obs, _, terminated, truncated, step_info = gym_env.step(env_action(vector, action.skill, 0))
                if terminated or truncated:
                    solved += bool(step_info.get("success", False))
                    break
    return Demonstrations(
        obs=torch.stack(obs_rows),
        text=torch.stack(text_rows),
        mask=torch.stack(mask_rows),
        action=StructuredAction(
            *(torch.cat([getattr(a, k) for a in actions]) for k in ("skill", "raw", "choice"))
        ),
        solved=solved,
        tasks=len(tasks),
    )


def clone(
    policy: StructuredPolicy, demos: Demonstrations, config: ImitationConfig, seed: int = 0
) -> list[float]:
    """Fit `policy` to `demos` by maximum likelihood; returns the mean loss of every epoch.

    The learning rate follows a cosine from `config.lr` down to 0 over the run: the parameter heads must
    land within the judge's tolerance (a refund within 1% of the order amount), which a constant rate
    keeps stepping over.
    """
    optimizer = torch.optim.Adam(policy.param_groups(config.lr), fused=True)
    generator = torch.Generator().manual_seed(seed)
    size = demos.obs.shape[0]
    count = max(1, size // config.batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.epochs * count)
    losses = []
    for _ in range(config.epochs):
        total = 0.0
        parts = minibatches(size, count, generator)
        for idx in parts:
            out = policy(demos.obs[idx], demos.text[idx], demos.mask[idx])
            loss = -out.dist.log_prob(demos.action[idx]).mean()
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(loss)
            optimizer.step()
            schedule.step()
            total += loss.item()
        losses.append(total / len(parts))
    return losses


@torch.no_grad()
def refit_log_std(policy: StructuredPolicy, demos: Demonstrations) -> Tensor:
    """Set each number head's log σ to the log of its root-mean-square error on the demonstrations that
    use it (clamped to `LOG_STD_RANGE`): given the fitted means, the maximum-likelihood σ. Returns the new
    ``[H_num]`` log σ; a head no demonstration uses keeps its value.

    Gradient steps leave σ far above that error: while the means travel to their targets (a full refund is
    ``u ≈ 7.25``) the errors are large and push σ up, and the cosine rate has decayed by the time the means
    arrive. The greedy clone never reads σ, but RL samples with it: at σ ≈ 0.3 a sampled refund misses the
    judge's 1% tolerance, so sampled episodes fail where greedy ones succeed, and RL learns from failures
    the greedy policy never makes.
    """
    mean = policy.act(demos.obs, demos.text, demos.mask).mean
    owned = policy.layout.owned(demos.action.skill)[0].to(mean.dtype)
    count = owned.sum(0)
    squared = ((demos.action.raw - mean).square() * owned).sum(0) / count.clamp_min(1.0)
    fitted = 0.5 * squared.clamp_min(torch.finfo(mean.dtype).tiny).log()
    log_std = torch.where(count > 0, fitted.clamp(*LOG_STD_RANGE), policy.log_std)
    policy.log_std.copy_(log_std)
    return log_std


def imitate(
    env: StructuredEnv,
    run: StructuredRunConfig,
    config: ImitationConfig,
    *,
    on_epoch: Callable[[int, float], None] | None = None,
) -> StructuredRun:
    """A fresh policy (built as the RL trainers build theirs) cloned on the first `config.demos` training
    tasks; its `history` is empty. Pass `result.policy` to `train_ppo` / `train_aaac` with the same `run`.
    `on_epoch` sees each epoch's number and mean loss."""
    policy, encoder, collector = build_run(env, run)
    collector.close()
    tasks = list(env.tasks(Split.TRAIN))[: config.demos]
    demos = demonstrations(env, tasks, policy.layout, encoder, run)
    with torch_threads(run.threads):
        losses = clone(policy, demos, config, seed=run.seed)
        if config.refit_std:
            refit_log_std(policy, demos)
    for epoch, loss in enumerate(losses):
        if on_epoch is not None:
            on_epoch(epoch, loss)
    return StructuredRun(policy, encoder, ())


__all__ = [
    "Demonstrations",
    "ImitationConfig",
    "clone",
    "demonstrations",
    "expert_action",
    "imitate",
    "refit_log_std",
]
