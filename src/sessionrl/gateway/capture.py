"""How a chat request through the gateway becomes steps of its session.

A request names its session; the session opens on first use (allowing the agent's own tools, which no
contract here describes), carrying the `metadata` of the request that opened it. The `tool` messages the
agent sends back (matched by `tool_call_id` to the tool calls of an earlier answer) become recorded tool
steps, once each, with the time from the answer to this request as their latency. A tool message whose
content is a JSON object with an `error` key reports a failed call (`recording.tool_message_result`, the
rule importers share); any other content is the call's output. Then the model call
itself becomes a recorded LLM step, answered or failed, whose id is the completion's id: feedback can name
it, or a tool call's id, later.

A durable commit costs a disk sync, so the tool steps (or a new session's opening) are committed while
the backend answers, and only the model call's record stands between the answer and the agent: one
sync on the reply's path per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from sessionrl.errors import InvalidTransition, NotFound
from sessionrl.gateway.backends import RETOKENISED, ChatBackend, ChatReply, UpstreamError
from sessionrl.gateway.chat import ChatMessage, ChatRequest
from sessionrl.gateway.ending import GATEWAY_TAG, finish_answered
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.recording import FREE_FORM_KEY, tool_message_result
from sessionrl.orchestrator.results import KeyReused
from sessionrl.session.model import CallStatus, Session, SessionCreate, ToolRequest, utcnow
from sessionrl.wire import LLMPayload, RecordedReply, StepKind, StepResult, ToolPayload

ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
"""What a session or call id may be (the session model's pattern)."""
MAX_QUERY = 100_000


async def open_session(
    engine: Orchestrator, session_id: str, request: ChatRequest, token_source: str = RETOKENISED
) -> Session:
    """The session `session_id`, opened first (`create_session`) when it does not exist yet."""
    with contextlib.suppress(NotFound):
        return await engine.session(session_id)
    await create_session(engine, session_id, request, token_source)
    return await engine.session(session_id)


async def record_request(
    engine: Orchestrator, session_id: str, request: ChatRequest, token_source: str = RETOKENISED
) -> None:
    """What a request brings before its answer: its tool results (`record_sent_tools`), else the
    session's opening when it is new (`open_if_new`)."""
    if any(m.role == "tool" for m in request.messages):
        await record_sent_tools(engine, session_id, request, token_source)
    else:
        await open_if_new(engine, session_id, request, token_source)


async def open_if_new(
    engine: Orchestrator, session_id: str, request: ChatRequest, token_source: str = RETOKENISED
) -> None:
    """Open `session_id` (`create_session`) unless this engine has it or the store holds it (a session
    the engine's cache holds costs no read)."""
    if not await engine.writer.exists(session_id):
        await create_session(engine, session_id, request, token_source)


async def create_session(
    engine: Orchestrator, session_id: str, request: ChatRequest, token_source: str = RETOKENISED
) -> None:
    """Open `session_id` with the request's first user message as its query and the request's metadata
    (OpenAI's string pairs) beside the gateway's own keys, `token_source` among them (where its calls'
    token ids come from: `backends.SAMPLED`, `UPSTREAM` or `RETOKENISED`); nothing when a concurrent
    request opened it."""
    query = next((m.text for m in request.messages if m.role == "user"), "") or "(no user message)"
    create = SessionCreate(
        session_id=session_id,
        user_query=query[:MAX_QUERY],
        tags=(GATEWAY_TAG,),
        metadata={
            **(request.metadata or {}),
            FREE_FORM_KEY: True,
            "captured_by": "gateway",
            "model": request.model,
            TOKEN_SOURCE: token_source,
        },
    )
    with contextlib.suppress(InvalidTransition):  # a concurrent first request opened it
        await engine.init_session(create, key=f"gateway-open {session_id}")


async def record_sent_tools(
    engine: Orchestrator, session_id: str, request: ChatRequest, token_source: str = RETOKENISED
) -> int:
    """Record the request's tool results (`record_tool_results`), opening the session when needed; a
    request carrying no `tool` message needs neither, so it reads nothing."""
    if not any(m.role == "tool" for m in request.messages):
        return 0
    session = await open_session(engine, session_id, request, token_source)
    return await record_tool_results(engine, session, request)


def answered_calls(messages: Sequence[ChatMessage], session: Session) -> dict[str, ToolRequest]:
    """Every tool call the conversation's assistant messages (or the session's answers) asked for, by id."""
    calls = {c.id: c for llm in session.llm_calls for c in llm.tool_calls}
    for message in messages:
        for call in message.tool_calls or ():
            calls[call.id] = ToolRequest(
                id=call.id, name=call.function.name, arguments=call.function.arguments
            )
    return calls


async def record_tool_results(engine: Orchestrator, session: Session, request: ChatRequest) -> int:
    """Record each `tool` message of the request not yet in the session as a tool step; return how many."""
    asked = answered_calls(request.messages, session)
    asked_at = {c.id: llm.finished_at for llm in session.llm_calls for c in llm.tool_calls}
    known = session.call_ids()
    recorded = 0
    for message in request.messages:
        call_id = message.tool_call_id
        if message.role != "tool" or call_id is None or call_id in known or call_id not in asked:
            continue
        call = asked[call_id]
        since = asked_at.get(call_id)
        latency = max((utcnow() - since).total_seconds() * 1000, 0.0) if since is not None else 0.0
        payload = ToolPayload(
            tool=call.name,
            params=_params(call.arguments),
            result=tool_message_result(message.text, latency),
            call_id=call_id if ID.match(call_id) else None,
        )
        await engine.execute_step(
            session.session_id, StepKind.TOOL, payload, key=f"gateway-tool {session.session_id} {call_id}"
        )
        known.add(call_id)
        recorded += 1
    return recorded


def _params(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as parameters (text that is not a JSON object is kept under `arguments`)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


TOKEN_SOURCE = "token_source"
"""The session metadata key saying where its calls' token ids come from."""


def token_source(backend: ChatBackend) -> str:
    """Where `backend`'s token ids come from (`RETOKENISED` for one that does not say)."""
    return str(getattr(backend, "token_source", RETOKENISED))


@dataclass(frozen=True)
class Turn:
    """What one request through the gateway came to: the completion's id, the model's answer or why
    there is none (the backend's error), and when the answer was made (Unix seconds, OpenAI's `created`:
    the recorded call's end, so a retry answered from the record is the same answer)."""

    call_id: str
    reply: ChatReply | None = None
    error: UpstreamError | None = None
    created: int = field(default_factory=lambda: int(time.time()))


async def take_turn(
    engine: Orchestrator,
    backend: ChatBackend,
    session_id: str,
    request: ChatRequest,
    call_id: str,
    *,
    key: str | None = None,
    finish_on_answer: bool = False,
) -> Turn:
    """Record the request's tool results while asking the backend, record the model call (and, with
    `finish_on_answer`, finish the session on an answer without a tool call). With a `key`, the
    completion `call_id` already in the session is a retry, answered as recorded (`replayed`)."""
    if key is not None:
        replay = await replayed(engine, session_id, request, call_id, key)
        if replay is not None:
            return replay
    source = token_source(backend)
    # the request's tool results are recorded (a new session opened) while the backend answers: those
    # durable commits are off the reply's path, and done before the call is recorded and answered
    before = asyncio.create_task(record_request(engine, session_id, request, source))
    started = time.perf_counter()
    try:
        reply, error = await ask(backend, request, session_id)
        latency_ms = (time.perf_counter() - started) * 1000
        finished = utcnow()
    finally:
        await before
    outcome = reply if reply is not None else error.message if error is not None else ""
    await record_llm(
        engine, session_id, request, call_id, outcome, latency_ms, key=key, token_source=source, at=finished
    )
    if reply is not None and finish_on_answer and not reply.tool_calls:
        await finish_answered(engine, session_id, reply.text)
    return Turn(call_id, reply, error, created=int(finished.timestamp()))


async def ask(
    backend: ChatBackend, request: ChatRequest, session_id: str
) -> tuple[ChatReply | None, UpstreamError | None]:
    """The backend's answer to `request`, or why there is none."""
    try:
        return await backend.complete(request, session_id), None
    except UpstreamError as exc:
        return None, exc


async def replayed(
    engine: Orchestrator, session_id: str, request: ChatRequest, call_id: str, key: str
) -> Turn | None:
    """The recorded answer of completion `call_id` (a keyed request's), None when the session lacks it;
    `KeyReused` when it answered other messages than `request`'s."""
    try:
        session = await engine.session(session_id)
    except NotFound:
        return None
    call = next((c for c in reversed(session.llm_calls) if c.call_id == call_id), None)
    if call is None:
        return None
    if call.messages != tuple(m.to_message() for m in request.messages):
        raise KeyReused(key, "a chat request with other messages")
    created = int(call.finished_at.timestamp())
    if call.status is not CallStatus.SUCCESS:
        error = UpstreamError(502, call.error_message or "the backend failed")
        return Turn(call_id, error=error, created=created)
    reply = ChatReply(
        text=call.response, tool_calls=call.tool_calls, model=call.model or "", usage=dict(call.usage or {})
    )
    return Turn(call_id, reply=reply, created=created)


async def record_llm(
    engine: Orchestrator,
    session_id: str,
    request: ChatRequest,
    call_id: str,
    outcome: ChatReply | str,
    latency_ms: float,
    *,
    key: str | None = None,
    error: str | None = None,
    token_source: str = RETOKENISED,
    at: datetime | None = None,
) -> StepResult:
    """Record the model call: its answer, or (a string) why it failed; an answer with an `error` is what
    had arrived of a call that failed on the way (a stream cut off). It ended `at` (default: as it is
    recorded). The session's first request opens it (`create_session`)."""
    if isinstance(outcome, str):
        reply = RecordedReply(
            model=request.model or None, latency_ms=latency_ms, error=outcome, finished_at=at
        )
    else:
        reply = RecordedReply(
            text=outcome.text,
            tool_calls=outcome.tool_calls,
            model=outcome.model or request.model or None,
            usage=outcome.usage,
            latency_ms=latency_ms,
            prompt_token_ids=outcome.prompt_token_ids,
            token_ids=outcome.token_ids,
            logprobs=outcome.logprobs,
            policy_version=outcome.policy_version,
            error=error,
            finished_at=at,
        )
    payload = LLMPayload(
        messages=tuple(m.to_message() for m in request.messages), purpose="chat", reply=reply, call_id=call_id
    )
    try:
        return await engine.execute_step(session_id, StepKind.LLM, payload, key=key)
    except NotFound:  # the session's first request: open it, then record
        await create_session(engine, session_id, request, token_source)
        return await engine.execute_step(session_id, StepKind.LLM, payload, key=key)
