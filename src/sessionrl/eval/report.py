"""Agent metrics as rich tables: one column per policy (or epoch), one row per metric."""

from __future__ import annotations

from collections.abc import Mapping

from rich.table import Table

from sessionrl.eval.levels import NAMES, Level, LevelReport
from sessionrl.eval.metrics import AgentMetrics

ROWS: tuple[tuple[str, str], ...] = (
    ("n_sessions", "sessions"),
    ("n_tasks", "tasks"),
    ("success", "task success"),
    ("pass^1", "pass^1"),
    ("pass^2", "pass^2"),
    ("tcsr", "tool-call success (TCSR)"),
    ("dvr", "plan DAG validity (DVR)"),
    ("er5", "entity recall@5 (ER@5)"),
    ("spt", "steps per task (SPT)"),
)


def metrics_table(columns: Mapping[str, AgentMetrics], title: str = "Agent metrics") -> Table:
    """A table comparing metrics side by side, failure attribution counts at the bottom."""
    table = Table(title=title)
    table.add_column("metric")
    for name in columns:
        table.add_column(name, justify="right")
    views = [m.as_dict() for m in columns.values()]
    for key, label in ROWS:
        if any(key in v for v in views):
            table.add_row(label, *(_fmt(v.get(key)) for v in views))
    kinds = sorted({k for m in columns.values() for k in m.failures})
    for kind in kinds:
        table.add_row(f"failures: {kind}", *(str(m.failures.get(kind, 0)) for m in columns.values()))
    return table


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def levels_table(columns: Mapping[str, LevelReport], title: str = "Capability levels") -> Table:
    """One row per level: each column's value against the threshold, and pass, FAIL or `-` (unmeasured)."""
    table = Table(
        title=title,
        caption="each cell: the measured value, and pass or FAIL against the threshold (- where unmeasured); "
        "a column per label of the sessions (their stage, or `all` of them together)",
    )
    table.add_column("level", no_wrap=True)
    table.add_column("threshold", justify="right")
    for name in columns:
        table.add_column(name, justify="right", min_width=len(name))  # a cut name reads like another
    for level in Level:
        results = [report[level] for report in columns.values()]
        threshold = results[0].threshold if results else 0.0
        cells = [_level_cell(r.value, r.passed) for r in results]
        table.add_row(f"{level.value} {NAMES[level]}", _fmt(threshold), *cells)
    table.add_row("reached", "", *(r.reached.value if r.reached else "-" for r in columns.values()))
    return table


def _level_cell(value: float | None, passed: bool | None) -> str:
    verdict = "-" if passed is None else "pass" if passed else "FAIL"
    return f"{_fmt(value)} {verdict}"


DIMENSIONS: tuple[tuple[str, str], ...] = (
    ("tcsr", "tool-call success (TCSR)"),
    ("dvr", "plan DAG validity (DVR)"),
    ("er5", "entity recall@5 (ER@5)"),
    ("cu", "correction uplift (CU)"),
    ("spt", "steps per task (SPT)"),
)
"""The five evaluation dimensions, in the seed's order."""

DIMENSION_KEYS = tuple(key for key, _ in DIMENSIONS)
"""The dimensions' metric keys alone."""

LOWER_IS_BETTER = frozenset({"spt", "risk"})
"""Metrics where a rise is a regression (steps per task, the risky share); for the others a fall is."""


def dimensions_table(columns: Mapping[str, Mapping[str, float | None]], title: str = "Dimensions") -> Table:
    """The five dimensions side by side, one column per stage (or policy); `-` where unmeasured."""
    table = Table(title=title)
    table.add_column("dimension")
    for name in columns:
        table.add_column(name, justify="right")
    for key, label in DIMENSIONS:
        table.add_row(label, *(_fmt(values.get(key)) for values in columns.values()))
    return table
