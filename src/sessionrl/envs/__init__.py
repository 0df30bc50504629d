"""Task environments: a small protocol (`DecisionEnv`), one registry of them (`register`, `build`), fault
injection and a conformance checker."""

from sessionrl.envs.base import DecisionEnv, Episode, ExpertPlan, ExpertStep, Outcome, Split, Task
from sessionrl.envs.check import EnvCheckError, check_env, replay, run_plan
from sessionrl.envs.faults import (
    FaultKind,
    Faults,
    FaultSchedule,
    FaultySkill,
    garble_json,
    inject_plan_faults,
    with_faults,
)
from sessionrl.envs.registry import (
    EnvBuildError,
    EnvOptionError,
    Registry,
    UnknownEnv,
    build,
    config_factory,
    env_names,
    register,
)

__all__ = [
    "DecisionEnv",
    "EnvBuildError",
    "EnvCheckError",
    "EnvOptionError",
    "Episode",
    "ExpertPlan",
    "ExpertStep",
    "FaultKind",
    "FaultSchedule",
    "Faults",
    "FaultySkill",
    "Outcome",
    "Registry",
    "Split",
    "Task",
    "UnknownEnv",
    "build",
    "check_env",
    "config_factory",
    "env_names",
    "garble_json",
    "inject_plan_faults",
    "register",
    "replay",
    "run_plan",
    "with_faults",
]
