"""Record mode: steps the agent ran itself (its own model, its own tools), recorded as they happened.

Nothing runs here. A recorded tool call is checked against its skill's contract when a skill of that
name exists (what breaks it becomes the call's warnings: the call did happen, and a record that drops it
would lie); a tool no contract describes is accepted only where free-form tools are allowed, and marked.
`same_request` tells a retry of a request from a different request that reuses its idempotency key.
`tool_message_result` is the one rule that reads a `tool` message's content as a success or a failure,
for the gateway and the importers alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import orjson

from sessionrl.errors import InvalidEvent
from sessionrl.session.events import Event, EventBase, FeedbackAdded, OutputSet, SessionCreated
from sessionrl.session.model import (
    CallStatus,
    Feedback,
    FinalOutput,
    LLMCall,
    Message,
    Session,
    SessionCreate,
    ToolCall,
    in_utc,
    utcnow,
)
from sessionrl.skills.contract import SkillContract
from sessionrl.skills.schema import SchemaValidator, validation_errors, validator_for
from sessionrl.wire import LLMPayload, PlanPayload, RecordedResult, StepKind, StepPayload, ToolPayload

E = TypeVar("E", bound=EventBase)
FREE_FORM_KEY = "free_form_tools"
"""The session metadata key that allows free-form tools in one session."""


class ContractCheck:
    """Validators of every known skill's parameters and output, built once per skill when first used."""

    def __init__(self) -> None:
        self._validators: dict[str, tuple[SchemaValidator, SchemaValidator | None]] = {}

    def warnings(self, contract: SkillContract, params: Mapping[str, Any], result: Any) -> tuple[str, ...]:
        """How a recorded call breaks `contract`: its parameters, and a success's output when an output
        schema is declared. Each line reads `contract: field: rule`."""
        validators = self._validators.get(contract.name)
        if validators is None:
            out = validator_for(contract.output_schema) if contract.output_schema else None
            validators = self._validators[contract.name] = (validator_for(contract.input_schema), out)
        problems = validation_errors(validators[0], dict(params), root="params")
        if result is not _NO_OUTPUT and validators[1] is not None:
            problems += validation_errors(validators[1], result, root="output")
        return tuple(f"contract: {p}" for p in problems)


_NO_OUTPUT = object()


TOOL_ERROR = "TOOL_ERROR"
"""The error code of a failed tool call whose `tool` message names none (or one too long to keep)."""
MAX_CODE, MAX_MESSAGE = 200, 20_000
"""The longest error code and message a recorded tool result holds."""


def clipped(text: str, limit: int) -> str:
    """`text`, or its start with a note saying how long it was when it is longer than `limit`.

    >>> clipped("abcdef", 40), len(clipped("x" * 100, 40))
    ('abcdef', 40)
    """
    if len(text) <= limit:
        return text
    note = f"... [{len(text)} characters, cut]"
    return text[: limit - len(note)] + note


