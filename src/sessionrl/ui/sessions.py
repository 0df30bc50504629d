"""The dashboard's session pages: the filtered list (with live counts by server-sent events), one session,
and one reward version term by term. Every route reads; none writes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from sessionrl.access import Principal
from sessionrl.errors import NotFound
from sessionrl.rewards.vector import RewardVector
from sessionrl.session.model import FeedbackType, SessionState
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.ui import views
from sessionrl.ui.auth import viewer

router = APIRouter(prefix="/ui", include_in_schema=False)
Viewer = Annotated[Principal, Depends(viewer)]
ORDERS = ("created_at", "updated_at", "session_id")


def _store(request: Request) -> SessionStore:
    store = request.app.state.store
    assert isinstance(store, SessionStore)
    return store


def page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
    """Render a dashboard template with the request and the viewer's name."""
    templates = request.app.state.ui.templates
    return templates.TemplateResponse(request, name, context, status_code=status_code)  # type: ignore[no-any-return]


def list_query(params: dict[str, str], page_size: int) -> SessionQuery:
    """The typed query the list's form asks (empty fields are unset); `ValidationError` when one is bad.

    A rating bound filters on human ratings; a comment filter matches any feedback's comment.
    """
    given = {k: v.strip() for k, v in params.items() if v.strip()}
    rating = "min_rating" in given or "max_rating" in given
    page_no = max(1, int(given.get("page", "1"))) if given.get("page", "1").isdigit() else 1
    return SessionQuery.model_validate(
        {
            "state": given.get("state"),
            "scenario": given.get("scenario"),
            "tool_called": given.get("tool"),
            "tool_share": given.get("tool_share"),
            "feedback_type": FeedbackType.HUMAN_RATING if rating else None,
            "min_score": given.get("min_rating"),
            "max_score": given.get("max_rating"),
            "comment_contains": given.get("comment"),
            "order_by": given.get("order", "created_at"),
            "descending": given.get("desc", "1") == "1",
            "limit": page_size,
            "offset": (page_no - 1) * page_size,
        }
    )


@router.get("/sessions")
def session_list(request: Request, who: Viewer) -> Response:
    """Sessions matching the form's filters, one page at a time; a filter that does not parse is named on
    the page (a 200: the browser would log a 4xx as an error, and the form is still the answer)."""
    params = dict(request.query_params)
    size = request.app.state.ui.config.page_size
    try:
        query = list_query(params, size)
    except (ValidationError, ValueError) as exc:
        errors = exc.errors() if isinstance(exc, ValidationError) else [{"msg": str(exc), "loc": ()}]
        problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}".lstrip(": ") for e in errors)
        context = _list_context(params, [], 0, 1, size, who, problem)
        return page(request, "sessions.html", context)  # the form again, naming what to fix
    store = _store(request)
    rows = store.query(query)
    total = store.count(query)
    context = _list_context(params, rows, total, query.offset // size + 1, size, who, None)
    return page(request, "sessions.html", context)


def _list_context(
    params: dict[str, str],
    rows: list[Any],
    total: int,
    page_no: int,
    size: int,
    who: Principal,
    problem: str | None,
) -> dict[str, Any]:
    return {
        "who": who,
        "params": params,
        "rows": rows,
        "total": total,
        "page": page_no,
        "pages": max(1, -(-total // size)),
        "states": [s.value for s in SessionState],
        "orders": ORDERS,
        "problem": problem,
        "nav": "sessions",
    }


@router.get("/sessions/live")
async def live_counts(request: Request, who: Viewer) -> StreamingResponse:
    """Server-sent events: the number of sessions in each state, sent when it changes. One stream lasts
    `live_for_s`; the browser's `EventSource` then reconnects on its own."""
    store = _store(request)
    lasting = request.app.state.ui.config.live_for_s

    async def events() -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n"
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
