"""Learning curves as the dashboard draws them: one small chart per stage and metric, each with its own axis.

A run's metrics records become `Metric`s (one numeric field of one stage over its steps, with the
seconds since the run's first record for the wall-time axis). Loss, success, reward and KL are the main
metrics, shown by default; the rest (token counts, timings, counters) are drawn behind a toggle. Charts
of several runs overlay one series per run (`overlay`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

INDEX_FIELDS = frozenset({"stage", "step", "time", "iteration", "policy_version", "label", "of"})
"""Fields of a record that say where it is, not what was measured."""
MAIN = re.compile(r"^(loss|.*_loss|success|.*success.*|reward|.*reward.*|kl|.*_kl|kl_.*)$")
"""Metrics shown by default: losses, success, rewards and KL."""
CURVE_STAGES_SKIP = frozenset({"eval"})
"""Stages that are tables, not curves (one record per evaluated policy)."""


@dataclass(frozen=True, slots=True)
class Metric:
    """One numeric field of one stage: its values over the stage's steps (a missing value is left out)
    and the seconds since the run started at each."""

    stage: str
    name: str
    steps: list[float]
    elapsed: list[float]
    values: list[float]

    @property
    def main(self) -> bool:
        """Whether the chart is shown by default (timings and token counts never are)."""
        return not self.unit and MAIN.match(self.name) is not None

    @property
    def unit(self) -> str:
        """The unit of the values, for the chart's title ('' when they have none)."""
        if self.name.endswith("_s") or self.name == "seconds":
            return "s"
        return "tokens" if "tokens" in self.name else ""


def number(value: Any) -> float | None:
    """A finite int or float as a float; None for anything else (bools, text, NaN)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def metrics(records: Sequence[Mapping[str, Any]], started: float | None = None) -> list[Metric]:
    """Every curve of a run's records, in order of appearance: stage by stage, field by field. A field
    with fewer than two values draws no line and is left out; a step logged twice keeps its last value."""
    start = started if started is not None else first_time(records)
    by_key: dict[tuple[str, str], dict[float, tuple[float, float]]] = {}
    for i, record in enumerate(records):
        stage = str(record.get("stage", ""))
        if stage in CURVE_STAGES_SKIP:
            continue
        step = number(record.get("step"))
        at = number(record.get("time"))
        for name, value in record.items():
            y = number(value)
            if name in INDEX_FIELDS or y is None:
                continue
            points = by_key.setdefault((stage, name), {})
            points[step if step is not None else float(i)] = ((at or start) - start, y)
    out = []
    for (stage, name), points in by_key.items():
        if len(points) < 2:
            continue
        steps = sorted(points)
        out.append(Metric(stage, name, steps, [points[s][0] for s in steps], [points[s][1] for s in steps]))
    return out


def first_time(records: Iterable[Mapping[str, Any]]) -> float:
    """The time of a run's first record (its curves' wall-time axis counts from it); 0 without one."""
    return min((t for r in records if (t := number(r.get("time"))) is not None), default=0.0)


def chart(metric: Metric, label: str) -> dict[str, Any]:
    """One metric as the page script reads it (`runs.js`): title, unit, and one named series."""
    return overlay([(label, metric)])


def overlay(named: Sequence[tuple[str, Metric]]) -> dict[str, Any]:
    """One chart of the same stage and metric from several runs, one series per run."""
    first = named[0][1]
    return {
        "stage": first.stage,
        "metric": first.name,
        "title": f"{first.stage} · {first.name}",
        "unit": first.unit,
        "main": first.main,
        "series": [
            {"label": label, "step": m.steps, "elapsed": m.elapsed, "values": m.values} for label, m in named
        ],
    }


def overlays(runs: Mapping[str, Sequence[Metric]]) -> list[dict[str, Any]]:
    """The charts comparing runs: one per stage and metric any of them logged, each run a series."""
    keys: dict[tuple[str, str], list[tuple[str, Metric]]] = {}
    for run, found in runs.items():
        for m in found:
            keys.setdefault((m.stage, m.name), []).append((run, m))
    return [overlay(named) for named in keys.values()]


def latest(metric: Metric) -> dict[str, float]:
    """The last step and value of a metric, and its lowest and highest values (the table under a chart)."""
    return {
        "step": metric.steps[-1],
        "value": metric.values[-1],
        "min": min(metric.values),
        "max": max(metric.values),
    }


def one_off(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records of stages logged once (demonstrations read, pairs built, a collapse): no curve to draw,
    so the page lists them."""
    counts: dict[str, int] = {}
    for record in records:
        counts[str(record.get("stage", ""))] = counts.get(str(record.get("stage", "")), 0) + 1
    return [
        dict(record)
        for record in records
        if counts[str(record.get("stage", ""))] == 1 and record.get("stage") not in CURVE_STAGES_SKIP
    ]
