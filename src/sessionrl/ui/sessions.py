"""The dashboard's session pages: the filtered list (with live counts by server-sent events), one session,
and one reward version term by term. Every route reads; none writes."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, nullcontext
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from sessionrl.access import Principal
from sessionrl.episodes.verdict import task_success
from sessionrl.errors import NotFound
from sessionrl.rewards.vector import RewardVector
from sessionrl.session.model import SessionState
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.ui import listing, runs, views
from sessionrl.ui.auth import LoginRequired, viewer

router = APIRouter(prefix="/ui", include_in_schema=False)
Viewer = Annotated[Principal, Depends(viewer)]
NAME = re.compile(runs.NAME_PATTERN)


def _store(request: Request) -> SessionStore:
    store = request.app.state.store
    assert isinstance(store, SessionStore)
    return store


def page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
    """Render a dashboard template with the request and the viewer's name."""
    templates = request.app.state.ui.templates
    return templates.TemplateResponse(request, name, context, status_code=status_code)  # type: ignore[no-any-return]


@router.get("/sessions")
def session_list(request: Request, who: Viewer) -> Response:
    """Sessions matching the form's filters, one page at a time, over the dashboard's store or a run's
    (`?run=NAME`); a filter that does not parse is named on the page (a 200: the browser would log a 4xx
    as an error, and the form is still the answer)."""
    params = dict(request.query_params)
    size = request.app.state.ui.config.page_size
    with _list_store(request, params.get("run", "").strip()) as store:
        if store is None:
            return page(
                request, "missing.html", {"who": who, "what": f"session store of run {params['run']}"}, 404
            )
        try:
            query, rows, total = _matching(store, params, size)
        except (ValidationError, ValueError) as exc:
            context = _list_context(params, [], 0, 1, size, who, _problem(exc))
            return page(request, "sessions.html", context)  # the form again, naming what to fix
        context = _list_context(params, rows, total, query.offset // size + 1, size, who, None)
        context["rulesets"] = listing.rulesets(store)
        context["stores"] = runs.runs_with_stores(request.app.state.ui.config.runs_dir)
        return page(request, "sessions.html", context)


def _matching(
    store: SessionStore, params: dict[str, str], size: int
) -> tuple[SessionQuery, list[listing.Listed], int]:
    """The list's query for these parameters, its page of rows and how many sessions match."""
    query = listing.list_query(params, size)
    return query, listing.listed(store, store.query(query), query.reward_ruleset), store.count(query)


def _problem(exc: ValidationError | ValueError) -> str:
    errors = exc.errors() if isinstance(exc, ValidationError) else [{"msg": str(exc), "loc": ()}]
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}".lstrip(": ") for e in errors)


@contextmanager
def _list_store(request: Request, run: str) -> Iterator[SessionStore | None]:
    """The dashboard's store, or the own store of run `run` (None when it has none)."""
    if not run:
        yield _store(request)
        return
    url = runs.run_store_url(request.app.state.ui.config.runs_dir, run) if NAME.match(run) else None
    if url is None:
        yield None
        return
    with SessionStore.open(url) as store:
        yield store


