"""A curriculum by capability level: each task needs a level, and a policy trains on the tasks its levels
unlock.

A task's level is the highest capability it calls on:

    L4  a correct solution uses an entity the request does not name (an earlier turn's order)
    L3  the expert's solution takes `l3_min_steps` steps or more
    L2  the request names entities the solution must read into its calls
    L1  none of these: calling tools is enough

`Curriculum.pool(report)` gives the tasks up to one level above the highest level the policy has reached
(`LevelReport.reached`): a policy that has not reached L1 trains on L1 tasks, one that reached L2 on tasks up
to L3. When no task is that easy, the easiest level present is the pool, so training never starves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sessionrl.envs.base import DecisionEnv, Split, Task
from sessionrl.episodes.metadata import expected_entities
from sessionrl.eval.levels import Level, LevelReport, LevelsConfig, StepsOf
from sessionrl.session import Session

ORDER = tuple(Level)


def task_level(env: DecisionEnv, task: Task, config: LevelsConfig | None = None) -> Level:
    """The level `task` calls on (see the module doc)."""
    config = config or LevelsConfig()
    entities = expected_entities(env, task)
    if any(e not in task.instruction for e in entities):
        return Level.L4
    if len(env.expert(task).steps) >= config.l3_min_steps:
        return Level.L3
    return Level.L2 if entities else Level.L1


def expert_steps(env: DecisionEnv) -> StepsOf:
    """How many steps the expert takes on a session's task (by `metadata.task_id`, any split), for L3;
    None for a task the env does not hold."""
    tasks = {task.task_id: task for split in Split for task in env.tasks(split)}
    cache: dict[str, int] = {}

    def steps(session: Session) -> int | None:
        task = tasks.get(str(session.metadata.get("task_id")))
        if task is None:
            return None
        if task.task_id not in cache:
            cache[task.task_id] = len(env.expert(task).steps)
        return cache[task.task_id]

    return steps


@dataclass(frozen=True, slots=True)
class Curriculum:
    """Tasks with the level each needs, handed out by the levels a policy has reached."""

    tasks: tuple[tuple[Task, Level], ...]

    @classmethod
    def of(cls, env: DecisionEnv, tasks: Sequence[Task], config: LevelsConfig | None = None) -> Curriculum:
        """Each of `tasks` with its level."""
        return cls(tuple((task, task_level(env, task, config)) for task in tasks))

    def limit(self, report: LevelReport | None) -> Level:
        """The highest level unlocked: one above the level reached (L1 before any)."""
        reached = report.reached if report is not None else None
        if reached is None:
            return Level.L1
        return ORDER[min(ORDER.index(reached) + 1, len(ORDER) - 1)]

    def pool(self, report: LevelReport | None) -> list[Task]:
        """The tasks unlocked by `report` (the easiest level present when none is)."""
        if not self.tasks:
            return []
        limit = ORDER.index(self.limit(report))
        unlocked = [task for task, level in self.tasks if ORDER.index(level) <= limit]
        if unlocked:
            return unlocked
        easiest = min((level for _, level in self.tasks), key=ORDER.index)
        return [task for task, level in self.tasks if level is easiest]

    def counts(self) -> dict[str, int]:
        """How many tasks need each level."""
        return {level.value: sum(lv is level for _, lv in self.tasks) for level in ORDER}


__all__ = ["Curriculum", "expert_steps", "task_level"]
