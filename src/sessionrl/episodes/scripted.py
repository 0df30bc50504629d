"""Scripted agents: a plan written before the episode starts (the env's expert, or a task's gold actions).

The plan is the session's plan step; each plan step is one tool step in plan order, naming its sub-goal
and called again (up to `RolloutConfig.expert_retries` times) after a retryable failure such as
`UNAVAILABLE`, so a demonstration that met a transient fault shows the failed call, the error and the
call made again. Steps stop once the domain ends the episode (a hand-off). The plan's final message ends
the session; a plan the guards refuse ends it with nothing said to the user.

A `plan_order` fault may reverse the plan as it arrives; the guards then refuse the steps whose
dependencies have not run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sessionrl.envs.base import DecisionEnv, ExpertPlan, GoldPlans, Task, stream_seed
from sessionrl.envs.faults import inject_plan_faults
from sessionrl.episodes.config import guards_for_plans
from sessionrl.episodes.driver import Attempt
from sessionrl.orchestrator.config import OrchestratorConfig
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.orchestrator.results import PlanPayload, StepKind, ToolPayload
from sessionrl.session.model import Plan, SubGoal


class NoGoldPlans(ValueError):
    """The environment cannot give its tasks' gold actions as plans."""

    def __init__(self, env: str) -> None:
        super().__init__(
            f"{env} has no gold plans: gold replay needs an env that implements "
            "sessionrl.envs.base.GoldPlans (gold_plan(task) -> ExpertPlan), as τ-bench-style domains do"
        )


def session_plan(plan: ExpertPlan) -> Plan:
    """The session's plan DAG for a scripted plan: one sub-goal per step, with its tool and dependencies."""
    subgoals = tuple(
        SubGoal(id=step.id, description=step.description, tool=step.tool, depends_on=step.depends_on)
        for step in plan.steps
    )
    return Plan(root_goal=plan.goal, subgoals=subgoals)


@dataclass(slots=True)
class ScriptedAgent:
    """Replays the plan `plans` gives for each task (see the module doc); plans are made once per task."""

    name: str
    plans: Callable[[Task], ExpertPlan]
    _made: dict[str, ExpertPlan] = field(default_factory=dict, repr=False)

    @property
    def policy_version(self) -> None:
        """A scripted plan has no policy version."""
        return None

    @property
    def backends(self) -> Sequence[PolicyBackend]:
        """A scripted plan asks no policy."""
        return ()

    def plan(self, task: Task) -> ExpertPlan:
        """The plan for `task`."""
        if task.task_id not in self._made:
            self._made[task.task_id] = self.plans(task)
        return self._made[task.task_id]

    def engine_config(self, base: OrchestratorConfig, tasks: Sequence[Task]) -> OrchestratorConfig:
        """`base` with the plan guards widened to let these tasks' plans through (`guards_for_plans`)."""
        return guards_for_plans(base, (self.plan(task) for task in tasks))

    async def act(self, attempt: Attempt) -> str | None:
        """Send the plan, call each step's tool, and answer with the plan's final message."""
        engine, sid, spec = attempt.engine, attempt.session_id, attempt.spec
        plan = self.plan(spec.task)
        if spec.faults is not None:
            rng = random.Random(stream_seed(spec.seed, "plan", spec.task.task_id))
            plan = inject_plan_faults(plan, spec.faults, rng)
        planned = await engine.execute_step(sid, StepKind.PLAN, PlanPayload(plan=session_plan(plan)))
        if not planned.ok:
            return None
        for step in plan.steps:
            if attempt.episode.terminated:
                break
            payload = ToolPayload(tool=step.tool, params=dict(step.params), subgoal_id=step.id)
            for _ in range(1 + attempt.config.expert_retries):
                result = await engine.execute_step(sid, StepKind.TOOL, payload)
                if result.ok or not result.retryable:
                    break
        return plan.final_message


def expert(env: DecisionEnv) -> ScriptedAgent:
    """The env's expert (`env.expert(task)`)."""
    return ScriptedAgent("expert", env.expert)


def gold(env: DecisionEnv) -> ScriptedAgent:
    """The tasks' gold actions (`env.gold_plan(task)`); raises `NoGoldPlans` when the env has none."""
    if not isinstance(env, GoldPlans):
        raise NoGoldPlans(env.name)
    return ScriptedAgent("gold", env.gold_plan)
