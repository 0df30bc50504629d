"""The dashboard's training pages: the runs under the runs folder, one run (config, stages, learning curves,
evaluation table, failure attribution) and the evaluation dimensions over time against their thresholds."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response

from sessionrl.access import Principal
from sessionrl.eval.report import DIMENSION_KEYS
from sessionrl.store import SessionStore
from sessionrl.ui import runs
from sessionrl.ui.auth import viewer
from sessionrl.ui.sessions import page, render_reward, render_session

router = APIRouter(prefix="/ui", include_in_schema=False)
Viewer = Annotated[Principal, Depends(viewer)]
RunName = Annotated[str, Path(pattern=runs.NAME_PATTERN)]


@router.get("/runs")
def run_list(request: Request, who: Viewer) -> Response:
    """Every run folder, newest first, with its stages."""
    folder = request.app.state.ui.config.runs_dir
    found = [r for name in runs.run_names(folder) if (r := runs.read_run(folder, name)) is not None]
    return page(request, "runs.html", {"who": who, "nav": "runs", "runs": found, "folder": folder})


@router.get("/runs/{name}")
def run_page(request: Request, name: RunName, who: Viewer) -> Response:
    """One run: its config, stages, a chart per stage and the table comparing its evaluated policies."""
    ui = request.app.state.ui
    run = runs.read_run(ui.config.runs_dir, name)
    if run is None:
        return page(request, "missing.html", {"who": who, "what": f"run {name}"}, 404)
    charts = [_chart(c.stage, c.xs, c.series) for c in run.curves if c.series]
    url = runs.run_store_url(ui.config.runs_dir, name)
    episodes = []
    if url is not None:
        with SessionStore.open(url) as store:
            episodes = runs.evaluation_sessions(store)
    columns = [c for c in runs.EVAL_COLUMNS if any(c in e for e in run.evaluations)]
    context = {
        "who": who,
        "nav": "runs",
        "run": run,
        "charts": charts,
        "columns": columns,
        "failures": runs.failures(run.evaluations),
        "failed": runs.failed_tasks(episodes),
        "paired": runs.paired(episodes),
    }
    return page(request, "run.html", context)


@router.get("/runs/{name}/sessions/{session_id}")
def run_session_page(request: Request, name: RunName, session_id: str, who: Viewer) -> Response:
    """A session of a run's own store (an evaluation episode, say)."""
    with _run_store(request, name) as store:
        if store is None:
            return page(request, "missing.html", {"who": who, "what": f"session store of run {name}"}, 404)
        return render_session(request, store, session_id, who, f"/ui/runs/{name}/sessions")


@router.get("/runs/{name}/sessions/{session_id}/rewards/{version}")
def run_reward_page(request: Request, name: RunName, session_id: str, version: int, who: Viewer) -> Response:
    """A reward version of a session of a run's own store."""
    with _run_store(request, name) as store:
        if store is None:
            return page(request, "missing.html", {"who": who, "what": f"session store of run {name}"}, 404)
        return render_reward(request, store, session_id, version, who, f"/ui/runs/{name}/sessions")


@contextmanager
def _run_store(request: Request, name: str) -> Iterator[SessionStore | None]:
    url = runs.run_store_url(request.app.state.ui.config.runs_dir, name)
    if url is None:
        yield None
        return
    with SessionStore.open(url) as store:
        yield store


@router.get("/evaluation")
def evaluation_page(request: Request, who: Viewer, label: str | None = None) -> Response:
    """The five dimensions of every evaluation over time (of one policy label when chosen), each against
    its threshold."""
    ui = request.app.state.ui
    points = runs.evaluation_history(ui.config.runs_dir, label)
    limits, rule = dict(ui.config.thresholds), ui.config.auto_pause_falls
    for name in dict.fromkeys(p.run for p in points):
        found = runs.read_run(ui.config.runs_dir, name)
        if found is not None:
            limits, rule = runs.thresholds(found.config, limits), runs.auto_pause_falls(found.config, rule)
    xs = [p.at.timestamp() for p in points]
    charts = [
        _chart(dim, xs, {dim: [p.values[dim] for p in points], "threshold": [limits.get(dim)] * len(points)})
        for dim in DIMENSION_KEYS
    ]
    labels = sorted({p.label for p in runs.evaluation_history(ui.config.runs_dir)})
    one_policy = len({p.label for p in points}) == 1
    fallen = {d: runs.falls([p.values[d] for p in points], d) for d in DIMENSION_KEYS} if one_policy else {}
    context = {
        "who": who,
        "nav": "evaluation",
        "points": points,
        "charts": charts,
        "limits": limits,
        "labels": labels,
        "label": label,
        "dimensions": DIMENSION_KEYS,
        "rule": rule,
        "fallen": fallen,
        "tripped": [d for d, n in fallen.items() if rule is not None and n >= rule],
    }
    return page(request, "evaluation.html", context)


def _chart(title: str, xs: list[float], series: dict[str, list[float | None]]) -> dict[str, Any]:
    """A chart's data as the page script reads it: a title, the x values and named series."""
    return {"title": title, "x": xs, "series": series}
