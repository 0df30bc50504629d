"""`/v1/policies`: the policy registry, A/B comparison, the strategy switch and human takeover.

Reads need the `read` scope, changes the `write` scope. A stage change the registry does not allow is a
409, an unknown version a 404 (see `sessionrl.ops.registry`).
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from sessionrl.errors import InvalidEvent
from sessionrl.ops.analysis import Comparison, compare_versions
from sessionrl.ops.registry import Lineage, LogEntry, PolicyVersion, Stage
from sessionrl.ops.serving import Operations
from sessionrl.ops.strategy import StrategyMode, current_mode, set_mode
from sessionrl.ops.takeover import NEEDS_HUMAN, is_parked, resume_patch
from sessionrl.orchestrator.results import StepResult
from sessionrl.service import problems
from sessionrl.service.deps import Reader, Writer, engine_of
from sessionrl.store import SessionQuery
from sessionrl.wire import StepRequest

router = APIRouter(prefix="/v1/policies", tags=["policies"])


class Body_(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegisterIn(Body_):
    """A new version of a policy (it starts as a candidate)."""

    artifact: str = Field(min_length=1, max_length=2000, description="Where the exported policy lives.")
    kind: Literal["llm", "structured"] = "llm"
    lineage: Lineage = Field(default_factory=Lineage)
    evaluation: dict[str, Any] = Field(default_factory=dict)


class PromoteIn(Body_):
    """Move a version to canary (with its share) or production."""

    to: Literal["canary", "production"]
    share: float | None = Field(default=None, gt=0.0, le=1.0, description="A canary's share of sessions.")
    reason: str = Field(default="", max_length=2000)


class RollbackIn(Body_):
    """Why the last release is undone."""

    reason: str = Field(min_length=1, max_length=2000)


class StrategyIn(Body_):
    """The strategy mode every session follows from its next step on."""

    mode: StrategyMode
    reason: str = Field(default="", max_length=2000)


class StrategyOut(Body_):
    mode: StrategyMode


class TakeoverStep(Body_):
    """The step a person takes for a parked session: an explicit plan, tool call or recorded reply."""

    step: StepRequest
    by: str = Field(default="human", min_length=1, max_length=200, description="Who took the step.")


class Parked(Body_):
    session_id: str
    trace_id: str
    takeover: dict[str, Any]


def ops_of(request: Request) -> Operations:
    ops = request.app.state.ops
    assert isinstance(ops, Operations)
    return ops


ERRORS = problems.responses(401, 403, 404, 409, 422, 429)


@router.get("", response_model=list[PolicyVersion], responses=ERRORS)
async def list_versions(
    request: Request, principal: Reader, policy: str | None = None
) -> list[PolicyVersion]:
    """Every registered version (of one policy)."""
    return await asyncio.to_thread(ops_of(request).registry.versions, policy)


@router.post("/{policy}/versions", status_code=201, response_model=PolicyVersion, responses=ERRORS)
async def register(policy: str, body: RegisterIn, request: Request, principal: Writer) -> PolicyVersion:
    """Register the next version of `policy` as a candidate."""
    registry = ops_of(request).registry
    return await asyncio.to_thread(
        lambda: registry.register(
            policy, body.artifact, kind=body.kind, lineage=body.lineage, evaluation=body.evaluation
        )
    )


@router.get("/{policy}/versions/{version}", response_model=PolicyVersion, responses=ERRORS)
async def show(policy: str, version: int, request: Request, principal: Reader) -> PolicyVersion:
    """One version, with its lineage and evaluation."""
    return await asyncio.to_thread(ops_of(request).registry.get, policy, version)


@router.post("/{policy}/versions/{version}/promote", response_model=PolicyVersion, responses=ERRORS)
async def promote(
    policy: str, version: int, body: PromoteIn, request: Request, principal: Writer
) -> PolicyVersion:
    """Start a canary, or put a version in production (what it replaces there is retired)."""
    registry = ops_of(request).registry
    return await asyncio.to_thread(
        lambda: registry.promote(policy, version, Stage(body.to), share=body.share, reason=body.reason)
    )


@router.post("/{policy}/rollback", response_model=PolicyVersion, responses=ERRORS)
async def rollback(policy: str, body: RollbackIn, request: Request, principal: Writer) -> PolicyVersion:
    """Stop the canary, or bring back the previous production version; answers the one in production."""
    registry = ops_of(request).registry
    return await asyncio.to_thread(lambda: registry.rollback(policy, reason=body.reason))


@router.get("/{policy}/compare", response_model=Comparison, responses=ERRORS)
async def compare(
    policy: str,
    request: Request,
    principal: Reader,
    a: Annotated[int, Query(description="The baseline version.")],
    b: Annotated[int, Query(description="The version compared with it.")],
    since: datetime | None = None,
    until: datetime | None = None,
    scenario: str | None = None,
) -> Comparison:
    """A/B comparison of two versions over the sessions each served (see `sessionrl.ops.analysis`)."""
    store = ops_of(request).registry.store
    return await asyncio.to_thread(
        lambda: compare_versions(store, policy, a, b, since=since, until=until, scenario=scenario)
    )


@router.get("/log", response_model=list[LogEntry], responses=ERRORS)
async def log(
    request: Request,
    principal: Reader,
    kind: str | None = None,
    policy: str | None = None,
    after: Annotated[int, Query(ge=0)] = 0,
) -> list[LogEntry]:
    """The operations log: stage changes, canary checks, loop decisions, switches, alerts."""
    registry = ops_of(request).registry
    return await asyncio.to_thread(lambda: registry.log(kind=kind, policy=policy, after=after))


@router.get("/strategy", response_model=StrategyOut, responses=ERRORS)
async def strategy(request: Request, principal: Reader) -> StrategyOut:
    """The strategy mode in force."""
    return StrategyOut(mode=await asyncio.to_thread(current_mode, ops_of(request).registry))


@router.put("/strategy", response_model=StrategyOut, responses=ERRORS)
async def switch_strategy(body: StrategyIn, request: Request, principal: Writer) -> StrategyOut:
    """Switch every session to `mode` from its next step on (no restart)."""
    registry = ops_of(request).registry
    mode = await asyncio.to_thread(lambda: set_mode(registry, body.mode, reason=body.reason))
    return StrategyOut(mode=mode)


@router.get("/takeover", response_model=list[Parked], responses=ERRORS)
async def parked(request: Request, principal: Reader) -> list[Parked]:
    """Sessions waiting for a person."""
    store = ops_of(request).registry.store
    rows = await asyncio.to_thread(store.query, SessionQuery(tags=(NEEDS_HUMAN,), limit=1000))
    sessions = [await engine_of(request).session(r.session_id) for r in rows]
    return [
        Parked(session_id=s.session_id, trace_id=s.trace_id, takeover=dict(s.metadata.get("takeover") or {}))
        for s in sessions
    ]


@router.post(
    "/takeover/{session_id}/steps", response_model=StepResult, responses=problems.responses(404, 409, 422)
)
async def human_step(
    session_id: str, body: Annotated[TakeoverStep, Body()], request: Request, principal: Writer
) -> StepResult:
    """A person's step for a parked session: it runs as given (the policy is not asked), then the session
    is no longer parked."""
    engine = engine_of(request)
    payload = body.step.payload
    asks_policy = {"plan": "plan", "tool": "tool", "llm": "reply"}[body.step.kind]
    if getattr(payload, asks_policy) is None:
        raise InvalidEvent(
            f"step.payload.{asks_policy}", "a person's step must say it (the policy is not asked)"
        )
    session = await engine.session(session_id)
    if not is_parked(session):
        raise InvalidEvent("session_id", f"session {session_id!r} is not parked for a human")
    result = await engine.execute_step(session_id, body.step.kind, payload)
    await engine.patch(session_id, resume_patch(await engine.session(session_id), body.by))
    await asyncio.to_thread(
        ops_of(request).registry.record,
        "resumed",
        {"session_id": session_id, "trace_id": session.trace_id, "by": body.by, "kind": body.step.kind},
    )
    return result
