"""Task environments: a small protocol (`DecisionEnv`), fault injection and a conformance checker."""

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

__all__ = [
    "DecisionEnv",
    "EnvCheckError",
    "Episode",
    "ExpertPlan",
    "ExpertStep",
    "FaultKind",
    "FaultSchedule",
    "Faults",
    "FaultySkill",
    "Outcome",
    "Split",
    "Task",
    "check_env",
    "garble_json",
    "inject_plan_faults",
    "replay",
    "run_plan",
    "with_faults",
]
