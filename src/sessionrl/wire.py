"""The HTTP API's wire models: what a client sends and what the service answers, importable alone.

Requests: `SessionCreate` and `FinalOutput` (session models), the step requests with their payloads
(`PlanPayload`, `ToolPayload`, `LLMPayload`) and `FeedbackIn`. Answers: `Session`, the one `StepResult`,
`FinishResult`, `FeedbackResult`, `SessionPage`, `SkillInfo`, `Health`, and RFC 9457 problem documents
(`Problem`). The engine and the service use these same models; this module needs only pydantic and the
session models, so `sessionrl.client` loads neither the service, the engine nor the store.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from sessionrl.session.model import (
    Anchor,
    CallStatus,
    Feedback,
    FeedbackType,
    Input,
    Message,
    Plan,
    SessionState,
    ToolRequest,
    utcnow,
)


class RiskLevel(StrEnum):
    """How much harm a wrong call can do; guards and rewards weigh high-risk skills more."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class PlanRejection(StrEnum):
    """Why the plan breaker rejected a plan."""

    TOO_MANY_SUBGOALS = "too_many_subgoals"
    DUPLICATE_SUBGOAL = "duplicate_subgoal"
    REPEATED_TOOL = "repeated_tool"
    UNKNOWN_TOOL = "unknown_tool"
    FORBIDDEN_TOOL = "forbidden_tool"
    MISSING_DEPENDENCY = "missing_dependency"
    CYCLE = "cycle"


class Refusal(StrEnum):
    """Why a tool step was refused without running."""

    UNKNOWN_SUBGOAL = "UNKNOWN_SUBGOAL"
    UNMET_DEPENDENCIES = "UNMET_DEPENDENCIES"
    MASKED_SKILL = "MASKED_SKILL"


class StepKind(StrEnum):
    """The three kinds of step, each with its own lane."""

    PLAN = "plan"
    TOOL = "tool"
    LLM = "llm"


class StepError(StrEnum):
    """Error codes of failed steps that are the engine's own (tool failures carry the skill's code)."""

    UNPARSEABLE_PLAN = "UNPARSEABLE_PLAN"
    UNPARSEABLE_TOOL_CALL = "UNPARSEABLE_TOOL_CALL"
    PLAN_REJECTED = "PLAN_REJECTED"
    POLICY_ERROR = "POLICY_ERROR"


class PlanPayload(Input):
    """A plan step: give `plan` directly (an expert demonstration), or leave it out to ask the policy."""

    plan: Plan | None = Field(default=None, description="The plan to use as is; none: the policy writes one.")
    messages: tuple[Message, ...] = Field(
        default=(), description="Conversation for the policy; empty: the engine's planning prompt."
    )


class RecordedResult(Input):
    """What a tool the agent ran itself answered: record mode of a `tool` step."""

    status: Literal[CallStatus.SUCCESS, CallStatus.ERROR, CallStatus.TIMEOUT] = CallStatus.SUCCESS
    output: Any = Field(default=None, description="The tool's answer (any JSON value).")
    error_code: str | None = Field(default=None, max_length=200)
    error_message: str | None = Field(default=None, max_length=20_000)
    latency_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class ToolPayload(Input):
    """A tool step: name the skill, or leave `tool` out to let the policy choose (it answers in JSON).

    With `result`, nothing runs: the call the agent made with its own tool is recorded as it happened.
    """

    tool: str | None = Field(default=None, max_length=200, description="Skill to call; none: ask the policy.")
    params: dict[str, Any] = Field(default_factory=dict, description="Parameters for the skill.")
    subgoal_id: str | None = Field(default=None, max_length=64, description="Sub-goal this call serves.")
    messages: tuple[Message, ...] = Field(
        default=(), description="Conversation for the policy when it chooses the tool."
    )
    result: RecordedResult | None = Field(
        default=None,
        description="Record mode: what the agent's own call of `tool` answered; none: run it here.",
    )
    call_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
        description="The call's id (such as the model's tool_call_id); default: one derived here.",
    )

    @model_validator(mode="after")
    def _recorded_names_its_tool(self) -> ToolPayload:
        if self.result is not None and self.tool is None:
            raise ValueError("a recorded tool call (result given) must name its tool")
        return self


