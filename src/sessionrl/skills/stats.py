"""Per-skill counters and latency percentiles, for dashboards and `/metrics`."""

from __future__ import annotations

import math
from collections import Counter, deque
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.skills.breaker import BreakerState
from sessionrl.skills.skill import SkillResult

LATENCY_WINDOW: Final = 1024
"""Latency percentiles cover this many of the most recent calls."""


class SkillStats(BaseModel):
    """A snapshot of one skill's calls since the executor started."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    calls: int = Field(description="Calls this skill served or refused, fallbacks it served included.")
    failures: int = Field(description="Calls that ended in an error.")
    errors_by_code: dict[str, int] = Field(description="Failures counted per error code.")
    p50_latency_ms: float = Field(description="Median latency of the recent calls (0 before any).")
    p95_latency_ms: float = Field(description="95th-percentile latency of the recent calls (0 before any).")
    breaker: BreakerState

    @property
    def failure_rate(self) -> float:
        """Share of calls that failed (0 before any)."""
        return self.failures / self.calls if self.calls else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..100) of `values`; 0 for none.

    >>> percentile([10.0, 20.0, 30.0, 40.0], 50)
    20.0
    >>> percentile([float(v) for v in range(1, 101)], 95)
    95.0
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class StatsRecorder:
    """Mutable counters the executor feeds one `SkillResult` at a time."""

    def __init__(self) -> None:
        self.calls = 0
        self.errors: Counter[str] = Counter()
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def record(self, result: SkillResult) -> None:
        """Count one call."""
        self.calls += 1
        if result.error_code is not None:
            self.errors[result.error_code] += 1
        self.latencies.append(result.latency_ms)

    def snapshot(self, name: str, breaker: BreakerState) -> SkillStats:
        """The counters as a frozen `SkillStats`."""
        latencies = list(self.latencies)
        return SkillStats(
            name=name,
            calls=self.calls,
            failures=sum(self.errors.values()),
            errors_by_code=dict(self.errors),
            p50_latency_ms=percentile(latencies, 50),
            p95_latency_ms=percentile(latencies, 95),
            breaker=breaker,
        )
