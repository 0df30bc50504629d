"""Training runs as the dashboard reads them: the folders under the runs directory that hold a
`config.yaml` or a `metrics.jsonl` (as `sessionrl train` writes them).

A run's metrics are one JSON record per line with `stage`, `step` and `time`; the `eval` stage holds one
record per evaluated policy (`label`), the others are learning curves (`sessionrl.ui.curves`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import yaml

from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import failure_attribution
from sessionrl.eval.report import DIMENSION_KEYS, LOWER_IS_BETTER
from sessionrl.eval.significance import PairedComparison, paired_comparison
from sessionrl.session.model import Session
from sessionrl.store import SessionStore
from sessionrl.ui.curves import Metric, metrics, number

EVAL_STAGE = "eval"
STORE_FILE = "sessions.db"
EVAL_COLUMNS = ("success", "pass^1", "pass^2", "pass^3", "pass^4", *DIMENSION_KEYS, "completion", "p_value")
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,200}$"


@dataclass(frozen=True, slots=True)
class Run:
    """One run folder, read: its config, its records, stages in order of appearance (with their record
    counts), learning curves and evaluation rows; `offset` is how many bytes of metrics.jsonl were read."""

    name: str
    config_text: str
    config: dict[str, Any]
    records: list[dict[str, Any]]
    stages: dict[str, int]
    metrics: list[Metric]
    evaluations: list[dict[str, Any]]
    offset: int
    unreadable: int
    """Whole lines of metrics.jsonl that are no record (the page says how many were left out)."""


def run_names(runs_dir: Path) -> list[str]:
    """Run folders under `runs_dir`, newest first."""
    if not runs_dir.is_dir():
        return []
    found = [
        p for p in runs_dir.iterdir() if (p / "config.yaml").is_file() or (p / "metrics.jsonl").is_file()
    ]
    return [p.name for p in sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)]


class Chunk(NamedTuple):
    """Whole metrics records read from a byte offset, the offset after them, and how many whole lines were
    left out for not being a JSON record with a `stage`."""

    records: list[dict[str, Any]]
    offset: int
    unreadable: int


def records_from(folder: Path, offset: int = 0) -> Chunk:
    """The metrics records of a run from byte `offset` on (a line still being written is read next time)."""
    path = folder / "metrics.jsonl"
    if not path.is_file():
        return Chunk([], 0, 0)
    with path.open("rb") as file:
        file.seek(offset)
        data = file.read()
    whole = data[: data.rfind(b"\n") + 1]
    found, unreadable = [], 0
    for line in whole.splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            record = None
        if isinstance(record, dict) and "stage" in record:
            found.append(record)
        elif line.strip():
            unreadable += 1
    return Chunk(found, offset + len(whole), unreadable)


def records(folder: Path) -> list[dict[str, Any]]:
    """Every whole metrics record of a run (`records_from` the start)."""
    return records_from(folder).records


def read_run(runs_dir: Path, name: str) -> Run | None:
    """The run called `name`, or None when there is no such folder."""
    folder = runs_dir / name
    if name not in run_names(runs_dir):
        return None
    config_text = (folder / "config.yaml").read_text("utf-8") if (folder / "config.yaml").is_file() else ""
    config = yaml.safe_load(config_text) if config_text else {}
    found, offset, unreadable = records_from(folder)
    stages: dict[str, int] = {}
    for record in found:
        stages[str(record["stage"])] = stages.get(str(record["stage"]), 0) + 1
    evaluations = [r for r in found if r["stage"] == EVAL_STAGE]
    config = config if isinstance(config, dict) else {}
    return Run(name, config_text, config, found, stages, metrics(found), evaluations, offset, unreadable)


def failures(evaluations: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Failure attribution of each evaluated policy (by label, the latest evaluation of each): how many
    failed tasks each reason explains, most first."""
    by_label: dict[str, dict[str, int]] = {}
    for record in evaluations:
        found = record.get("failures") or {}
        counts = {str(reason): int(n) for reason, n in found.items()}
        by_label[str(record.get("label", ""))] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    return {label: counts for label, counts in by_label.items() if counts}


