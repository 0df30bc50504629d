"""`/v1/sessions/{session_id}/steps`: run one plan, tool or LLM step."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Request, Response

from sessionrl.orchestrator.results import StepResult
from sessionrl.service import problems
from sessionrl.service.deps import (
    IdempotencyKey,
    IfMatch,
    Precondition,
    Writer,
    engine_of,
    expected_version,
    json_response,
    scoped_key,
)
from sessionrl.wire import StepRequest

router = APIRouter(prefix="/v1/sessions", tags=["steps"])


@router.post(
    "/{session_id}/steps",
    response_model=StepResult,
    responses=problems.responses(400, 401, 403, 404, 409, 412, 413, 422, 429, 503),
)
async def run_step(
    session_id: str,
    body: Annotated[StepRequest, Body()],
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
    if_match: IfMatch = None,
) -> Response:
    """Run one step. A failed, refused or rejected step is still a 200: it was recorded (`ok` is false).

    The answer is encoded here from the engine's own `StepResult`, which is valid by construction, so the
    framework does not validate it again against the response model (that model still documents it).
    """
    expected = expected_version(if_match)
    with Precondition(expected):
        result = await engine_of(request).execute_step(
            session_id,
            body.kind,
            body.payload,
            key=scoped_key(principal, request, idempotency_key),
            expected_version=expected,
        )
    request.app.state.metrics.count_step(result.kind.value, outcome(result))
    return json_response(result)


def outcome(result: StepResult) -> str:
    """A coarse label for metrics: ok, refused, rejected or failed."""
    if result.ok:
        return "ok"
    if result.refused is not None:
        return "refused"
    return "rejected" if result.rejection is not None else "failed"
