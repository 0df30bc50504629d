"""`/v1/policies`: the policy registry, A/B comparison, the strategy switch and human takeover.

Reads need the `read` scope, changes the `write` scope. A stage change the registry does not allow is a
409, an unknown version a 404 (see `sessionrl.ops.registry`).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from sessionrl.errors import InvalidTransition
from sessionrl.ops.analysis import Comparison, compare_versions
from sessionrl.ops.registry import POLICY_NAME, Lineage, LogEntry, PolicyVersion, Stage
from sessionrl.ops.serving import Operations
from sessionrl.ops.strategy import StrategyMode, current_mode, set_mode
from sessionrl.ops.takeover import NEEDS_HUMAN, is_parked, resume_patch
from sessionrl.orchestrator.results import StepResult
from sessionrl.service import problems
from sessionrl.service.deps import IdempotencyKey, Reader, Writer, engine_of, scoped_key
from sessionrl.session.model import Plan
from sessionrl.store import SessionQuery
from sessionrl.wire import PlanPayload, Timestamp, ToolPayload

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
    share: float | None = Field(
        default=None, gt=0.0, le=1.0, description="A canary's share of sessions; default: the config's."
    )
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


class HumanPlan(Body_):
    """A person gives the session its plan."""

    kind: Literal["plan"]
    plan: Plan


class HumanTool(Body_):
    """A person names the next tool call; the service runs it."""

    kind: Literal["tool"]
    tool: str = Field(min_length=1, max_length=200)
    params: dict[str, Any] = Field(default_factory=dict)
    subgoal_id: str | None = Field(default=None, max_length=64)


class TakeoverStep(Body_):
    """The step a person takes for a parked session (the policy is not asked)."""

    step: Annotated[HumanPlan | HumanTool, Field(discriminator="kind")]
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
WRITE_ERRORS = problems.responses(400, 401, 403, 404, 409, 413, 422, 429)
MAX_VERSION = 1 << 31
PolicyName = Annotated[str, Path(pattern=POLICY_NAME.pattern, description="The policy's name.")]
VersionNumber = Annotated[int, Path(ge=1, lt=MAX_VERSION, description="A version of the policy.")]


@router.get("", response_model=list[PolicyVersion], responses=ERRORS)
async def list_versions(
    request: Request, principal: Reader, policy: str | None = None
) -> list[PolicyVersion]:
    """Every registered version (of one policy)."""
    return await asyncio.to_thread(ops_of(request).registry.versions, policy)


@router.post("/{policy}/versions", status_code=201, response_model=PolicyVersion, responses=WRITE_ERRORS)
async def register(
    policy: PolicyName,
    body: RegisterIn,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> PolicyVersion:
    """Register the next version of `policy` as a candidate."""
    registry, key = ops_of(request).registry, scoped_key(principal, request, idempotency_key)
    return await asyncio.to_thread(
        lambda: registry.register(
            policy, body.artifact, kind=body.kind, lineage=body.lineage, evaluation=body.evaluation, key=key
        )
    )


@router.get("/{policy}/versions/{version}", response_model=PolicyVersion, responses=ERRORS)
async def show(
    policy: PolicyName, version: VersionNumber, request: Request, principal: Reader
) -> PolicyVersion:
    """One version, with its lineage and evaluation."""
    return await asyncio.to_thread(ops_of(request).registry.get, policy, version)


@router.post("/{policy}/versions/{version}/promote", response_model=PolicyVersion, responses=WRITE_ERRORS)
async def promote(
    policy: PolicyName,
    version: VersionNumber,
    body: PromoteIn,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> PolicyVersion:
    """Start a canary (on `share`, by default the config's), or put a version in production (what it
    replaces there is retired)."""
    ops, key = ops_of(request), scoped_key(principal, request, idempotency_key)
    share = (body.share or ops.config.canary.share) if body.to == "canary" else None
    return await asyncio.to_thread(
        lambda: ops.registry.promote(
            policy, version, Stage(body.to), share=share, reason=body.reason, key=key
        )
    )


@router.post("/{policy}/rollback", response_model=PolicyVersion, responses=WRITE_ERRORS)
async def rollback(
    policy: PolicyName,
    body: RollbackIn,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> PolicyVersion:
    """Stop the canary, or bring back the previous production version; answers the one in production."""
    registry, key = ops_of(request).registry, scoped_key(principal, request, idempotency_key)
    return await asyncio.to_thread(lambda: registry.rollback(policy, reason=body.reason, key=key))


@router.get("/{policy}/compare", response_model=Comparison, responses=ERRORS)
async def compare(
    policy: PolicyName,
    request: Request,
    principal: Reader,
    a: Annotated[int, Query(ge=1, lt=MAX_VERSION, description="The baseline version.")],
    b: Annotated[int, Query(ge=1, lt=MAX_VERSION, description="The version compared with it.")],
    since: Timestamp | None = None,
    until: Timestamp | None = None,
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
    after: Annotated[int, Query(ge=0, lt=1 << 62)] = 0,
) -> list[LogEntry]:
    """The operations log: stage changes, canary checks, loop decisions, switches, alerts."""
    registry = ops_of(request).registry
    return await asyncio.to_thread(lambda: registry.log(kind=kind, policy=policy, after=after))


@router.get("/strategy", response_model=StrategyOut, responses=ERRORS)
async def strategy(request: Request, principal: Reader) -> StrategyOut:
    """The strategy mode in force."""
    return StrategyOut(mode=await asyncio.to_thread(current_mode, ops_of(request).registry))


@router.put("/strategy", response_model=StrategyOut, responses=WRITE_ERRORS)
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
    "/takeover/{session_id}/steps",
    response_model=StepResult,
    responses=WRITE_ERRORS,
)
async def human_step(
    session_id: str,
    body: Annotated[TakeoverStep, Body()],
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> StepResult:
    """A person's step for a parked session: it runs as given (the policy is not asked), then the session
    is no longer parked. A session that is not parked is a 409."""
    engine = engine_of(request)
    session = await engine.session(session_id)
    if not is_parked(session):
        raise InvalidTransition(session_id, session.state, "takeover step (the session is not parked)")
    step = body.step
    payload: PlanPayload | ToolPayload = (
        PlanPayload(plan=step.plan)
        if isinstance(step, HumanPlan)
        else ToolPayload(tool=step.tool, params=step.params, subgoal_id=step.subgoal_id)
    )
    key = scoped_key(principal, request, idempotency_key)
    result = await engine.execute_step(session_id, step.kind, payload, key=key)
    await engine.patch(session_id, resume_patch(await engine.session(session_id), body.by))
    await asyncio.to_thread(
        ops_of(request).registry.record,
        "resumed",
        {"session_id": session_id, "trace_id": session.trace_id, "by": body.by, "kind": step.kind},
    )
    return result
