"""The structured policy as an agent, so its episodes are ordinary Decision Sessions.

Research code, not part of the package: the structured trainers and their evaluation step `DecisionGymEnv`,
and nothing in the product runs a structured policy through the engine yet (tests/bench exercise this).

The trainers step `DecisionGymEnv` directly for speed; this agent runs the same policy the way every other
agent runs, through the engine, the session store and the reward engine:

    plan ──▶ one sub-goal, ``resolve``: the policy decides one skill at a time, so the plan names no tool
    tool step per skill the policy picks (parameters decoded from its outputs, then bound by the episode)
    ... until it picks *finish*, the domain ends the task, or ``GymConfig.max_steps`` steps
    final message: the episode's summary

The policy sees observations laid out exactly as `DecisionGymEnv` lays them out (`observe`), built from the
episode and from the step results the engine returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, cast

import numpy as np
import torch

from sessionrl.envs.base import Task
from sessionrl.envs.gym import (
    GymConfig,
    Observation,
    ParamSpec,
    StructuredEnv,
    StructuredEpisode,
    param_specs,
)
from sessionrl.episodes.driver import Attempt
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.orchestrator.results import PlanPayload, StepKind, ToolPayload
from sessionrl.policy.encoder import TextEncoder
from sessionrl.policy.structured import StructuredPolicy, policy_step
from sessionrl.session.model import Plan, SubGoal

SUBGOAL: Final = "resolve"
PLAN: Final = Plan(
    root_goal="Resolve the request one skill call at a time",
    subgoals=(SubGoal(id=SUBGOAL, description="Call skills chosen step by step by the structured policy"),),
)
"""The plan of every structured session: one sub-goal that all its tool calls serve."""


@dataclass
class Progress:
    """What the policy has seen of its calls: skills that succeeded once, skills whose last call failed."""

    succeeded: np.ndarray
    failed: np.ndarray
    steps: int = 0

    @classmethod
    def start(cls, skills: int) -> Progress:
        """Nothing called yet."""
        return cls(np.zeros(skills, np.int8), np.zeros(skills, np.int8))

    def record(self, skill: int, ok: bool) -> None:
        """One call of `skill` ended, successfully or not."""
        self.steps += 1
        self.succeeded[skill] |= ok
        self.failed[skill] = not ok


def observe(
    episode: StructuredEpisode, skills: Sequence[str], progress: Progress, max_steps: int
) -> Observation:
    """The observation `DecisionGymEnv` would give for this episode after these calls."""
    mask = episode.action_mask()
    allowed = [mask.get(name, False) for name in skills] + [True]
    return {
        "step": np.array([min(progress.steps / max_steps, 1.0)], np.float32),
        "succeeded": progress.succeeded.copy(),
        "failed": progress.failed.copy(),
        "features": np.asarray(episode.features(), np.float32),
        "action_mask": np.asarray(allowed, np.int8),
    }


def decode(
    episode: StructuredEpisode, skill: str, specs: Sequence[ParamSpec], params: Sequence[float]
) -> dict[str, object]:
    """The bounded parameter values the policy's outputs stand for, in this episode's ranges."""
    bounds = episode.param_bounds().get(skill, {})
    return {spec.name: spec.decode(float(params[i]), bounds.get(spec.name)) for i, spec in enumerate(specs)}


@dataclass(frozen=True)
class StructuredAgent:
    """`policy` (reading requests through `encoder`) acting on episodes of `env`: greedy unless a
    `generator` is given, then sampled from it."""

    env: StructuredEnv
    policy: StructuredPolicy
    encoder: TextEncoder
    gym: GymConfig = field(default_factory=GymConfig)
    generator: torch.Generator | None = None
    name: str = "structured"

    @property
    def policy_version(self) -> None:
        """The structured policy carries no version."""
        return None

    @property
    def backends(self) -> Sequence[PolicyBackend]:
        """The policy runs here, not behind the engine: it asks no backend."""
        return ()

    @property
    def skill_names(self) -> tuple[str, ...]:
        """The env's skills in the order of the policy's skill head (the last choice is *finish*)."""
        return tuple(sorted(c.name for c in self.env.contracts()))

    def engine_config(self, base: OrchestratorConfig, tasks: Sequence[Task]) -> OrchestratorConfig:
        """`base` unchanged: the one-sub-goal plan passes every guard."""
        return base

    async def act(self, attempt: Attempt) -> str | None:
        """Plan the one sub-goal, then call the skills the policy picks; answer with the episode's summary."""
        if attempt.env.name != self.env.name:
            raise ValueError(f"a structured agent of {self.env.name} cannot act on {attempt.env.name}")
        episode = cast(StructuredEpisode, attempt.episode)  # episodes of a StructuredEnv are structured
        names = self.skill_names
        contracts = {c.name: c for c in self.env.contracts()}
        text = self.encoder.encode([attempt.spec.task.instruction])
        progress = Progress.start(len(names))
        engine, sid, max_steps = attempt.engine, attempt.session_id, self.gym.max_steps
        await engine.execute_step(sid, StepKind.PLAN, PlanPayload(plan=PLAN))
        while progress.steps < max_steps and not episode.terminated:
            with torch.no_grad():
                out, _, _ = policy_step(self.policy, [observe(episode, names, progress, max_steps)], text)
                action = out.dist.sample(self.generator) if self.generator is not None else out.dist.mode()
                values = self.policy.layout.env_params(action)[0].tolist()
            index = int(action.skill[0])
            if index == len(names):
                break
            name = names[index]
            chosen = decode(episode, name, param_specs(contracts[name]), values)
            payload = ToolPayload(tool=name, params=episode.bind(name, chosen), subgoal_id=SUBGOAL)
            result = await engine.execute_step(sid, StepKind.TOOL, payload)
            progress.record(index, result.ok)
        return episode.summary()
