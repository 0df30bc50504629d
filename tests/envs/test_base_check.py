"""`check_env` on a tiny counter domain: it passes the correct one and names the fix for each broken one."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from sessionrl.envs import (
    EnvCheckError,
    Episode,
    ExpertPlan,
    ExpertStep,
    Faults,
    Outcome,
    Split,
    Task,
    check_env,
    with_faults,
)
from sessionrl.skills import Skill, SkillContract, callable_skill

ADD = SkillContract.model_validate(
    {
        "name": "add",
        "description": "Add to the counter.",
        "input_schema": {
            "type": "object",
            "properties": {
                "amount": {"type": "integer", "minimum": 1, "maximum": 10, "description": "How much."}
            },
            "required": ["amount"],
            "additionalProperties": False,
        },
        "examples": [{"amount": 1}],
    }
)
READ = SkillContract.model_validate(
    {"name": "read", "description": "Read the counter.", "input_schema": {"type": "object", "properties": {}}}
)


class CounterEpisode(Episode):
    """The counter starts at zero; the task is solved when it equals the task's target."""

    def __init__(self, task: Task, state: dict[str, int], skills_of: Any) -> None:
        self._task = task
        self.state = state
        self._skills: list[Skill] = skills_of(self)

    @property
    def task(self) -> Task:
        return self._task

    @property
    def terminated(self) -> bool:
        return False

    def add(self, params: dict[str, Any]) -> dict[str, Any]:
        self.state["n"] += params["amount"]
        return {"n": self.state["n"]}

    def read(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"n": self.state["n"]}

    def skills(self) -> Sequence[Skill]:
        return self._skills

    def state_hash(self) -> str:
        return str(self.state["n"])

    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        return Outcome({"state": self.state["n"] == self._task.payload["target"]})


class CounterEnv:
    """A correct environment; the subclasses below each break one promise."""

    name = "counter"
    episode_type: type[CounterEpisode] = CounterEpisode

    def system_prompt(self) -> str:
        return "Add to the counter until it reaches the target."

    def contracts(self) -> Sequence[SkillContract]:
        return (ADD, READ)

    def tasks(self, split: Split) -> Sequence[Task]:
        return tuple(Task(f"{split}-{t}", split, f"reach {t}", {"target": t}) for t in (0, 3, 7))

    def new_state(self) -> dict[str, int]:
        return {"n": 0}

    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> CounterEpisode:
        def skills_of(episode: CounterEpisode) -> list[Skill]:
            bound = [callable_skill(ADD, episode.add), callable_skill(READ, episode.read)]
            return with_faults(bound, faults, seed)

        return self.episode_type(task, self.new_state(), skills_of)

    def expert(self, task: Task) -> ExpertPlan:
        target = task.payload["target"]
        steps = (
            ExpertStep("s1", "look", "read", {}),
            ExpertStep("s2", "add", "add", {"amount": target}, ("s1",)),
        )
        return ExpertPlan("reach the target", steps if target else steps[:1], f"the counter is at {target}")


SHARED = {"n": 0}


class SharedState(CounterEnv):
    def new_state(self) -> dict[str, int]:
        return SHARED


class UnknownTool(CounterEnv):
    def expert(self, task: Task) -> ExpertPlan:
        plan = super().expert(task)
        return dataclasses.replace(plan, steps=(ExpertStep("s1", "mul", "multiply", {"by": 2}),))


class BadParams(CounterEnv):
    def expert(self, task: Task) -> ExpertPlan:
        return dataclasses.replace(
            super().expert(task), steps=(ExpertStep("s1", "add", "add", {"amount": 50}),)
        )


class LaterDependency(CounterEnv):
    def expert(self, task: Task) -> ExpertPlan:
        plan = super().expert(task)
        return dataclasses.replace(plan, steps=(dataclasses.replace(plan.steps[0], depends_on=("s2",)),))


class WrongExpert(CounterEnv):
    def expert(self, task: Task) -> ExpertPlan:
        return dataclasses.replace(
            super().expert(task), steps=(ExpertStep("s1", "add", "add", {"amount": 1}),)
        )


class LenientEpisode(CounterEpisode):
    def outcome(self, messages_to_user: Sequence[str]) -> Outcome:
        return Outcome({"said": True})


class Lenient(CounterEnv):
    episode_type = LenientEpisode


class IgnoresFaults(CounterEnv):
    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> CounterEpisode:
        return super().episode(task, seed=seed, faults=None)


class RepeatedIds(CounterEnv):
    def tasks(self, split: Split) -> Sequence[Task]:
        return tuple(Task("same", split, "reach 3", {"target": 3}) for _ in range(2))


class MislabelledSplit(CounterEnv):
    def tasks(self, split: Split) -> Sequence[Task]:
        return tuple(Task(f"{split}-{t}", Split.TRAIN, "reach", {"target": t}) for t in (1, 2))


class MissingSkill(CounterEnv):
    def episode(self, task: Task, *, seed: int = 0, faults: Faults | None = None) -> CounterEpisode:
        return CounterEpisode(task, self.new_state(), lambda e: [callable_skill(ADD, e.add)])


class OnlyTestSplit(CounterEnv):
    """A benchmark domain: its tasks are all for the report."""

    def tasks(self, split: Split) -> Sequence[Task]:
        return super().tasks(split) if split is Split.TEST else ()


class NoTasks(CounterEnv):
    def tasks(self, split: Split) -> Sequence[Task]:
        return ()


class NoPolicy(CounterEnv):
    def system_prompt(self) -> str:
        return "  "


def test_a_correct_environment_passes() -> None:
    assert check_env(CounterEnv()) == ()


def test_a_domain_with_only_a_test_split_passes() -> None:
    assert check_env(OnlyTestSplit()) == ()


@pytest.mark.parametrize(
    ("env", "fix"),
    [
        (SharedState(), "give each episode its own copy"),
        (UnknownTool(), "tool 'multiply' has no contract"),
        (BadParams(), "amount: 50 is greater than the maximum of 10"),
        (LaterDependency(), r"depends on \['s2'\], not earlier steps"),
        (WrongExpert(), "does not solve it"),
        (Lenient(), "solved with no calls though the expert changes the state"),
        (IgnoresFaults(), "wrap skills with with_faults"),
        (RepeatedIds(), "make ids unique across splits"),
        (MislabelledSplit(), "is listed under dev but says train"),
        (MissingSkill(), r"episode skills \['add'\] differ from contracts"),
        (NoPolicy(), "system_prompt\\(\\) is empty"),
        (NoTasks(), "every split is empty"),
    ],
)
def test_each_broken_promise_is_named_with_its_fix(env: CounterEnv, fix: str) -> None:
    SHARED["n"] = 0
    with pytest.raises(EnvCheckError, match=fix):
        check_env(env)
