"""`/v1/sessions`: open, read, list and finish sessions."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from sessionrl.gateway.ending import FINISH_CALL
from sessionrl.orchestrator.results import FinishResult
from sessionrl.service import problems
from sessionrl.service.deps import (
    IdempotencyKey,
    IfMatch,
    Precondition,
    Reader,
    Writer,
    engine_of,
    expected_version,
    json_response,
    scoped_key,
)
from sessionrl.session.model import FeedbackType, FinalOutput, Session, SessionCreate, SessionState
from sessionrl.store import SessionQuery
from sessionrl.wire import SessionPage, SessionSummary, Timestamp

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
AUTH = (401, 403, 429)


@router.post(
    "", status_code=201, response_model=Session, responses=problems.responses(*AUTH, 400, 409, 413, 422)
)
async def create_session(
    body: SessionCreate,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Open a session. A retry with the same `Idempotency-Key` returns the same session.

    Like every answer of a write route, it is encoded here from the engine's own model (valid by
    construction), not validated again against the response model, which still documents it.
    """
    engine = engine_of(request)
    session_id = await engine.init_session(body, key=scoped_key(principal, request, idempotency_key))
    session = await engine.session(session_id)
    headers = {"Location": f"/v1/sessions/{session_id}", "ETag": f'"{session.state_version}"'}
    return json_response(session, status_code=201, headers=headers)


@router.get("/{session_id}", response_model=Session, responses=problems.responses(*AUTH, 404, 422))
async def get_session(session_id: str, request: Request, response: Response, principal: Reader) -> Session:
    """The session's current read view; its `ETag` is its state_version."""
    session = await engine_of(request).session(session_id)
    response.headers["ETag"] = f'"{session.state_version}"'
    return session


@router.get("", response_model=SessionPage, responses=problems.responses(*AUTH, 422))
async def list_sessions(
    request: Request,
    principal: Reader,
    state: SessionState | None = None,
    scenario: str | None = None,
    tag: Annotated[list[str] | None, Query(description="Sessions carrying every tag given.")] = None,
    user_id: str | None = None,
    tool_called: str | None = None,
    tool_failed: str | None = None,
    feedback_type: FeedbackType | None = None,
    created_after: Timestamp | None = None,
    created_before: Timestamp | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> SessionPage:
    """Sessions matching every filter given, oldest first."""
    query = SessionQuery(
        state=state,
        scenario=scenario,
        tags=tuple(tag or ()),
        user_id=user_id,
        tool_called=tool_called,
        tool_failed=tool_failed,
        feedback_type=feedback_type,
        created_after=created_after,
        created_before=created_before,
        limit=limit,
        offset=offset,
    )
    rows = await asyncio.to_thread(engine_of(request).store.query, query)
    items = tuple(
        SessionSummary(
            session_id=r.session_id,
            trace_id=r.trace_id,
            state=r.state,
            scenario=r.scenario,
            tags=r.tags,
            user_id=r.user_id,
            user_query=r.user_query,
            root_goal=r.root_goal,
            n_subgoals=r.n_subgoals,
            n_tool_calls=r.n_tool_calls,
            n_llm_calls=r.n_llm_calls,
            n_feedback=r.n_feedback,
            state_version=r.state_version,
            created_at=r.created_at,
            updated_at=r.updated_at,
        )
        for r in rows
    )
    return SessionPage(items=items, limit=limit, offset=offset)


@router.post(
    "/{session_id}/finish",
    response_model=FinishResult,
    responses=problems.responses(*AUTH, 400, 404, 409, 412, 413, 422),
)
async def finish_session(
    session_id: str,
    body: FinalOutput,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
    if_match: IfMatch = None,
) -> Response:
    """Give the final output and close the session; the finishing guards add their feedback. The
    session's `finished_by` metadata says `finish_call` (a gateway session may also end on the model's
    answer without a tool call, or idle). A retry with the same `Idempotency-Key` gets the first answer;
    the key with another output is a 422 `idempotency_key_reused`."""
    expected = expected_version(if_match)
    with Precondition(expected):
        result = await engine_of(request).finish(
            session_id,
            body,
            key=scoped_key(principal, request, idempotency_key),
            expected_version=expected,
            reason=FINISH_CALL,
        )
    return json_response(result)
