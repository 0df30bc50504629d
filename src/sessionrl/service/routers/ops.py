"""Operations: `/healthz` (no auth, for probes) and `/metrics` (Prometheus text, read scope)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from sessionrl.service import problems
from sessionrl.service.deps import Reader, engine_of
from sessionrl.wire import Health

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz(request: Request) -> Health:
    """The service is up and its engine is open."""
    engine = engine_of(request)
    return Health(cached_sessions=len(engine.cache), commits=engine.committer.batches)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **problems.responses(401, 403, 429),
    },
)
async def metrics(request: Request, principal: Reader) -> Response:
    """Every metric of this app, in the Prometheus text format."""
    return Response(request.app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
