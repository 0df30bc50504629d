"""The structured policy acting through the orchestrator, so its episodes are ordinary Decision Sessions.

The trainers step `DecisionGymEnv` directly for speed; this path runs the same policy the way every other
agent runs, through the engine, the session store and the reward engine:

    init_session (metadata: env, split, task_id, agent "structured", seed)
    plan ──▶ one sub-goal, ``resolve``: the policy decides one skill at a time, so the plan names no tool
    tool step per skill the policy picks (parameters decoded from its outputs, then bound by the episode)
    ... until it picks *finish*, the domain ends the task, or ``max_steps`` steps
    finish (the episode's summary) ──▶ a ``task_outcome`` feedback: 1.0 when solved, else 0.0

The policy sees observations laid out exactly as `DecisionGymEnv` lays them out (`observe`), built from the
episode and from the step results the engine returns. With a `RewardEngine`, each finished session is
scored and its reward vector stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

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
from sessionrl.envs.runner import EpisodeSkills
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.results import PlanPayload, StepKind, ToolPayload
from sessionrl.policy.encoder import TextEncoder
from sessionrl.policy.structured import StructuredPolicy
from sessionrl.rewards.engine import RewardEngine
from sessionrl.session.model import Feedback, FeedbackType, Plan, Session, SessionCreate, SubGoal
from sessionrl.skills import ExecutorConfig, SkillExecutor
from sessionrl.store import SessionStore
from sessionrl.train.structured.rollout import policy_step

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


def _create(env: StructuredEnv, task: Task, seed: int) -> SessionCreate:
    metadata = {
        "env": env.name,
        "split": task.split.value,
        "task_id": task.task_id,
        "agent": "structured",
        "seed": seed,
    }
    return SessionCreate(
        user_query=task.instruction,
        scenario=env.name,
        tags=(env.name, task.split.value, "structured"),
        metadata=metadata,
    )


async def run_structured_session(
    engine: Orchestrator,
    env: StructuredEnv,
    task: Task,
    policy: StructuredPolicy,
    encoder: TextEncoder,
    *,
    seed: int = 0,
    gym: GymConfig | None = None,
    generator: torch.Generator | None = None,
) -> Session:
    """Let `policy` attempt `task` as one session of `engine` (built over `EpisodeSkills`); return it judged.

    Greedy unless a `generator` is given, then sampled from it.
    """
    skills = engine.executor
    if not isinstance(skills, EpisodeSkills):
        raise TypeError("the engine must be built over EpisodeSkills: Orchestrator(store, EpisodeSkills())")
    max_steps = (gym or GymConfig()).max_steps
    contracts = {c.name: c for c in env.contracts()}
    names = tuple(sorted(contracts))
    specs = {name: param_specs(contracts[name]) for name in names}
    session_id = await engine.init_session(_create(env, task, seed))
    episode = env.episode(task, seed=seed)
    text = encoder.encode([task.instruction])
    progress = Progress.start(len(names))
    async with SkillExecutor(episode.skills(), ExecutorConfig(seed=seed)) as executor:
        with skills.bind(executor):
            await engine.execute_step(session_id, StepKind.PLAN, PlanPayload(plan=PLAN))
            while progress.steps < max_steps and not episode.terminated:
                with torch.no_grad():
                    out, _, _ = policy_step(policy, [observe(episode, names, progress, max_steps)], text)
                    action = out.dist.sample(generator) if generator is not None else out.dist.mode()
                    values = policy.layout.env_params(action)[0].tolist()
                index = int(action.skill[0])
                if index == len(names):
                    break
                name = names[index]
                chosen = decode(episode, name, specs[name], values)
                payload = ToolPayload(tool=name, params=episode.bind(name, chosen), subgoal_id=SUBGOAL)
                result = await engine.execute_step(session_id, StepKind.TOOL, payload)
                progress.record(index, result.ok)
    message = episode.summary()
    await engine.finish(session_id, message)
    outcome = episode.outcome([message])
    verdict = Feedback(
        type=FeedbackType.TASK_OUTCOME,
        score=1.0 if outcome.success else 0.0,
        comment=outcome.detail or "solved",
        annotator=f"{env.name}_checker",
        data={"checks": dict(outcome.checks), "detail": outcome.detail},
    )
    await engine.inject_feedback(session_id, verdict)
    return await engine.session(session_id)


def run_structured_sessions(
    env: StructuredEnv,
    tasks: Sequence[Task],
    policy: StructuredPolicy,
    encoder: TextEncoder,
    store: SessionStore,
    *,
    rewards: RewardEngine | None = None,
    seed: int = 0,
    gym: GymConfig | None = None,
) -> list[Session]:
    """Run `policy` greedily on each task, one session each, into `store` (runs its own event loop).

    With `rewards`, every finished session is scored and its reward vector stored.
    """

    async def run_all() -> list[Session]:
        async with Orchestrator(store, EpisodeSkills()) as engine:
            return [
                await run_structured_session(engine, env, t, policy, encoder, seed=seed, gym=gym)
                for t in tasks
            ]

    sessions = asyncio.run(run_all())
    if rewards is not None:
        rewards.store_all(store, (s.session_id for s in sessions))
    return sessions


__all__ = [
    "PLAN",
    "SUBGOAL",
    "Progress",
    "decode",
    "observe",
    "run_structured_session",
    "run_structured_sessions",
]
