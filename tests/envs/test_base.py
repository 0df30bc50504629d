"""The protocol's value types: splits, tasks, expert plans and outcomes."""

from __future__ import annotations

import dataclasses

import pytest

from sessionrl.envs import ExpertPlan, ExpertStep, Outcome, Split, Task


def test_splits_are_their_names() -> None:
    assert [split.value for split in Split] == ["train", "dev", "test"]
    assert Split("dev") is Split.DEV


def test_tasks_are_frozen_and_compare_by_identity_fields() -> None:
    task = Task("t1", Split.TRAIN, "cancel my order", {"order_id": "#W1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.task_id = "t2"  # type: ignore[misc]
    assert task == Task("t1", Split.TRAIN, "cancel my order", {"order_id": "#W2"})  # payload not compared
    assert hash(task) == hash(Task("t1", Split.TRAIN, "cancel my order"))


def test_expert_plan_lists_its_step_ids_in_order() -> None:
    steps = (ExpertStep("a", "look", "get", {}), ExpertStep("b", "act", "put", {"x": 1}, ("a",)))
    assert ExpertPlan("goal", steps, "done").step_ids == ("a", "b")


@pytest.mark.parametrize(
    ("checks", "success"),
    [
        ({"state": True, "outputs": True}, True),
        ({"state": True, "outputs": False}, False),
        ({"state": False}, False),
        ({}, False),  # nothing checked proves nothing
    ],
)
def test_outcome_succeeds_only_when_every_check_holds(checks: dict[str, bool], success: bool) -> None:
    assert Outcome(checks).success is success
