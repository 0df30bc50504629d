"""Is a difference between two policies real? Exact and resampling tests, shared by every comparison.

The demo's SFT → RL comparison, the dashboard's paired table, A/B and canary analysis and the learning bench
all ask the same questions, so they share one implementation:

- `mcnemar_p`: paired success on the same tasks (only the tasks exactly one policy solved count);
- `two_proportion_p`: success rates on different tasks (two independent samples, as in an A/B split);
- `bootstrap_ci` and `bootstrap_diff_ci`: a percentile interval for a mean, or for a difference of means,
  with a fixed seed so a report is reproducible;
- `paired_comparison`: all of the above for two task → outcome maps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A point estimate with its two-sided confidence interval."""

    estimate: float
    low: float
    high: float

    def as_list(self) -> list[float]:
        """`[low, high]`, rounded for a report line."""
        return [round(self.low, 4), round(self.high, 4)]

    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


def mcnemar_p(first_only: int, second_only: int) -> float:
    """Two-sided exact McNemar test: the chance of a split of the discordant tasks at least this uneven if
    either policy were as likely to be the one that solved each.

    >>> mcnemar_p(0, 0), mcnemar_p(3, 3), round(mcnemar_p(0, 6), 4), round(mcnemar_p(1, 9), 4)
    (1.0, 1.0, 0.0312, 0.0215)
    """
    n = first_only + second_only
    tail = sum(math.comb(n, k) for k in range(min(first_only, second_only) + 1)) / float(2**n)
    return min(1.0, 2 * tail)


def two_proportion_p(successes_a: int, n_a: int, successes_b: int, n_b: int) -> float:
    """Two-sided pooled z-test that two independent samples share one success rate (1.0 when undefined).

    >>> round(two_proportion_p(50, 100, 50, 100), 4), round(two_proportion_p(60, 100, 40, 100), 4)
    (1.0, 0.0047)
    """
    if n_a == 0 or n_b == 0:
        return 1.0
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0.0:
        return 1.0
    z = abs(successes_a / n_a - successes_b / n_b) / se
    return math.erfc(z / math.sqrt(2))


def bootstrap_ci(
    values: Sequence[float], *, confidence: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> Interval:
    """Percentile bootstrap interval for the mean of `values` (for paired data, pass per-task differences)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    return _interval(float(data.mean()), means, confidence)


def bootstrap_diff_ci(
    first: Sequence[float],
    second: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval for `mean(second) - mean(first)`, the samples resampled independently."""
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    mean_a = a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
    mean_b = b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1)
    return _interval(float(b.mean() - a.mean()), mean_b - mean_a, confidence)


def paired_ratio_diff_ci(
    first: Sequence[tuple[float, float]],
    second: Sequence[tuple[float, float]],
    *,
    confidence: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Interval:
    """Percentile bootstrap interval for the change of a pooled ratio between two policies on the same tasks.

    Each task gives one ``(numerator, denominator)`` per policy, in the same order in both (a task's
    successful tool calls and its calls, say); the ratio is ``sum(num) / sum(den)`` over the tasks, as TCSR
    pools calls. Tasks are resampled in pairs, so each draw compares the two policies on the same tasks.

    >>> paired_ratio_diff_ci([(1, 2), (1, 2)], [(2, 2), (2, 2)]).estimate
    0.5
    """
    if len(first) != len(second):
        raise ValueError(f"paired ratios need as many tasks in both: {len(first)} and {len(second)}")
    a, b = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if a.size == 0 or a[:, 1].sum() == 0 or b[:, 1].sum() == 0:
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(a), size=(resamples, len(a)))

    def pooled(pairs: np.ndarray) -> np.ndarray:
        num, den = pairs[..., 0].sum(axis=-1), pairs[..., 1].sum(axis=-1)
        ratio: np.ndarray = np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)
        return ratio

    draws = pooled(b[picks]) - pooled(a[picks])
    estimate = float(pooled(b) - pooled(a))
    return _interval(estimate, draws[~np.isnan(draws)], confidence)


def _interval(estimate: float, draws: np.ndarray, confidence: float) -> Interval:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Interval(estimate, float(low), float(high))


@dataclass(frozen=True)
class PairedComparison:
    """Two policies judged on the same tasks: how many each alone solved, and whether the gap is real."""

    tasks: int
    first_rate: float
    second_rate: float
    first_only: int
    second_only: int
    p_value: float
    delta: Interval

    def as_dict(self) -> dict[str, object]:
        return {
            "tasks": self.tasks,
            "first_rate": round(self.first_rate, 4),
            "second_rate": round(self.second_rate, 4),
            "first_only": self.first_only,
            "second_only": self.second_only,
            "p_value": round(self.p_value, 6),
            "delta": round(self.delta.estimate, 4),
            "delta_ci": self.delta.as_list(),
        }


def paired_comparison(
    first: Mapping[str, bool | float], second: Mapping[str, bool | float], *, seed: int = 0
) -> PairedComparison:
    """Compare two task → outcome maps on the tasks both have (outcomes are successes, or scores in [0, 1]).

    The p-value is McNemar's on the tasks whose outcome is a success flag; the interval is a bootstrap of the
    per-task differences `second - first`.
    """
    common = sorted(first.keys() & second.keys())
    a = [float(first[t]) for t in common]
    b = [float(second[t]) for t in common]
    first_only = sum(x >= 0.5 > y for x, y in zip(a, b, strict=True))
    second_only = sum(y >= 0.5 > x for x, y in zip(a, b, strict=True))
    n = len(common)
    return PairedComparison(
        tasks=n,
        first_rate=sum(a) / n if n else math.nan,
        second_rate=sum(b) / n if n else math.nan,
        first_only=first_only,
        second_only=second_only,
        p_value=mcnemar_p(first_only, second_only),
        delta=bootstrap_ci([y - x for x, y in zip(a, b, strict=True)], seed=seed),
    )