def tool_message_result(text: str, latency_ms: float = 0.0) -> RecordedResult:
    """What a `tool` message says the call answered: its content read as JSON when it is JSON, else kept
    as text, then judged by `tool_output_result`.

    >>> tool_message_result('{"error": "no product SKU-1"}', 3.0).error_message
    'no product SKU-1'
    >>> [tool_message_result(t, 3.0).status.value for t in ('{"on_hand": 4}', '{"error": null}', "fine")]
    ['success', 'success', 'success']
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return RecordedResult(output=text, latency_ms=latency_ms)
    return tool_output_result(value, latency_ms, text=text)


def tool_output_result(value: Any, latency_ms: float = 0.0, *, text: str | None = None) -> RecordedResult:
    """The one rule for a tool result's status, shared by the gateway and every importer: a JSON object
    whose `error` is a non-empty string or an object reports a failure (`{"error": "why"}`, or OpenAI's
    `{"error": {"code": ..., "message": ...}}`, either field may be missing); any other value (`{"error":
    null}` included) is the call's output. `text` is the value as it was written, the message of a
    failure that names none.

    >>> tool_output_result({"error": {"code": "SKU_NOT_FOUND"}}).error_code
    'SKU_NOT_FOUND'
    >>> tool_output_result({"error": {}}).error_message
    '{"error":{}}'
    """
    error = value.get("error") if isinstance(value, dict) else None
    if not (isinstance(error, dict) or (isinstance(error, str) and error)):
        return RecordedResult(output=value, latency_ms=latency_ms)
    fields = error if isinstance(error, dict) else {"message": error}
    code, message = fields.get("code"), fields.get("message")
    if not isinstance(message, str):
        message = text if text is not None else orjson.dumps(value).decode()
    return RecordedResult(
        status=CallStatus.ERROR,
        error_code=code if isinstance(code, str) and 0 < len(code) <= MAX_CODE else TOOL_ERROR,
        error_message=clipped(message, MAX_MESSAGE),
        latency_ms=latency_ms,
    )


def allows_free_form(session: Session, server_allows: bool) -> bool:
    """Whether `session` may record tools no contract describes (the server's setting, or its own)."""
    return server_allows or session.metadata.get(FREE_FORM_KEY) is True


def recorded_tool_call(
    session: Session,
    payload: ToolPayload,
    call_id: str,
    *,
    contracts: Mapping[str, SkillContract],
    check: ContractCheck,
    free_form: bool,
) -> ToolCall:
    """The tool call `payload` reports, checked against its contract; `InvalidEvent` for a tool no contract
    describes where free-form tools are not allowed."""
    result, tool = payload.result, payload.tool
    assert result is not None  # the payload's validator sees to both
    assert tool is not None
    contract = contracts.get(tool)
    if contract is None and not allows_free_form(session, free_form):
        raise InvalidEvent(
            "payload.tool",
            f"no skill is named {tool!r}; to record the agent's own tools, open the session with metadata "
            f'{{"{FREE_FORM_KEY}": true}}, or allow them in every session with'
            " `orchestrator: {free_form_tools: true}` in the file `sessionrl serve --config` reads",
        )
    output = result.output if result.status is CallStatus.SUCCESS else _NO_OUTPUT
    warnings = () if contract is None else check.warnings(contract, payload.params, output)
    finished = utcnow()
    return ToolCall(
        call_id=call_id,
        subgoal_id=payload.subgoal_id,
        tool=tool,
        params=payload.params,
        output=result.output if result.status is CallStatus.SUCCESS else None,
        status=result.status,
        error_code=result.error_code,
        error_message=result.error_message,
        latency_ms=result.latency_ms,
        warnings=warnings,
        started_at=_before(finished, result.latency_ms),
        finished_at=finished,
        recorded=True,
        free_form=contract is None,
    )


def recorded_llm_call(session: Session, payload: LLMPayload, call_id: str) -> LLMCall:
    """The model call `payload` reports (its messages default to the user's query, as a policy step's)."""
    reply = payload.reply
    assert reply is not None
    finished = utcnow() if reply.finished_at is None else in_utc(reply.finished_at)
    return LLMCall(
        call_id=call_id,
        purpose=payload.purpose,
        messages=payload.messages or (Message(role="user", content=session.user_query),),
        response=reply.text,
        prompt_token_ids=reply.prompt_token_ids,
        token_ids=reply.token_ids,
        logprobs=reply.logprobs,
        policy_version=reply.policy_version,
        tokens_used=reply.usage.get("total_tokens"),  # None when the server did not say
        started_at=_before(finished, reply.latency_ms),
        finished_at=finished,
        model=reply.model,
        tool_calls=reply.tool_calls,
        usage=reply.usage or None,
        latency_ms=reply.latency_ms,
        status=CallStatus.ERROR if reply.error is not None else CallStatus.SUCCESS,
        error_message=reply.error,
        recorded=True,
    )


def _before(finished: datetime, latency_ms: float) -> datetime:
    """When a call that ended at `finished` and took `latency_ms` began."""
    return finished - timedelta(milliseconds=latency_ms)


def same_request(kind: StepKind, payload: StepPayload, session: Session, call_id: str, llm_id: str) -> bool:
    """Whether `session` (right after a keyed request was first committed) shows the request `payload`
    makes now: the same kind, tool, parameters, messages and recorded answer. A retry passes; a different
    request reusing the key does not."""
    if isinstance(payload, ToolPayload) and kind is StepKind.TOOL:
        call = session.tool_call(call_id)
        if payload.tool is None:
            return call is not None or _llm(session, llm_id) is not None
        return (
            call is not None
            and call.params == payload.params
            and call.subgoal_id == payload.subgoal_id
            and (payload.result is None) != call.recorded
            and (payload.result is None or call.output == payload.result.output)
        )
    if isinstance(payload, LLMPayload) and kind is StepKind.LLM:
        llm = _llm(session, llm_id)
        if llm is None or (payload.reply is None) == llm.recorded:
            return False
        asked = payload.messages or (Message(role="user", content=session.user_query),)
        reply = payload.reply
        return llm.messages == asked and (
            reply is None or (llm.response, llm.tool_calls) == (reply.text, reply.tool_calls)
        )
    if isinstance(payload, PlanPayload) and kind is StepKind.PLAN:
        return session.plan is not None and (payload.plan is None or payload.plan == session.plan)
    return False


def _llm(session: Session, call_id: str) -> LLMCall | None:
    return next((c for c in reversed(session.llm_calls) if c.call_id == call_id), None)


def first_of(events: Sequence[Event], kind: type[E]) -> E | None:
    """The first event of `kind` among a request's logged events."""
    return next((e for e in events if isinstance(e, kind)), None)


def same_create(events: Sequence[Event], create: SessionCreate) -> bool:
    """Whether the create a key first wrote (its logged events) is `create` again."""
    first = first_of(events, SessionCreated)
    return first is not None and first.create == create


def same_feedback(events: Sequence[Event], feedback: Feedback) -> bool:
    """Whether the feedback a key first wrote is `feedback` again: the same content, with the same
    `occurred_at` when the caller gave one (one it left out is its arrival time, which a retry moves)."""
    first = first_of(events, FeedbackAdded)
    if first is None:
        return False
    arrival = {"feedback_id", "received_at", "occurred_at"}
    given = feedback.occurred_at != feedback.received_at
    return first.feedback.model_dump(exclude=arrival) == feedback.model_dump(exclude=arrival) and (
        not given or first.feedback.occurred_at == feedback.occurred_at
    )


def same_output(events: Sequence[Event], output: FinalOutput) -> bool:
    """Whether the finish a key first wrote gave `output` again."""
    first = first_of(events, OutputSet)
    return first is not None and first.output == output


def written_as_built(stored: ToolCall | LLMCall | None, built: ToolCall | LLMCall) -> bool:
    """Whether the call a recording step committed is the one it built (its times aside): the store
    ignores events whose ids it holds, so two requests under one key racing each other both "commit",
    and the one that came second finds the first one's call in its place."""
    times = {"started_at", "finished_at"}
    return stored is not None and stored.model_dump(exclude=times) == built.model_dump(exclude=times)
