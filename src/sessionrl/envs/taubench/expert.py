"""The expert scaffold of τ-bench-style domains: build a plan around a task's gold actions.

A domain's expert opens a `PlanBuilder` over a scratch copy of the tables, adds the look-ups a careful
agent makes (`add`, or `read` for a record read once), then each gold action (`act`, which also runs it on
the scratch copy to learn whether it will succeed), and ends with `final_message`. `gold_expert` is the
plainest such expert: the gold actions one after the other.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from sessionrl.envs.base import ExpertPlan, ExpertStep, Task
from sessionrl.envs.taubench.data import TauDb
from sessionrl.envs.taubench.tools import Tool
from sessionrl.skills import SkillError


class PlanBuilder:
    """Appends numbered steps (`s1`, `s2`, ...) to a plan; remembers which step read each record."""

    def __init__(self, db: TauDb, tools: Mapping[str, Tool[...]]) -> None:
        self.db = db
        """The scratch copy of the tables that `act` runs the gold actions on."""
        self.tools = tools
        self.steps: list[ExpertStep] = []
        self.reads: dict[str, str] = {}
        """The step that read each key given to `read`."""

    def add(
        self, description: str, tool: str, params: Mapping[str, Any], depends_on: Sequence[str] = ()
    ) -> str:
        """Add a step calling `tool` with `params` after the steps `depends_on`; returns its id."""
        if isinstance(depends_on, str):
            raise TypeError(f"depends_on takes a sequence of step ids, not the string {depends_on!r}")
        if tool not in self.tools:
            raise ValueError(f"the expert calls {tool!r}, which is not one of the domain's tools")
        step_id = f"s{len(self.steps) + 1}"
        deps = tuple(dict.fromkeys(depends_on))
        self.steps.append(ExpertStep(step_id, description, tool, copy.deepcopy(dict(params)), deps))
        return step_id

    def read(
        self, key: str, description: str, tool: str, params: Mapping[str, Any], depends_on: Sequence[str] = ()
    ) -> str:
        """The step reading `key` (a record's id), added the first time it is asked for."""
        if key not in self.reads:
            self.reads[key] = self.add(description, tool, params, depends_on)
        return self.reads[key]

    def act(
        self, action: Mapping[str, Any], description: str, depends_on: Sequence[str] = ()
    ) -> tuple[str, SkillError | None]:
        """Add a step making the gold `action` (`{name, kwargs}`) and run it on the scratch copy.

        Returns the step's id and the error the action will meet (None when it will succeed), so the
        expert can report the failure and keep later steps from waiting on it.
        """
        step = self.add(description, action["name"], action["kwargs"], depends_on)
        try:
            self.tools[action["name"]](self.db, **action["kwargs"])
        except SkillError as error:
            return step, error
        return step, None

    def plan(self, goal: str, final_message: str) -> ExpertPlan:
        """The plan built so far."""
        return ExpertPlan(goal=goal, steps=tuple(self.steps), final_message=final_message)


def final_message(done: Sequence[str], failed: Sequence[str], outputs: Sequence[str]) -> str:
    """The expert's last message: what it did, what it could not do, and every output the task expects.

    >>> final_message(["cancelled order #1"], [], ["42.50"])
    'I have cancelled order #1. The details you asked for: 42.50. Is there anything else I can help with?'
    """
    parts = [f"I have {', '.join(done)}." if done else "No change to your account was needed."]
    parts += [f"{report}." for report in failed]
    if outputs:
        parts.append(f"The details you asked for: {'; '.join(outputs)}.")
    parts.append("Is there anything else I can help with?")
    return " ".join(parts)


def gold_expert(task: Task, db: TauDb, tools: Mapping[str, Tool[...]]) -> ExpertPlan:
    """The gold actions one after the other (each after the last that succeeds), then `final_message`.

    `db` is a fresh copy of the tables, used up here.
    """
    builder = PlanBuilder(db, tools)
    done: list[str] = []
    failed: list[str] = []
    last: tuple[str, ...] = ()
    for action in task.payload["actions"]:
        step, error = builder.act(action, f"call {action['name']}", last)
        if error is None:
            done.append(f"called {action['name']}")
            last = (step,)
        else:
            failed.append(f"I could not call {action['name']} ({error.message})")
    return builder.plan(f"resolve task {task.task_id}", final_message(done, failed, task.payload["outputs"]))