class RecordedReply(Input):
    """What a model the agent called itself answered: record mode of an `llm` step. Token ids and
    log-probabilities, when the agent has them, are what training uses instead of re-tokenising."""

    text: str = Field(default="", max_length=1_000_000)
    tool_calls: tuple[ToolRequest, ...] = ()
    model: str | None = Field(default=None, max_length=200)
    usage: dict[str, int] = Field(default_factory=dict, description="Token counts, as OpenAI's `usage`.")
    latency_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    prompt_token_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    policy_version: int | None = Field(
        default=None, ge=0, description="The version of the policy that sampled the reply, when known."
    )
    error: str | None = Field(default=None, max_length=20_000, description="The call failed, and why.")
    finished_at: Timestamp | None = Field(
        default=None, description="When the call ended, as the agent saw it; default: when it is recorded."
    )

    @model_validator(mode="after")
    def _logprobs_match_tokens(self) -> RecordedReply:
        lp, ids = self.logprobs, self.token_ids
        if lp is not None and (ids is None or len(lp) != len(ids)):
            raise ValueError("logprobs needs token_ids of the same length")
        return self


class LLMPayload(Input):
    """An LLM step: the policy answers the conversation, or (`reply`) the agent's own call is recorded."""

    messages: tuple[Message, ...] = Field(default=(), description="Conversation; empty: the user's query.")
    purpose: str = Field(default="step", min_length=1, max_length=64, description="Why the model is called.")
    reply: RecordedReply | None = Field(
        default=None, description="Record mode: what the agent's own model answered; none: ask the policy."
    )
    call_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
        description="The call's id (such as the completion's id); default: one derived here.",
    )


StepPayload = PlanPayload | ToolPayload | LLMPayload
"""A step's payload, one model per `StepKind`."""


class _Result(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepResult(_Result):
    """How one step ended. `ok` is false for failed, refused or rejected steps; each is still recorded."""

    ok: bool
    kind: StepKind
    session_id: str
    state: SessionState = Field(description="The session's state right after the step was committed.")
    state_version: int = Field(description="The session's version right after the step was committed.")
    call_id: str | None = Field(default=None, description="The tool call (tool steps) or LLM call recorded.")
    policy_call_id: str | None = Field(default=None, description="The LLM call that chose the tool, if any.")
    tool: str | None = Field(default=None, description="The skill that served the call (a fallback, maybe).")
    status: CallStatus | None = None
    output: Any = None
    text: str | None = Field(default=None, description="What the policy wrote.")
    plan: Plan | None = None
    error_code: str | None = None
    error_message: str | None = None
    retryable: bool = False
    refused: Refusal | None = Field(default=None, description="Why a tool step was refused without running.")
    rejection: PlanRejection | None = Field(
        default=None, description="Why the plan breaker rejected the plan."
    )
    latency_ms: float = 0.0
    attempts: int = 0
    warnings: tuple[str, ...] = ()
    masked: tuple[str, ...] = Field(default=(), description="Skills masked (breaker open) when answered.")


class FinishResult(_Result):
    """How a session was finished, and what the finishing guards found."""

    session_id: str
    state: SessionState
    state_version: int
    unverified_subgoals: tuple[str, ...] = Field(
        description="Sub-goals penalised: no tool call executed them."
    )
    missing_citations: tuple[str, ...] = Field(description="Cited call ids the session does not have.")


class FeedbackResult(_Result):
    """Where a piece of feedback went. `in_force` is false when later-dated feedback of the same kind won."""

    session_id: str
    feedback_id: str
    in_force: bool
    state: SessionState
    state_version: int


# requests and answers of the service's own routes

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


def _in_utc_range(value: datetime) -> datetime:
    """A time the store can hold: it is kept in UTC, and an offset can push year 1 or 9999 out of range."""
    try:
        (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:
        raise ValueError("date-time out of range once converted to UTC") from None
    return value


Timestamp = Annotated[datetime, BeforeValidator(_rfc3339), AfterValidator(_in_utc_range)]
"""A datetime given as RFC 3339 text, within the range the store can hold in UTC."""


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
    score: float | None = Field(
        default=None, allow_inf_nan=False, description="A human_rating's score is from 1 to 5."
    )
    comment: str | None = Field(default=None, max_length=20_000)
    annotator: str | None = Field(default=None, max_length=200)
    anchor: Anchor = Field(
        default_factory=Anchor,
        description="What it is about: one of call_id, subgoal_id or at; none for the whole session.",
        json_schema_extra={"maxProperties": 1},
    )
    occurred_at: Timestamp | None = Field(default=None, description="When it happened; default: now.")
    data: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _rating_in_range(self) -> FeedbackIn:
        if self.type is FeedbackType.HUMAN_RATING and self.score is not None and not 1 <= self.score <= 5:
            raise ValueError(f"a human_rating's score is from 1 to 5, got {self.score}")
        return self

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