def _list_context(
    params: dict[str, str],
    rows: list[listing.Listed],
    total: int,
    page_no: int,
    size: int,
    who: Principal,
    problem: str | None,
) -> dict[str, Any]:
    run = params.get("run", "").strip()
    return {
        "who": who,
        "params": params,
        "rows": rows,
        "total": total,
        "page": page_no,
        "pages": max(1, -(-total // size)),
        "states": [s.value for s in SessionState],
        "outcomes": listing.OUTCOMES,
        "orders": listing.ORDERS,
        "rulesets": [],
        "stores": [],
        "filters": {k: v for k, v in params.items() if v.strip() and k not in ("run", "page")},
        "problem": problem,
        "nav": "sessions",
        "run": run,
        "base": f"/ui/runs/{run}/sessions" if run else "/ui/sessions",
        "keep": {k: params[k] for k in listing.LINK_KEEPS if params.get(k, "").strip()},
    }


def reader(request: Request) -> Principal:
    """A dependency of the JSON API: a read token (bearer or the dashboard's cookie), else a 401."""
    try:
        return viewer(request)
    except LoginRequired:
        raise HTTPException(401, "a token with the read scope is needed") from None


api = APIRouter(prefix="/ui/api", tags=["dashboard"])
Reader = Annotated[Principal, Depends(reader)]


@api.get("/sessions")
def session_list_data(request: Request, who: Reader) -> dict[str, Any]:
    """The session list as JSON: the list page's query parameters (`q`, `state`, `outcome`, `failed`,
    `error`, `scenario`, `stage`, `policy`, `min_reward`, `max_reward`, `reward_version`, `min_ms`,
    `max_ms`, `run`, ...: docs/dashboard.md), the number of matching sessions and one page of rows."""
    params = dict(request.query_params)
    size = request.app.state.ui.config.page_size
    with _list_store(request, params.get("run", "").strip()) as store:
        if store is None:
            raise HTTPException(404, f"no session store for run {params['run']!r}")
        try:
            _, rows, total = _matching(store, params, size)
        except (ValidationError, ValueError) as exc:
            raise HTTPException(422, _problem(exc)) from None
        return {"total": total, "rows": [listing.as_json(r) for r in rows]}


@router.get("/sessions/live")
async def live_counts(request: Request, who: Viewer, run: str = "") -> Response:
    """Server-sent events: the number of sessions in each state, sent when it changes. One stream lasts
    `live_for_s`; the browser's `EventSource` then reconnects on its own. `run`: a run's own store."""
    lasting = request.app.state.ui.config.live_for_s
    url = runs.run_store_url(request.app.state.ui.config.runs_dir, run) if run and NAME.match(run) else None
    if run and url is None:
        return Response(status_code=404)

    async def events() -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n"
        with SessionStore.open(url) if url is not None else nullcontext(_store(request)) as store:
            last: dict[str, int] | None = None
            until = time.monotonic() + lasting
            while time.monotonic() < until and not await request.is_disconnected():
                counts = await asyncio.to_thread(state_counts, store)
                if counts != last:
                    yield b"event: counts\ndata: " + orjson.dumps(counts) + b"\n\n"
                    last = counts
                await asyncio.sleep(1.0)

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def state_counts(store: SessionStore) -> dict[str, int]:
    """Sessions per state (every state present, zero when none), and `total`."""
    rows = store.sql("SELECT state, COUNT(*) AS n FROM sessions GROUP BY state")
    counts = {s.value: 0 for s in SessionState} | {str(r["state"]): int(r["n"]) for r in rows}
    return counts | {"total": sum(counts.values())}


@router.get("/sessions/{session_id}")
def session_page(request: Request, session_id: str, who: Viewer) -> Response:
    """One session of the dashboard's store."""
    return render_session(request, _store(request), session_id, who, "/ui/sessions")


@router.get("/sessions/{session_id}/rewards/{version}")
def reward_page(request: Request, session_id: str, version: int, who: Viewer) -> Response:
    """One reward version of a session of the dashboard's store."""
    return render_reward(request, _store(request), session_id, version, who, "/ui/sessions")


def render_session(
    request: Request, store: SessionStore, session_id: str, who: Principal, base: str
) -> Response:
    """A session's page: plan DAG, timeline, calls, feedback and its reward versions; `base` is the path
    its pages live under (the dashboard's store, or a run's)."""
    try:
        session = store.get(session_id)
    except NotFound:
        return page(request, "missing.html", {"who": who, "what": f"session {session_id}"}, 404)
    plan_at = next((e.at for e in store.events(session_id) if e.type == "plan_set"), None)
    context = {
        "who": who,
        "nav": "sessions",
        "base": base,
        "s": session,
        "dag": views.layout(session),
        "timeline": views.timeline(session, plan_at),
        "verdicts": views.session_verdicts(session),
        "rewards": store.rewards(session_id),
        "slas": request.app.state.ui.slas,
        "anchor": views.step_anchor,
        "judged": views.judged(session),
        "tokens": views.tokens,
        "later": views.later,
        "fit": views.fit,
        "outcome": task_success(session),
        "delay_s": views.delay_s,
        "dumps": _pretty,
        "node": (views.NODE_W, views.NODE_H),
    }
    return page(request, "session.html", context)


def render_reward(
    request: Request, store: SessionStore, session_id: str, version: int, who: Principal, base: str
) -> Response:
    """One reward version: each term's value, layer and why, with the steps it was charged to linked."""
    try:
        record = store.reward(session_id, version)
    except NotFound:
        return page(request, "missing.html", {"who": who, "what": f"reward v{version} of {session_id}"}, 404)
    vector = RewardVector.model_validate(record.vector)
    context = {"who": who, "nav": "sessions", "base": base, "record": record, "v": vector}
    return page(request, "reward.html", context | {"anchor": views.step_anchor})


def _pretty(value: Any) -> str:
    """A JSON value indented for a `<pre>` block."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2, default=str).decode()
