"""The benches' tool accuracy keys from per-task counts, worked out by hand (bench/learning.py pools seeds,
bench/real_model.py reports each stage and the paired change from imitation to RL), and the learning
bench's column of the rounds its dev tasks judged."""

from __future__ import annotations

import learning
import real_model


def test_learning_pools_every_seed_and_task_pair() -> None:
    rows = [
        {"seed": 0, "tool_counts": {"t1": [[1, 2], [2, 2]], "t2": [[0, 2], [1, 2]]}},
        {"seed": 1, "tool_counts": {"t1": [[2, 4], [2, 4]]}},
        {"seed": 2},  # a row from before tool accuracy was measured
    ]
    pooled = learning.pooled_tool_accuracy(rows)
    assert pooled["tool_acc_sft"] == 3 / 8
    assert pooled["tool_acc_rl"] == 5 / 8
    assert pooled["tool_acc_seeds"] == 2
    low, high = pooled["tool_acc_ci"]
    assert low <= 0.25 <= high
    assert learning.pooled_tool_accuracy([{"seed": 0}]) == {}


def test_the_learning_table_marks_what_the_dev_tasks_undid() -> None:
    row = {"rft_dev": [[30, 28, False], [30, 33, True]], "rl_dev": [[33, 31, False]]}
    assert learning.dev_judged(row, "rft_dev") == "30 x28 33"
    assert learning.dev_judged(row, "rl_dev") == "33 x31"
    assert learning.dev_judged({"rft_dev": []}, "rft_dev") == "-"
    assert learning.dev_judged({}, "rl_dev") == "-"  # a row from before GRPO was judged


def test_real_model_reports_each_stage_and_the_change_on_common_tasks() -> None:
    results = {
        "zero_shot": {"tool_acc": 0.0},
        "sft": {"tool_acc": 0.25, "tool_counts": {"a": [1, 4], "b": [0, 2]}},
        "rl": {"tool_acc": 0.5, "tool_counts": {"a": [3, 4], "c": [1, 1]}},
    }
    keys = real_model.tool_keys("retail", results)
    assert keys["retail_tool_acc_zero_shot"] == 0.0
    assert keys["retail_tool_acc_sft"] == 0.25
    assert keys["retail_tool_acc_rl"] == 0.5
    assert keys["retail_tool_acc_ci"] == [0.5, 0.5]  # task a alone: 1/4 -> 3/4
