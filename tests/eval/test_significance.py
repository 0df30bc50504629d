"""The shared significance tests, on cases small enough to work out by hand."""

from __future__ import annotations

import math

import pytest

from sessionrl.eval.significance import (
    bootstrap_ci,
    bootstrap_diff_ci,
    mcnemar_p,
    paired_comparison,
    paired_ratio_diff_ci,
    two_proportion_p,
)


def test_mcnemar_is_the_binomial_tail_of_the_discordant_split() -> None:
    # 1 vs 4 discordant: P(X <= 1) for Binomial(5, 1/2) = 6/32, doubled
    assert mcnemar_p(1, 4) == pytest.approx(12 / 32)
    assert mcnemar_p(4, 1) == mcnemar_p(1, 4)
    assert mcnemar_p(0, 0) == 1.0


def test_two_proportion_matches_the_normal_tail() -> None:
    # 30/50 against 20/50: pooled 0.5, se = sqrt(0.25 * 0.04) = 0.1, z = 2
    assert two_proportion_p(30, 50, 20, 50) == pytest.approx(math.erfc(2 / math.sqrt(2)))
    assert two_proportion_p(0, 0, 3, 10) == 1.0
    assert two_proportion_p(10, 10, 10, 10) == 1.0


def test_bootstrap_interval_holds_the_mean_and_is_reproducible() -> None:
    values = [0.0, 1.0] * 50
    interval = bootstrap_ci(values, seed=3)
    assert interval.estimate == 0.5
    assert interval.low < 0.5 < interval.high
    assert interval.high - interval.low < 0.3
    assert bootstrap_ci(values, seed=3) == interval
    assert math.isnan(bootstrap_ci([]).estimate)


def test_a_constant_shift_gives_an_interval_that_excludes_zero() -> None:
    interval = bootstrap_diff_ci([0.1, 0.2, 0.3] * 10, [0.6, 0.7, 0.8] * 10)
    assert interval.estimate == pytest.approx(0.5)
    assert interval.excludes_zero()
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0], confidence=1.5)


def test_paired_comparison_counts_only_shared_tasks() -> None:
    before = {"t1": False, "t2": False, "t3": True, "t4": True, "only_before": True}
    after = {"t1": True, "t2": True, "t3": True, "t4": False, "only_after": False}
    result = paired_comparison(before, after)
    assert (result.tasks, result.first_only, result.second_only) == (4, 1, 2)
    assert result.first_rate == 0.5
    assert result.second_rate == 0.75
    assert result.delta.estimate == pytest.approx(0.25)
    assert result.p_value == mcnemar_p(1, 2)
    assert result.as_dict()["delta_ci"] == result.delta.as_list()


def test_paired_ratio_interval_pools_calls_and_resamples_tasks_in_pairs() -> None:
    # TCSR pooled over calls: 4/9 -> 7/9 (the mean of per-task rates would be 0.333 -> 0.667)
    before = [(1, 4), (3, 4), (0, 1)]
    after = [(3, 4), (4, 4), (0, 1)]
    interval = paired_ratio_diff_ci(before, after, seed=3)
    assert interval.estimate == pytest.approx(7 / 9 - 4 / 9)
    assert interval.low <= interval.estimate <= interval.high
    assert interval == paired_ratio_diff_ci(before, after, seed=3)
    with pytest.raises(ValueError, match="as many tasks"):
        paired_ratio_diff_ci(before, after[:2])
