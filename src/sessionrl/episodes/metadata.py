"""What every episode's session says about itself when it opens (`sessionrl.eval` reads some of it).

Each session is created with `scenario` = the env's name, tags (env, split, agent), and this metadata:

    env, split, task_id     which task of which domain
    agent                   who acted: "expert", "gold", "llm", "structured"
    seed                    the seed of the episode's domain state and faults
    policy_version          the acting policy's version (None for scripted plans)
    expected_entities       entities a correct solution passes to its tools (Entity Recall@5)
    expected_tools          an LLM policy's episodes only: the tools the expert's plan calls, each once
                            (the `right_tool` credit of `sessionrl.rewards.credit` reads them)
    ...                     the episode's extras (stage, group, iteration, label)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessionrl.envs.base import DecisionEnv, NamesEntities, Task, entities_named
from sessionrl.session.model import SessionCreate


def expected_entities(env: DecisionEnv, task: Task) -> list[str]:
    """The entities a correct solution of `task` must use: what the env says when it names them
    (`NamesEntities`), else the request's entities that the expert's plan passes to its tools."""
    if isinstance(env, NamesEntities):
        return [str(entity) for entity in env.expected_entities(task)]
    return entities_named(task, env.expert(task))


def expected_tools(env: DecisionEnv, task: Task) -> list[str]:
    """The tools the expert's plan for `task` calls, in plan order, each once."""
    return list(dict.fromkeys(step.tool for step in env.expert(task).steps))


def session_create(
    env: DecisionEnv,
    task: Task,
    *,
    agent: str,
    seed: int,
    session_id: str | None = None,
    policy_version: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> SessionCreate:
    """The session an episode of `task` opens, with the metadata the module doc lists."""
    metadata: dict[str, Any] = {
        "env": env.name,
        "split": task.split.value,
        "task_id": task.task_id,
        "agent": agent,
        "seed": seed,
        "policy_version": policy_version,
        "expected_entities": expected_entities(env, task),
        **(extra or {}),
    }
    if agent == "llm":
        metadata["expected_tools"] = expected_tools(env, task)
    return SessionCreate(
        user_query=task.instruction,
        session_id=session_id,
        scenario=env.name,
        tags=(env.name, task.split.value, agent),
        metadata=metadata,
    )
