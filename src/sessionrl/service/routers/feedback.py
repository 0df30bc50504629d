"""`/v1/sessions/{session_id}/feedback`: late feedback, accepted in every state."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from sessionrl.orchestrator.results import FeedbackResult
from sessionrl.service import problems
from sessionrl.service.deps import IdempotencyKey, Writer, engine_of, json_response, scoped_key
from sessionrl.wire import FeedbackIn

router = APIRouter(prefix="/v1/sessions", tags=["feedback"])


@router.post(
    "/{session_id}/feedback",
    status_code=201,
    response_model=FeedbackResult,
    responses=problems.responses(400, 401, 403, 404, 409, 413, 422, 429),
)
async def add_feedback(
    session_id: str,
    body: FeedbackIn,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Record feedback. For the same type on the same anchor, the later `occurred_at` stays in force.

    Like every answer of a write route, it is encoded here from the engine's own model.
    """
    key = scoped_key(principal, request, idempotency_key)
    result = await engine_of(request).inject_feedback(session_id, body.to_feedback(), key=key)
    return json_response(result, status_code=201)
