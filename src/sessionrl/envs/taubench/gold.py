"""The gold-plan replay of a τ-bench-style task: its gold actions as a plan, in the benchmark's order."""

from __future__ import annotations

from sessionrl.envs.base import ExpertPlan, ExpertStep, Task


def gold_plan(task: Task) -> ExpertPlan:
    """A τ-bench task's gold actions as a plan, ending with a message that says every expected output.

    As in the benchmark's replay, every action runs in its turn whether or not an earlier one failed, so
    the sub-goals depend on nothing.
    """
    actions = task.payload.get("actions")
    if actions is None:
        raise ValueError(f"task {task.task_id} has no gold actions; gold replay needs τ-bench-style tasks")
    steps = tuple(
        ExpertStep(f"g{i + 1}", f"gold action {i + 1}: {action['name']}", action["name"], action["kwargs"])
        for i, action in enumerate(actions)
    )
    outputs = task.payload.get("outputs", [])
    return ExpertPlan(
        goal=f"replay the gold actions of {task.task_id}", steps=steps, final_message=" ".join(outputs)
    )
