"""Which splits an environment has tasks in, and the error that names them when a caller asks for another.

A benchmark domain may ship only some splits (τ-bench's airline ships only test tasks), so every caller that
needs tasks of one split asks through `tasks_of`, whose error says which splits exist and what to do.
"""

from __future__ import annotations

from collections.abc import Sequence

from sessionrl.envs.base import DecisionEnv, Split, Task
from sessionrl.envs.registry import EnvBuildError


class NoTasks(EnvBuildError, LookupError):
    """An environment has no task in the split asked for; the message names the splits it has."""


def task_counts(env: DecisionEnv) -> dict[Split, int]:
    """The number of tasks in each split that has any, in split order."""
    counts = {split: len(env.tasks(split)) for split in Split}
    return {split: n for split, n in counts.items() if n}


def describe_splits(env: DecisionEnv) -> str:
    """`2 test`, `3 train, 1 dev`, or `none` for an environment without tasks."""
    return ", ".join(f"{n} {split}" for split, n in task_counts(env).items()) or "none"


def tasks_of(env: DecisionEnv, split: Split, how: str) -> Sequence[Task]:
    """The tasks of `split`; raises `NoTasks` naming the splits `env` has, then `how` (what to do)."""
    tasks = env.tasks(split)
    if not tasks:
        raise NoTasks(f"{env.name} has no {split} tasks (its tasks: {describe_splits(env)}); {how}")
    return tasks


TRAIN_SPLIT_NEEDED = (
    "training learns from train tasks (the expert's demonstrations, then practice on them): give the "
    "environment a train split (a τ-bench-style domain reads it from tasks_train.json in its data folder) "
    "and keep the other splits for evaluation"
)
"""What `tasks_of` says when a run is asked to train on an environment without train tasks."""
