"""Training runs as the dashboard reads them: the folders under the runs directory that hold a
`config.yaml` or a `metrics.jsonl` (as `sessionrl train` writes them).

A run's metrics are one JSON record per line with `stage`, `step` and `time`; the `eval` stage holds one
record per evaluated policy (`label`), the others are learning curves.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import failure_attribution
from sessionrl.eval.report import DIMENSION_KEYS, LOWER_IS_BETTER
from sessionrl.eval.significance import mcnemar_p
from sessionrl.session.model import Session
from sessionrl.store import SessionStore

EVAL_STAGE = "eval"
STORE_FILE = "sessions.db"
EVAL_COLUMNS = ("success", "pass^1", "pass^2", "pass^3", "pass^4", *DIMENSION_KEYS, "completion", "p_value")
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,200}$"


@dataclass(frozen=True, slots=True)
class Curve:
    """One stage's numeric series over its steps, ready for the chart: `xs` and one list per name."""

    stage: str
    xs: list[float]
    series: dict[str, list[float | None]]


@dataclass(frozen=True, slots=True)
class Run:
    """One run folder, read: its config text, stages in order of appearance, curves and evaluation rows."""

    name: str
    config_text: str
    config: dict[str, Any]
    stages: dict[str, int]
    curves: list[Curve]
    evaluations: list[dict[str, Any]]


def run_names(runs_dir: Path) -> list[str]:
    """Run folders under `runs_dir`, newest first."""
    if not runs_dir.is_dir():
        return []
    found = [
        p for p in runs_dir.iterdir() if (p / "config.yaml").is_file() or (p / "metrics.jsonl").is_file()
    ]
    return [p.name for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]


