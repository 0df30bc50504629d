"""The global strategy switch and the rule-based fallback strategy.

`strategy_mode` says who decides the next step of every session: `policy` (the routed policy version),
`rules` (a rule-based strategy: the environment's expert plan, or a configured plan template), or `human`
(the session is parked for a person, see `sessionrl.ops.takeover`). It is one row of the store's
`ops_settings`, read before every step that would ask the policy, so a switch takes effect on the next
step of every running session, in every process sharing the store, without a restart.

`RulesBackend` answers the orchestrator's and the gateway's prompts from a fixed plan: the whole plan for a
planning prompt, else the first step not yet answered (one `tool` message per answered step), and the
final message once every step is done.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

import orjson

from sessionrl.envs.base import DecisionEnv, ExpertPlan, ExpertStep, Split
from sessionrl.envs.registry import REGISTRY, EnvBuildError
from sessionrl.ops.config import OpsConfig
from sessionrl.ops.registry import PolicyRegistry
from sessionrl.orchestrator.policy import PolicyReply
from sessionrl.session.model import CallPurpose, Message, Plan, Session

DEFAULT_TEMPLATE = "default"
"""The plan template of sessions whose scenario has none (gateway sessions have no scenario)."""
MODE_KEY = "strategy_mode"
"""The `ops_settings` key of the switch."""


class StrategyMode(StrEnum):
    """Who decides the next step of every session."""

    POLICY = "policy"
    RULES = "rules"
    HUMAN = "human"


def current_mode(registry: PolicyRegistry) -> StrategyMode:
    """The mode in force (`policy` when it was never set)."""
    value = registry.setting(MODE_KEY)
    return StrategyMode(value) if value is not None else StrategyMode.POLICY


def set_mode(registry: PolicyRegistry, mode: StrategyMode | str, *, reason: str = "") -> StrategyMode:
    """Switch every session to `mode` from its next step on (logged with `reason`)."""
    chosen = StrategyMode(mode)
    registry.set_setting(MODE_KEY, chosen.value, detail={"reason": reason})
    return chosen


@functools.lru_cache(maxsize=16)
def _env(name: str) -> DecisionEnv:
    return REGISTRY.build(name)


def expert_plan(session: Session) -> ExpertPlan | None:
    """The expert's plan for the session's task, when its metadata names a built-in env and a task of it."""
    meta = session.metadata
    name, task_id = meta.get("env"), meta.get("task_id")
    if not isinstance(name, str) or not isinstance(task_id, str) or name not in REGISTRY.names():
        return None
    try:
        env = _env(name)
    except (EnvBuildError, OSError, ValueError, TypeError):  # an env that needs options (retail's data)
        return None
    splits = [Split(meta["split"])] if meta.get("split") in set(Split) else list(Split)
    for split in splits:
        task = next((t for t in env.tasks(split) if t.task_id == task_id), None)
        if task is not None:
            return env.expert(task)
    return None


def fallback_plan(session: Session, config: OpsConfig) -> ExpertPlan | None:
    """The rule-based plan for a session: its env's expert plan, else the template of its scenario, else
    the `default` template."""
    plan = expert_plan(session)
    if plan is not None:
        return plan
    template = config.plan_templates.get(session.scenario or "") or config.plan_templates.get(
        DEFAULT_TEMPLATE
    )
    if not template:
        return None
    steps = tuple(
        ExpertStep(f"g{i + 1}", s.description or s.tool, s.tool, s.params) for i, s in enumerate(template)
    )
    return ExpertPlan(session.user_query[:200], steps, "Done: every step of the plan ran.")


class RulesBackend:
    """A policy backend that replays a fixed plan (see the module doc); `policy_version` stays None."""

    def __init__(self, plan: ExpertPlan, session_plan: Plan | None = None) -> None:
        self.plan = plan
        self._ids = {g.tool: g.id for g in reversed(session_plan.subgoals)} if session_plan else {}
        """The session's own sub-goal for each tool (its plan may name sub-goals otherwise than ours)."""

    async def generate(self, messages: Sequence[Message], *, purpose: str) -> PolicyReply:
        """The plan (purpose `plan`), or the next step / the final message (any other purpose)."""
        return PolicyReply(text=orjson.dumps(self.answer(messages, purpose)).decode())

    def answer(self, messages: Sequence[Message], purpose: str) -> dict[str, Any]:
        """The reply as a JSON object (see `generate`)."""
        if purpose == CallPurpose.PLAN:
            subgoals = [
                {"id": s.id, "description": s.description, "tool": s.tool, "depends_on": list(s.depends_on)}
                for s in self.plan.steps
            ]
            return {"root_goal": self.plan.goal, "subgoals": subgoals}
        done = sum(m.role == "tool" for m in messages)
        if done >= len(self.plan.steps):
            return {"final": self.plan.final_message}
        step = self.plan.steps[done]
        return {
            "tool": step.tool,
            "params": dict(step.params),
            "subgoal_id": self._ids.get(step.tool, step.id),
        }
