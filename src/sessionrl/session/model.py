"""The Decision Session: what an agent did for one request, and the feedback it earned.

Models are split by intent: `SessionCreate` and `SessionPatch` are inputs (unknown fields are rejected),
`Session` is the read view folded from a session's events (see `sessionrl.session.events`).
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 2
"""Schema version of the current read view (see `sessionrl.session.schema`)."""


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def in_utc(moment: datetime) -> datetime:
    """`moment` in UTC; one without a zone is read as UTC, as the store keeps every time.

    >>> in_utc(datetime.fromisoformat("2025-03-01T08:00:00+02:00")).isoformat()
    '2025-03-01T06:00:00+00:00'
    """
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def new_id(prefix: str) -> str:
    """A short random identifier such as `s_3f9c2a...`."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def new_trace_id() -> str:
    """A W3C trace-context trace id: 32 lowercase hex digits, not all zero."""
    return os.urandom(16).hex()


class Input(BaseModel):
    """Base of every input model: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Record(BaseModel):
    """Base of stored records: immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SessionState(StrEnum):
    """Lifecycle of a session; allowed moves live in `sessionrl.session.lifecycle`."""

    CREATED = "created"
    PLANNING = "planning"
    EXECUTING = "executing"
    FINISHED = "finished"
    REJECTED = "rejected"
    ARCHIVED = "archived"


class CallStatus(StrEnum):
    """Outcome of one tool call."""

    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    REFUSED = "refused"
    """Refused before execution by a guard (unmet dependencies, masked skill, bad parameters)."""


class FeedbackType(StrEnum):
    """Kinds of feedback a session can receive, from people, validators and guards."""

    HUMAN_RATING = "human_rating"
    COMMENT = "comment"
    AUTO_VALIDATION = "auto_validation"
    TASK_OUTCOME = "task_outcome"
    PREFERENCE = "preference"
    PLAN_REJECTION = "plan_rejection"
    HALLUCINATION_PENALTY = "hallucination_penalty"
    PROVENANCE_FLAG = "provenance_flag"
    SLA_BREACH = "sla_breach"


class SubGoal(Record):
    """One node of the plan DAG."""

    id: str = Field(min_length=1, max_length=64, description="Identifier unique within the plan.")
    description: str = Field(description="What this sub-goal achieves.")
    tool: str | None = Field(default=None, description="Skill expected to achieve it, if any.")
    depends_on: tuple[str, ...] = Field(default=(), description="Sub-goal ids that must succeed first.")


class Plan(Record):
    """A root goal and its sub-goals; edges are `depends_on`."""

    root_goal: str
    subgoals: tuple[SubGoal, ...] = ()

    def subgoal(self, subgoal_id: str) -> SubGoal | None:
        """The sub-goal with this id, or None."""
        return next((g for g in self.subgoals if g.id == subgoal_id), None)


class ToolCall(Record):
    """One executed (or refused) tool call."""

    call_id: str
    subgoal_id: str | None = None
    tool: str
    params: dict[str, Any] = Field(default_factory=dict)
    output: Any = Field(default=None, description="What the tool answered: any JSON value; None on failure.")
    status: CallStatus
    error_code: str | None = None
    error_message: str | None = None
    retryable: bool = False
    latency_ms: float = Field(default=0.0, ge=0.0)
    attempt: int = Field(default=1, ge=1, description="Attempts the executor made, retries included.")
    warnings: tuple[str, ...] = ()
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime = Field(default_factory=utcnow)
    recorded: bool = Field(default=False, description="Reported by the agent that ran it, not run here.")
    free_form: bool = Field(default=False, description="A tool no skill contract describes.")


class ToolRequest(Record):
    """A tool call a model asked for, as OpenAI-style chat APIs spell it: an id, the function's name and
    its arguments as the JSON text the model wrote (kept as text: it may not parse)."""

    id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=200)
    arguments: str = "{}"


class Message(Record):
    """One chat message given to or produced by a model. An assistant message may ask for tool calls; a
    `tool` message answers one of them by its `tool_call_id`."""

    role: str = Field(pattern=r"^(system|user|assistant|tool)$")
    content: str
    tool_calls: tuple[ToolRequest, ...] = ()
    tool_call_id: str | None = None


class CallPurpose(StrEnum):
    """Why sessionrl itself calls a model; `LLMCall.purpose` holds one of these or an agent's own word."""

    PLAN = "plan"
    """The orchestrator asks the policy for a plan."""
    STEP = "step"
    """The orchestrator asks the policy for the next step (the default of an LLM step)."""
    ACT = "act"
    """An episode's policy picks its next action (`sessionrl.episodes.llm`)."""
    CHAT = "chat"
    """An agent's chat completion recorded by the gateway or an importer."""
    FINAL = "final"
    """The final answer of a session read as a call (reward views)."""
    JUDGE = "judge"
    """A judge model refines a comment; not an action of the policy."""


ACTING: frozenset[str] = frozenset({CallPurpose.STEP, CallPurpose.ACT, CallPurpose.CHAT})
"""Purposes of the calls in which a policy chose its next action: what imitation and the tool-call head
learn from."""


