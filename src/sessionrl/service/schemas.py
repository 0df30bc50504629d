"""Wire models of the HTTP API that are not already session or orchestrator models.

Requests reuse `SessionCreate`, `FinalOutput` and the step payloads; responses reuse `Session`,
`StepResult`, `FinishResult` and `FeedbackResult`. Errors are RFC 9457 problem documents (`Problem`).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from sessionrl.orchestrator.results import LLMPayload, PlanPayload, ToolPayload
from sessionrl.session.model import Anchor, Feedback, FeedbackType, Input, SessionState, utcnow
from sessionrl.skills.contract import RiskLevel

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _rfc3339(value: Any) -> Any:
    """Only RFC 3339 text (what the schema promises) may become a datetime; numbers are not timestamps here.

    >>> _rfc3339("2025-03-01T08:00:00Z")
    '2025-03-01T08:00:00Z'
    """
    if isinstance(value, str) and RFC3339.match(value):
        return value
    if isinstance(value, datetime):
        return value
    raise ValueError("expected an RFC 3339 date-time such as 2025-03-01T08:00:00Z")


Timestamp = Annotated[datetime, BeforeValidator(_rfc3339)]
"""A datetime given as RFC 3339 text."""


class PlanStepRequest(Input):
    """Run a plan step."""

    kind: Literal["plan"]
    payload: PlanPayload = PlanPayload()


class ToolStepRequest(Input):
    """Run a tool step."""

    kind: Literal["tool"]
    payload: ToolPayload = ToolPayload()


class LLMStepRequest(Input):
    """Run an LLM step."""

    kind: Literal["llm"]
    payload: LLMPayload = LLMPayload()


StepRequest = Annotated[PlanStepRequest | ToolStepRequest | LLMStepRequest, Field(discriminator="kind")]


class FeedbackIn(Input):
    """Feedback as a client sends it; the service gives it an id and the time it arrived."""

    type: FeedbackType
    score: float | None = Field(default=None, allow_inf_nan=False)
    comment: str | None = Field(default=None, max_length=20_000)
    annotator: str | None = Field(default=None, max_length=200)
    anchor: Anchor = Field(
        default_factory=Anchor,
        description="What it is about: one of call_id, subgoal_id or at; none for the whole session.",
        json_schema_extra={"maxProperties": 1},
    )
    occurred_at: Timestamp | None = Field(default=None, description="When it happened; default: now.")
    data: dict[str, Any] = Field(default_factory=dict)

    def to_feedback(self) -> Feedback:
        """The stored form, received now."""
        now = utcnow()
        return Feedback(
            type=self.type,
            score=self.score,
            comment=self.comment,
            annotator=self.annotator,
            anchor=self.anchor,
            occurred_at=self.occurred_at or now,
            received_at=now,
            data=self.data,
        )


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionSummary(_Out):
    """One session in a listing (the full view is `GET /v1/sessions/{session_id}`)."""

    session_id: str
    trace_id: str
    state: SessionState
    scenario: str | None
    tags: tuple[str, ...]
    user_id: str | None
    user_query: str
    root_goal: str | None
    n_subgoals: int
    n_tool_calls: int
    n_llm_calls: int
    n_feedback: int
    state_version: int
    created_at: datetime
    updated_at: datetime


class SessionPage(_Out):
    """One page of a session listing."""

    items: tuple[SessionSummary, ...]
    limit: int
    offset: int


class SkillInfo(_Out):
    """A skill as the service offers it, with whether its breaker masks it now."""

    name: str
    description: str
    risk: RiskLevel
    masked: bool
    tool: dict[str, Any] = Field(description="The skill as an OpenAI function tool.")


class Health(_Out):
    """Liveness and a little load information."""

    status: Literal["ok"] = "ok"
    cached_sessions: int
    commits: int


class FieldProblem(_Out):
    """One invalid field of a request."""

    field: str
    rule: str


class Problem(_Out):
    """An RFC 9457 problem document."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    code: str = Field(description="Machine-readable error code, such as `invalid_transition`.")
    errors: tuple[FieldProblem, ...] | None = Field(default=None, description="Invalid fields (422 only).")
