"""Task environments: a small protocol (`DecisionEnv`), fault injection and a conformance checker."""

from sessionrl.envs.base import DecisionEnv, Episode, ExpertPlan, ExpertStep, Outcome, Split, Task
from sessionrl.envs.faults import FaultKind, Faults, FaultSchedule, garble_json, inject_plan_faults

__all__ = [
    "DecisionEnv",
    "Episode",
    "ExpertPlan",
    "ExpertStep",
    "FaultKind",
    "FaultSchedule",
    "Faults",
    "Outcome",
    "Split",
    "Task",
    "garble_json",
    "inject_plan_faults",
]