class LLMCall(Record):
    """One call to a policy or other model; token ids and logprobs are present when the policy is ours."""

    call_id: str
    purpose: str = Field(default=CallPurpose.STEP, description="A `CallPurpose` or the agent's own word.")
    messages: tuple[Message, ...] = ()
    response: str = ""
    prompt_token_ids: tuple[int, ...] | None = None
    token_ids: tuple[int, ...] | None = Field(default=None, description="Ids of the generated tokens.")
    logprobs: tuple[float, ...] | None = Field(default=None, description="Log-probability of each token.")
    policy_version: int | None = None
    tokens_used: int | None = Field(
        default=None, ge=0, description="Tokens the call used; None when its server did not say."
    )
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime = Field(default_factory=utcnow)
    model: str | None = Field(default=None, description="The model's name, as its server reported it.")
    tool_calls: tuple[ToolRequest, ...] = Field(default=(), description="Tool calls the response asked for.")
    usage: dict[str, int] | None = Field(
        default=None, description="Token counts the model's server reported; None when it sent none."
    )
    latency_ms: float = Field(default=0.0, ge=0.0)
    status: CallStatus = Field(default=CallStatus.SUCCESS, description="error: the call failed (see error).")
    error_message: str | None = None
    recorded: bool = Field(default=False, description="Reported by the agent that made it, not made here.")

    @model_validator(mode="after")
    def _logprobs_match_tokens(self) -> LLMCall:
        lp, ids = self.logprobs, self.token_ids
        if lp is not None and ids is not None and len(lp) != len(ids):
            raise ValueError(f"logprobs has {len(lp)} entries but token_ids has {len(ids)}")
        return self


class Anchor(Record):
    """What a piece of feedback is about: a call, a sub-goal, a moment, or (all empty) the whole session."""

    call_id: str | None = None
    subgoal_id: str | None = None
    at: datetime | None = None

    @model_validator(mode="after")
    def _at_most_one(self) -> Anchor:
        if sum(v is not None for v in (self.call_id, self.subgoal_id, self.at)) > 1:
            raise ValueError("an anchor names at most one of call_id, subgoal_id, at")
        return self

    @property
    def key(self) -> str:
        """A stable string naming the anchor, used to resolve conflicting feedback."""
        if self.call_id is not None:
            return f"call:{self.call_id}"
        if self.subgoal_id is not None:
            return f"subgoal:{self.subgoal_id}"
        if self.at is not None:
            return f"at:{self.at.isoformat()}"
        return "session"


ANONYMOUS = "anonymous"
"""The source of feedback that names no annotator."""


class Feedback(Record):
    """One piece of feedback. `occurred_at` is when it happened, `received_at` when it reached us.

    Left out, `received_at` is now and `occurred_at` is `received_at`: one reading of the clock, so
    feedback that does not say when it happened is not late (its reward is not discounted by the
    microseconds between two readings, and a retry can tell that no time was given).
    """

    feedback_id: str = Field(default_factory=lambda: new_id("f"))
    type: FeedbackType
    score: float | None = None
    comment: str | None = None
    annotator: str | None = Field(
        default=None,
        description="Who gave it: a person's id, a validator's or a judge's name. Feedback is kept per"
        " source: a second annotator's rating stands next to the first, not in its place.",
    )
    anchor: Anchor = Field(default_factory=Anchor)
    occurred_at: datetime = Field(default_factory=utcnow)
    received_at: datetime = Field(default_factory=utcnow)
    data: dict[str, Any] = Field(default_factory=dict, description="Structured extras (reason, pair, ...).")

    @model_validator(mode="before")
    @classmethod
    def _arrival(cls, data: Any) -> Any:
        if not isinstance(data, dict) or ("occurred_at" in data and "received_at" in data):
            return data
        data = {"received_at": utcnow()} | data
        return {"occurred_at": data["received_at"]} | data

    @property
    def source(self) -> str:
        """Who gave it (`annotator`), or `ANONYMOUS` when nobody is named (all such items share it)."""
        return self.annotator if self.annotator is not None else ANONYMOUS

    @property
    def merge_key(self) -> tuple[str, str, str]:
        """(type, anchor, source): a later item with the same key replaces an earlier one; items whose keys
        differ all stay (see `sessionrl.session.events`)."""
        return (self.type.value, self.anchor.key, self.source)


class Claim(Record):
    """One statement of the final output and the calls it came from."""

    text: str
    call_ids: tuple[str, ...] = ()


class FinalOutput(Record):
    """The answer given to the user, with provenance per claim."""

    text: str
    claims: tuple[Claim, ...] = ()


class ShardVersions(Record):
    """Version of each shard: plan (written once), execution (written often), feedback (read often)."""

    plan: int = 0
    execution: int = 0
    feedback: int = 0


class SessionCreate(Input):
    """Input that opens a session."""

    user_query: str = Field(max_length=100_000)
    session_id: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    trace_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")
    scenario: str | None = Field(default=None, max_length=200)
    tags: tuple[str, ...] = ()
    user_id: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionPatch(Input):
    """Input that changes a session's descriptive fields; absent fields stay as they are."""

    scenario: str | None = None
    tags: tuple[str, ...] | None = None
    metadata: dict[str, Any] | None = None


class Session(Record):
    """Read view of a Decision Session, folded from its events."""

    schema_version: int = SCHEMA_VERSION
    session_id: str
    trace_id: str
    state: SessionState = SessionState.CREATED
    scenario: str | None = None
    tags: tuple[str, ...] = ()
    user_id: str | None = None
    user_query: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    plan: Plan | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    llm_calls: tuple[LLMCall, ...] = ()
    feedback: tuple[Feedback, ...] = ()
    final_output: FinalOutput | None = None
    versions: ShardVersions = ShardVersions()
    state_version: int = 0
    created_at: datetime
    updated_at: datetime

    def call_ids(self) -> set[str]:
        """Ids of every tool and LLM call in the session."""
        return {c.call_id for c in self.tool_calls} | {c.call_id for c in self.llm_calls}

    def tokens_reported(self) -> int:
        """Tokens of the LLM calls whose server reported them, summed (calls that did not say count 0)."""
        return sum(c.tokens_used for c in self.llm_calls if c.tokens_used is not None)

    def tool_call(self, call_id: str) -> ToolCall | None:
        """The tool call with this id, or None."""
        return next((c for c in self.tool_calls if c.call_id == call_id), None)