def thresholds(config: Mapping[str, Any], defaults: Mapping[str, float]) -> dict[str, float]:
    """The dimensions' thresholds: the run config's `evaluation.thresholds` over the dashboard's defaults."""
    section = config.get("evaluation") if isinstance(config, Mapping) else None
    own = section.get("thresholds") if isinstance(section, Mapping) else None
    merged = dict(defaults)
    if isinstance(own, Mapping):
        merged |= {str(k): float(v) for k, v in own.items() if number(v) is not None}
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
            values = {d: number(record.get(d)) for d in DIMENSION_KEYS}
            points.append(Point(at, name, str(record.get("label", "")), values))
    return sorted(points, key=lambda p: p.at)


def evaluation_charts(points: list[Point], limits: Mapping[str, float]) -> list[dict[str, Any]]:
    """One chart per dimension over time, one series per run and policy (a line joins the evaluations of
    one policy of one run, never those of different ones), and the threshold as a dashed line."""
    keys = list(dict.fromkeys((p.run, p.label) for p in points))
    times = [p.at.timestamp() for p in points]
    charts = []
    for dim in DIMENSION_KEYS:
        series: list[dict[str, Any]] = []
        for run, label in keys:
            mine = [p for p in points if (p.run, p.label) == (run, label) and p.values[dim] is not None]
            if mine:
                at = [p.at.timestamp() for p in mine]
                series.append(
                    {"label": f"{run} / {label}", "at": at, "values": [p.values[dim] for p in mine]}
                )
        if dim in limits and times:
            span = [min(times), max(times)]
            series.append({"label": "threshold", "at": span, "values": [limits[dim]] * 2, "dash": True})
        charts.append(
            {"title": dim, "metric": dim, "unit": "", "main": True, "axis": "time", "series": series}
        )
    return charts


@dataclass(frozen=True, slots=True)
class FailedTask:
    """A held-out task a policy failed in a run's evaluation, with its session and what went wrong."""

    label: str
    task_id: str
    session_id: str
    failures: dict[str, int]


def runs_with_stores(runs_dir: Path) -> list[str]:
    """The runs under `runs_dir` that keep their own session store, newest first."""
    return [name for name in run_names(runs_dir) if (runs_dir / name / STORE_FILE).is_file()]


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


def stage_sessions(store: SessionStore) -> dict[str, tuple[int, int]]:
    """A run store's sessions by the stage their metadata names: how many, and how many failed their
    task (the session list shows them at `/ui/sessions?run=NAME&stage=STAGE[&outcome=failed]`)."""
    rows = store.sql(
        "SELECT stage, COUNT(*) AS n, COALESCE(SUM(outcome = 0), 0) AS failed FROM session_facts"
        " WHERE stage IS NOT NULL GROUP BY stage ORDER BY MIN(rowid)"
    )
    return {str(r["stage"]): (int(r["n"]), int(r["failed"])) for r in rows}


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
    test: PairedComparison

    @property
    def tasks(self) -> int:
        return self.test.tasks


def outcomes(sessions: list[Session]) -> dict[str, dict[str, bool]]:
    """Each evaluated policy's outcome per task (a task judged twice counts its latest), by label."""
    solved: dict[str, dict[str, bool]] = {}
    for s in sorted(sessions, key=lambda s: s.created_at):
        outcome = task_success(s)
        if outcome is not None:
            solved.setdefault(_label(s), {})[str(s.metadata.get("task_id", s.session_id))] = outcome
    return solved


def paired(solved: dict[str, dict[str, bool]]) -> tuple[list[Paired], list[Paired]]:
    """Every pair of evaluated policies compared task by task (`outcomes` gives `solved`): the pairs with
    tasks in common, and those with none (evaluated on other tasks, as the gate is: no test is possible)."""
    tested: list[Paired] = []
    apart: list[Paired] = []
    labels = list(solved)
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            pair = Paired(a, b, paired_comparison(solved[a], solved[b]))
            (tested if pair.tasks else apart).append(pair)
    return tested, apart
