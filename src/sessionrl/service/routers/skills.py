"""`/v1/skills`: the skills the engine can call, and which are masked now."""

from __future__ import annotations

from fastapi import APIRouter, Request

from sessionrl.service import problems
from sessionrl.service.deps import Reader, engine_of
from sessionrl.wire import SkillInfo

router = APIRouter(prefix="/v1/skills", tags=["skills"])


@router.get("", response_model=list[SkillInfo], responses=problems.responses(401, 403, 429))
async def list_skills(request: Request, principal: Reader) -> list[SkillInfo]:
    """Every skill, sorted by name; `masked` skills are refused until their breaker closes."""
    engine = engine_of(request)
    masked = engine.executor.masked()
    return [
        SkillInfo(
            name=name,
            description=c.description,
            risk=c.risk,
            masked=name in masked,
            tool=c.to_openai_tool(),
        )
        for name, c in sorted(engine.executor.contracts.items())
    ]
