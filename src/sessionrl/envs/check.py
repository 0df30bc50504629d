"""`check_env`: does an environment keep the `DecisionEnv` promises? Each check says how to fix what it finds.

Checks are small functions over a few tasks of each split. They need the environment to be deterministic
without faults: the expert must solve every task it is asked for, and the same calls must give the same
state. `check_env` runs an event loop of its own, so call it from synchronous code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sessionrl.envs.base import DecisionEnv, Episode, ExpertPlan, Split, Task
from sessionrl.envs.faults import Faults
from sessionrl.errors import SessionRLError
from sessionrl.skills import ErrorCode, SkillCheckError, SkillContract, SkillError, SystemClock, check_skill
from sessionrl.skills.schema import validation_errors, validator_for

_SHARED_STATE = "calls in one episode changed another's state; give each episode its own copy"


class EnvCheckError(SessionRLError):
    """An environment breaks a promise of the `DecisionEnv` protocol; the message says how to fix it."""


def _fail(env: DecisionEnv, message: str) -> EnvCheckError:
    return EnvCheckError(f"env {env.name!r}: {message}")


async def run_plan(episode: Episode, plan: ExpertPlan) -> list[dict[str, Any] | SkillError]:
    """Call each step's skill in order, as an orchestrator would; a failure is recorded and passed over.

    Stops early when the episode terminates. Returns each call's output or error.
    """
    skills = {skill.name: skill for skill in episode.skills()}
    clock = SystemClock()
    results: list[dict[str, Any] | SkillError] = []
    for step in plan.steps:
        if episode.terminated:
            break
        skill = skills.get(step.tool)
        try:
            if skill is None:
                raise SkillError(ErrorCode.UNKNOWN_SKILL, f"the episode offers no skill {step.tool!r}")
            results.append(await skill.invoke(dict(step.params), clock))
        except SkillError as error:
            results.append(error)
    return results


def replay(episode: Episode, plan: ExpertPlan) -> bool:
    """Run `plan` on `episode`, send its final message, and say whether the task is solved."""
    asyncio.run(run_plan(episode, plan))
    return episode.success([plan.final_message])


def check_identity(env: DecisionEnv) -> None:
    """The environment has a name and a policy text."""
    if not env.name or not isinstance(env.name, str):
        raise EnvCheckError("env.name must be a non-empty string such as 'retail'")
    if not env.system_prompt().strip():
        raise _fail(env, "system_prompt() is empty; return the domain policy the agent must follow")


def check_contracts(env: DecisionEnv) -> dict[str, SkillContract]:
    """The contracts are `SkillContract`s with unique names; returns them by name."""
    contracts = list(env.contracts())
    if not contracts:
        raise _fail(env, "contracts() is empty; every domain offers at least one skill")
    for contract in contracts:
        if not isinstance(contract, SkillContract):
            raise _fail(env, f"contracts() holds a {type(contract).__name__}; build each with parse_contract")
    names = [contract.name for contract in contracts]
    if len(set(names)) != len(names):
        raise _fail(env, f"contract names repeat ({sorted(names)}); give each skill its own name")
    return {contract.name: contract for contract in contracts}


def check_tasks(env: DecisionEnv) -> dict[Split, Sequence[Task]]:
    """Some split has tasks (a benchmark domain may have only a test split), and every task has an id
    unique across splits, the split it was listed under, and an instruction."""
    by_split = {split: env.tasks(split) for split in Split}
    if not any(by_split.values()):
        raise _fail(env, "every split is empty; tasks(split) must return the domain's tasks for some split")
    seen: set[str] = set()
    for split, tasks in by_split.items():
        for task in tasks:
            if not task.task_id or task.task_id in seen:
                raise _fail(
                    env, f"task id {task.task_id!r} is empty or repeated; make ids unique across splits"
                )
            if task.split is not split:
                raise _fail(env, f"task {task.task_id} is listed under {split} but says {task.split}")
            if not task.instruction.strip():
                raise _fail(env, f"task {task.task_id} has no instruction; say what the user wants")
            seen.add(task.task_id)
    return by_split


def check_skills(env: DecisionEnv, task: Task, contracts: dict[str, SkillContract]) -> tuple[str, ...]:
    """A fresh episode offers one skill per contract, and each skill passes `check_skill` on an episode of
    its own (so one skill's examples never see another's effects); returns the warnings."""
    episode = env.episode(task, seed=0)
    names = sorted(skill.name for skill in episode.skills())
    if names != sorted(contracts):
        raise _fail(env, f"episode skills {names} differ from contracts {sorted(contracts)}")
    if episode.terminated:
        raise _fail(env, f"a fresh episode of {task.task_id} is already terminated")

    async def check_all() -> list[str]:
        warnings: list[str] = []
        for name, contract in contracts.items():
            skill = next(s for s in env.episode(task, seed=0).skills() if s.name == name)
            warnings += await check_skill(contract, skill)
        return warnings

    fresh_hash = episode.state_hash()
    try:
        warnings = tuple(asyncio.run(check_all()))
    except SkillCheckError as error:
        raise _fail(env, f"a skill fails check_skill: {error}") from error
    if episode.state_hash() != fresh_hash or env.episode(task, seed=0).state_hash() != fresh_hash:
        raise _fail(env, _SHARED_STATE)
    return warnings


def check_expert_plan(env: DecisionEnv, task: Task, contracts: dict[str, SkillContract]) -> ExpertPlan:
    """Steps have unique ids, depend only on earlier steps, call known tools with valid parameters."""
    plan = env.expert(task)
    earlier: set[str] = set()
    for step in plan.steps:
        where = f"expert plan of {task.task_id}, step {step.id!r}"
        if step.id in earlier:
            raise _fail(env, f"{where}: the id repeats; number the steps")
        if not set(step.depends_on) <= earlier:
            raise _fail(
                env, f"{where}: depends on {sorted(set(step.depends_on) - earlier)}, not earlier steps"
            )
        if step.tool not in contracts:
            raise _fail(env, f"{where}: tool {step.tool!r} has no contract; add one or use a listed skill")
        problems = validation_errors(validator_for(contracts[step.tool].input_schema), dict(step.params))
        if problems:
            raise _fail(env, f"{where}: params break {step.tool}'s input schema: {'; '.join(problems)}")
        earlier.add(step.id)
    if not plan.final_message.strip():
        raise _fail(env, f"expert plan of {task.task_id} has no final message to the user")
    return plan


def check_episodes(env: DecisionEnv, task: Task, plan: ExpertPlan) -> None:
    """The expert solves the task, and one episode's calls never reach another's state.

    Doing nothing may solve a task only when the expert's calls change nothing either.
    """
    bystander = env.episode(task, seed=0)
    fresh_hash = bystander.state_hash()
    solved = env.episode(task, seed=0)
    success = replay(solved, plan)
    if bystander.state_hash() != fresh_hash or env.episode(task, seed=1).state_hash() != fresh_hash:
        raise _fail(env, _SHARED_STATE)
    if not success:
        detail = solved.outcome([plan.final_message]).detail or "no detail given"
        raise _fail(env, f"the expert plan of {task.task_id} does not solve it ({detail}); fix expert()")
    empty = env.episode(task, seed=0)
    if empty.success([]) and solved.state_hash() != fresh_hash:
        raise _fail(env, f"{task.task_id} counts as solved with no calls though the expert changes the state")


def check_faults(env: DecisionEnv, task: Task, plan: ExpertPlan) -> None:
    """With `Faults(tool_error=1.0)` every call fails and leaves the state as it was."""
    episode = env.episode(task, seed=0, faults=Faults(tool_error=1.0))
    fresh_hash = episode.state_hash()
    results = asyncio.run(run_plan(episode, plan))
    if any(not isinstance(result, SkillError) for result in results) or episode.state_hash() != fresh_hash:
        raise _fail(
            env, "episode(..., faults=Faults(tool_error=1.0)) ran calls; wrap skills with with_faults"
        )


def check_env(env: DecisionEnv, *, tasks_per_split: int = 3) -> tuple[str, ...]:
    """Run every check over the first `tasks_per_split` tasks of each split; return `check_skill`'s warnings.

    Raises `EnvCheckError` on the first problem. At least one checked task must need some work: an
    environment whose every task is solved by doing nothing cannot teach anything.
    """
    check_identity(env)
    contracts = check_contracts(env)
    tasks = [task for split_tasks in check_tasks(env).values() for task in split_tasks[:tasks_per_split]]
    warnings = check_skills(env, tasks[0], contracts)
    empty_solves = []
    for task in tasks:
        plan = check_expert_plan(env, task, contracts)
        check_episodes(env, task, plan)
        check_faults(env, task, plan)
        empty_solves.append(env.episode(task, seed=0).success([]))
    if all(empty_solves):
        raise _fail(env, "every checked task is solved by doing nothing; success() must look at the outcome")
    return warnings