def records(folder: Path) -> Iterator[dict[str, Any]]:
    """The metrics records of a run, skipping lines that do not parse (a run may be writing its last)."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return
    with path.open("rb") as lines:
        for line in lines:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and "stage" in record:
                yield record


def read_run(runs_dir: Path, name: str) -> Run | None:
    """The run called `name`, or None when there is no such folder."""
    folder = runs_dir / name
    if name not in run_names(runs_dir):
        return None
    config_text = (folder / "config.yaml").read_text("utf-8") if (folder / "config.yaml").is_file() else ""
    config = yaml.safe_load(config_text) if config_text else {}
    stages: dict[str, int] = {}
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for record in records(folder):
        stage = str(record["stage"])
        stages[stage] = stages.get(stage, 0) + 1
        by_stage.setdefault(stage, []).append(record)
    curves = [curve(stage, rows) for stage, rows in by_stage.items() if stage != EVAL_STAGE]
    evaluations = by_stage.get(EVAL_STAGE, [])
    return Run(name, config_text, config if isinstance(config, dict) else {}, stages, curves, evaluations)


def curve(stage: str, rows: list[dict[str, Any]]) -> Curve:
    """The numeric fields of a stage's records as series over `step` (a missing value is a gap)."""
    names = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in ("stage", "step", "time")]
    names = [n for n in names if any(_number(r.get(n)) is not None for r in rows)]
    return Curve(
        stage,
        [float(r.get("step", i)) for i, r in enumerate(rows)],
        {n: [_number(r.get(n)) for r in rows] for n in names},
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def failures(evaluations: list[dict[str, Any]]) -> dict[str, int]:
    """Failure attribution summed over the evaluation records: how many failed tasks each reason explains."""
    total: dict[str, int] = {}
    for record in evaluations:
        for reason, n in (record.get("failures") or {}).items():
            total[str(reason)] = total.get(str(reason), 0) + int(n)
    return dict(sorted(total.items(), key=lambda kv: -kv[1]))


def thresholds(config: Mapping[str, Any], defaults: Mapping[str, float]) -> dict[str, float]:
    """The dimensions' thresholds: the run config's `evaluation.thresholds` over the dashboard's defaults."""
    section = config.get("evaluation") if isinstance(config, Mapping) else None
    own = section.get("thresholds") if isinstance(section, Mapping) else None
    merged = dict(defaults)
    if isinstance(own, Mapping):
        merged |= {str(k): float(v) for k, v in own.items() if _number(v) is not None}
    return merged


def auto_pause_falls(config: Mapping[str, Any], default: int | None) -> int | None:
    """The auto-pause rule: pause when a dimension got worse this many evaluations in a row (the run
    config's `evaluation.auto_pause_falls` over the dashboard's default; None: no rule)."""
    section = config.get("evaluation") if isinstance(config, Mapping) else None
    own = section.get("auto_pause_falls") if isinstance(section, Mapping) else None
    return int(own) if isinstance(own, int) and not isinstance(own, bool) and own > 0 else default


def falls(values: list[float | None], dimension: str) -> int:
    """How many evaluations in a row, up to the latest, each did worse on `dimension` than the one before.

    >>> falls([0.9, 0.95, 0.9, 0.8, None, 0.7], "tcsr"), falls([3.0, 4.0, 5.0], "spt"), falls([], "dvr")
    (3, 2, 0)
    """
    xs = [v for v in values if v is not None]
    n = 0
    for before, after in zip(reversed(xs[:-1]), reversed(xs[1:]), strict=True):
        if not (after > before if dimension in LOWER_IS_BETTER else after < before):
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class Point:
    """One evaluation of one policy: when, which run and label, and its dimensions."""

    at: datetime
    run: str
    label: str
    values: dict[str, float | None]


def evaluation_history(runs_dir: Path, label: str | None = None) -> list[Point]:
    """Every evaluation record of every run (of one policy label when given), oldest first."""
    points = []
    for name in run_names(runs_dir):
        for record in records(runs_dir / name):
            if record["stage"] != EVAL_STAGE or (label is not None and record.get("label") != label):
                continue
            at = datetime.fromtimestamp(float(record.get("time", 0.0)), UTC)
            values = {d: _number(record.get(d)) for d in DIMENSION_KEYS}
            points.append(Point(at, name, str(record.get("label", "")), values))
    return sorted(points, key=lambda p: p.at)


@dataclass(frozen=True, slots=True)
class FailedTask:
    """A held-out task a policy failed in a run's evaluation, with its session and what went wrong."""

    label: str
    task_id: str
    session_id: str
    failures: dict[str, int]


def run_store_url(runs_dir: Path, name: str) -> str | None:
    """The URL of a run's own session store (LLM runs keep their episodes there), or None."""
    path = runs_dir / name / STORE_FILE
    return f"sqlite:///{path}" if name in run_names(runs_dir) and path.is_file() else None


def evaluation_sessions(store: SessionStore, limit: int = 5000) -> list[Session]:
    """The evaluation episodes of a run's store (sessions `eval-…` with metadata `stage: eval`)."""
    rows = store.sql(
        "SELECT session_id FROM sessions WHERE session_id LIKE 'eval-%' ORDER BY session_id LIMIT ?", (limit,)
    )
    sessions = (store.get(str(row["session_id"])) for row in rows)
    return [s for s in sessions if s.metadata.get("stage") == EVAL_STAGE]


def failed_tasks(sessions: list[Session]) -> list[FailedTask]:
    """The evaluation sessions whose task failed, with what went wrong in each."""
    return [
        FailedTask(_label(s), str(s.metadata.get("task_id", "")), s.session_id, failure_attribution([s]))
        for s in sessions
        if task_success(s) is False
    ]


def _label(session: Session) -> str:
    return str(session.metadata.get("label", ""))


@dataclass(frozen=True, slots=True)
class Paired:
    """Two policies on the tasks both were evaluated on: how many only each solved, and the exact
    McNemar p-value of the difference (small: the policies differ on these tasks beyond chance)."""

    first: str
    second: str
    tasks: int
    first_only: int
    second_only: int
    p_value: float


def paired(sessions: list[Session]) -> list[Paired]:
    """Every pair of evaluated policies, compared task by task (a task judged twice counts its latest)."""
    solved: dict[str, dict[str, bool]] = {}
    for s in sorted(sessions, key=lambda s: s.created_at):
        outcome = task_success(s)
        if outcome is not None:
            solved.setdefault(_label(s), {})[str(s.metadata.get("task_id", s.session_id))] = outcome
    out = []
    labels = list(solved)
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            common = solved[a].keys() & solved[b].keys()
            a_only = sum(solved[a][t] and not solved[b][t] for t in common)
            b_only = sum(solved[b][t] and not solved[a][t] for t in common)
            out.append(Paired(a, b, len(common), a_only, b_only, mcnemar_p(a_only, b_only)))
    return out
