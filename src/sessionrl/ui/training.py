"""The dashboard's training pages: the runs under the runs folder (with their status), one run (status,
config, a chart per metric, evaluation table, paired tests, failure attribution by policy) following the
run live, runs compared side by side, and the evaluation dimensions over time against their thresholds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from sessionrl.access import Principal
from sessionrl.eval.report import DIMENSION_KEYS
from sessionrl.store import SessionStore
from sessionrl.ui import compare, curves, live, runs
from sessionrl.ui.auth import viewer
from sessionrl.ui.sessions import page, render_reward, render_session

router = APIRouter(prefix="/ui", include_in_schema=False)
Viewer = Annotated[Principal, Depends(viewer)]
RunName = Annotated[str, Path(pattern=runs.NAME_PATTERN)]
MAX_COMPARED = 8
"""Most runs the compare page reads at once."""


@router.get("/runs")
def run_list(request: Request, who: Viewer) -> Response:
    """Every run folder, newest first, with its status, start, duration, ETA and headline metric; tick
    two or more to compare them."""
    folder = request.app.state.ui.config.runs_dir
    found = [r for name in runs.run_names(folder) if (r := runs.read_run(folder, name)) is not None]
    now = time.time()
    rows = [(r, live.summary(folder / r.name, r.config, r.records, now)) for r in found]
    context = {"who": who, "nav": "runs", "rows": rows, "folder": folder, "utc": live.utc}
    return page(request, "runs.html", context)


@router.get("/live/runs")
async def runs_live(request: Request, who: Viewer) -> StreamingResponse:
    """Server-sent events of the runs list: every run's status line when one changes (`live.list_events`)."""
    ui = request.app.state.ui
    events = live.list_events(ui.config.runs_dir, ui.config.live_for_s, request.is_disconnected)
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


@router.get("/compare")
def compare_page(request: Request, who: Viewer, run: Annotated[list[str] | None, Query()] = None) -> Response:
    """Two or more runs side by side (at most `MAX_COMPARED`): overlaid curves, evaluation tables, paired
    tests, config diff."""
    folder = request.app.state.ui.config.runs_dir
    known = runs.run_names(folder)
    asked = list(dict.fromkeys(run or []))
    found = [n for n in asked if n in known]
    names, left_out = found[:MAX_COMPARED], found[MAX_COMPARED:]
    unknown = [n for n in asked if n not in known]
    compared = compare.compare(folder, names) if len(names) >= 2 else None
    context = {"who": who, "nav": "runs", "names": names, "known": known, "unknown": unknown}
    context |= {"left_out": left_out, "most": MAX_COMPARED, "c": compared}
    return page(request, "compare.html", context)


@router.get("/runs/{name}")
def run_page(request: Request, name: RunName, who: Viewer) -> Response:
    """One run: its status, config, a chart per stage and metric, and the evaluated policies compared."""
    ui = request.app.state.ui
    run = runs.read_run(ui.config.runs_dir, name)
    if run is None:
        return page(request, "missing.html", {"who": who, "what": f"run {name}"}, 404)
    url = runs.run_store_url(ui.config.runs_dir, name)
    episodes, by_stage = [], {}
    if url is not None:
        with SessionStore.open(url) as store:
            episodes = runs.evaluation_sessions(store)
            by_stage = runs.stage_sessions(store)
    tested, apart = runs.paired(runs.outcomes(episodes))
    failures = runs.failures(run.evaluations)
    context = {
        "who": who,
        "nav": "runs",
        "run": run,
        "summary": live.summary(ui.config.runs_dir / name, run.config, run.records, time.time()),
        "utc": live.utc,
        "start": curves.first_time(run.records),
        "by_stage": by_stage,
        "charts": [(curves.chart(m, run.name), curves.latest(m)) for m in run.metrics],
        "one_off": curves.one_off(run.records),
        "columns": [c for c in runs.EVAL_COLUMNS if any(c in e for e in run.evaluations)],
        "failures": failures,
        "failures_most": max((n for counts in failures.values() for n in counts.values()), default=1),
        "failed": runs.failed_tasks(episodes),
        "paired": tested,
        "apart": apart,
    }
    return page(request, "run.html", context)


@router.get("/runs/{name}/live")
async def run_live(request: Request, name: RunName, who: Viewer, after: int = 0) -> Response:
    """Server-sent events of a run: its new metrics records and its status line (`live.run_events`);
    a reconnecting browser resumes after the `Last-Event-ID` it was sent."""
    ui = request.app.state.ui
    run = runs.read_run(ui.config.runs_dir, name)
    if run is None:
        return Response(status_code=404)
    resumed = request.headers.get("last-event-id", "")
    offset = int(resumed) if resumed.isdigit() else max(0, after)
    events = live.run_events(
        ui.config.runs_dir / name, run.config, offset, ui.config.live_for_s, request.is_disconnected
    )
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


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
    charts = runs.evaluation_charts(points, limits)
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
