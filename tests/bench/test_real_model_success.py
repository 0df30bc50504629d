"""bench/real_model.py pairs imitation and RL on task success over the test tasks both evaluated (exact
McNemar, worked out by hand)."""

from __future__ import annotations

import real_model


def test_success_is_paired_on_the_tasks_both_stages_evaluated() -> None:
    results = {
        "zero_shot": {"solved": {"a": False}},
        "sft": {"solved": {"a": True, "b": True, "c": False, "d": False, "e": False}},
        "rl": {"solved": {"a": True, "b": False, "c": True, "d": True, "e": True, "f": True}},
    }
    keys = real_model.success_keys("orders", results)
    # tasks a-e: b alone by imitation, c, d and e alone by RL (f is RL's only); p = 2 (1 + 4) / 2^4
    assert keys == {"orders_p_success": 0.625, "orders_sft_only": 1, "orders_rl_only": 3}


def test_no_pairing_without_both_stages_tasks() -> None:
    assert real_model.success_keys("retail", {"sft": {"solved": {"a": True}}}) == {}
    assert real_model.success_keys("retail", {"sft": {"success": 0.5}, "rl": {"success": 0.5}}) == {}
