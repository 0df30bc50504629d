"""A typed Python client of the sessionrl HTTP API, sync (`Client`) and async (`AsyncClient`).

Both mirror the routes one method each and return the service's own models. Every POST carries an
`Idempotency-Key` (a fresh one unless you pass yours), so a request that failed in transit (lost
connection, timeout, 503) is retried safely: the service answers a repeat with the first result.
Errors come back as `ApiError` holding the problem document.

```python
with Client("http://127.0.0.1:8321", token="tok1") as client:
    sid = client.create_session("Where is my order?").session_id
    client.step(sid, "tool", {"tool": "find_order", "params": {"order_id": "#W1"}})
    client.finish(sid, "It ships tomorrow.")
```

An agent that runs its own model and tools records them instead (`record_llm`, `record_tool`): nothing
runs on the service; the calls are checked and stored as they happened.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from sessionrl.errors import SessionRLError
from sessionrl.session.model import FinalOutput, Message, Session, SessionCreate
from sessionrl.wire import (
    FeedbackIn,
    FeedbackResult,
    FinishResult,
    Health,
    LLMPayload,
    Problem,
    RecordedReply,
    RecordedResult,
    SessionPage,
    SkillInfo,
    StepKind,
    StepPayload,
    StepResult,
    ToolPayload,
)

T = TypeVar("T")
RETRY_STATUSES = frozenset({502, 503, 504})
_SKILLS = TypeAdapter(list[SkillInfo])


class ApiError(SessionRLError):
    """The service answered with an error. `problem` is its RFC 9457 document when it sent one."""

    def __init__(self, status: int, problem: Problem | None, text: str) -> None:
        super().__init__(f"HTTP {status}: {problem.detail if problem and problem.detail else text[:200]}")
        self.status = status
        self.problem = problem


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how to read its answer; built once, sent by either client."""

    method: str
    path: str
    parse: Callable[[bytes], T]
    json: Any = None
    params: tuple[tuple[str, str], ...] = ()
    headers: dict[str, str] = field(default_factory=dict)


def _body(value: BaseModel | Mapping[str, Any] | None) -> Any:
    if value is None:
        return {}
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)


def _post(
    path: str, parse: Callable[[bytes], T], body: Any, key: str | None, if_match: int | None
) -> Call[T]:
    headers = {"Idempotency-Key": key or uuid.uuid4().hex}
    if if_match is not None:
        headers["If-Match"] = f'"{if_match}"'
    return Call("POST", path, parse, json=body, headers=headers)


def create_session_call(create: SessionCreate | str, key: str | None) -> Call[Session]:
    """POST /v1/sessions."""
    body = SessionCreate(user_query=create) if isinstance(create, str) else create
    return _post("/v1/sessions", Session.model_validate_json, _body(body), key, None)


def step_call(
    session_id: str,
    kind: StepKind | str,
    payload: StepPayload | Mapping[str, Any] | None,
    key: str | None,
    if_match: int | None,
) -> Call[StepResult]:
    """POST /v1/sessions/{id}/steps."""
    body = {"kind": StepKind(kind).value, "payload": _body(payload)}
    return _post(f"/v1/sessions/{session_id}/steps", StepResult.model_validate_json, body, key, if_match)


def record_llm_call(
    session_id: str,
    messages: Sequence[Message | Mapping[str, Any]],
    reply: RecordedReply | Mapping[str, Any],
    call_id: str | None,
    key: str | None,
) -> Call[StepResult]:
    """POST /v1/sessions/{id}/steps with an `llm` step in record mode."""
    payload = LLMPayload.model_validate(
        {"messages": [_body(m) for m in messages], "reply": _body(reply), "call_id": call_id}
    )
    return step_call(session_id, StepKind.LLM, payload, key, None)


def record_tool_call(
    session_id: str,
    tool: str,
    params: Mapping[str, Any],
    result: RecordedResult | Mapping[str, Any],
    call_id: str | None,
    key: str | None,
) -> Call[StepResult]:
    """POST /v1/sessions/{id}/steps with a `tool` step in record mode."""
    payload = ToolPayload.model_validate(
        {"tool": tool, "params": dict(params), "result": _body(result), "call_id": call_id}
    )
    return step_call(session_id, StepKind.TOOL, payload, key, None)


def feedback_call(session_id: str, feedback: FeedbackIn, key: str | None) -> Call[FeedbackResult]:
    """POST /v1/sessions/{id}/feedback."""
    path = f"/v1/sessions/{session_id}/feedback"
    return _post(path, FeedbackResult.model_validate_json, _body(feedback), key, None)


def finish_call(
    session_id: str, output: FinalOutput | str, key: str | None, if_match: int | None
) -> Call[FinishResult]:
    """POST /v1/sessions/{id}/finish."""
    body = FinalOutput(text=output) if isinstance(output, str) else output
    path = f"/v1/sessions/{session_id}/finish"
    return _post(path, FinishResult.model_validate_json, _body(body), key, if_match)


def get_session_call(session_id: str) -> Call[Session]:
    """GET /v1/sessions/{id}."""
    return Call("GET", f"/v1/sessions/{session_id}", Session.model_validate_json)


def list_sessions_call(filters: Mapping[str, Any]) -> Call[SessionPage]:
    """GET /v1/sessions with filters (`tag` may be a list); None values are left out."""
    params: list[tuple[str, str]] = []
    for name, value in filters.items():
        values = value if isinstance(value, list | tuple) else [value]
        params += [
            (name, v.isoformat() if hasattr(v, "isoformat") else str(v)) for v in values if v is not None
        ]
    return Call("GET", "/v1/sessions", SessionPage.model_validate_json, params=tuple(params))


def skills_call() -> Call[list[SkillInfo]]:
    """GET /v1/skills."""
    return Call("GET", "/v1/skills", _SKILLS.validate_json)


def health_call() -> Call[Health]:
    """GET /healthz."""
    return Call("GET", "/healthz", Health.model_validate_json)


def _read(call: Call[T], response: httpx.Response) -> T:
    if response.is_success:
        return call.parse(response.content)
    try:
        problem = Problem.model_validate_json(response.content)
    except ValidationError:
        problem = None
    raise ApiError(response.status_code, problem, response.text)


def _backoff(attempt: int) -> float:
    return min(2.0, 0.05 * 2.0**attempt)


@dataclass(frozen=True, slots=True)
class _Retry:
    """Send the same request again after `delay` seconds."""

    delay: float


def _settle(
    call: Call[T], outcome: httpx.Response | httpx.TransportError, attempt: int, retries: int
) -> T | _Retry:
    """What attempt number `attempt` (from 0) came to: the parsed answer, a retry, or the error raised.

    A transport failure or a 502/503/504 is retried while attempts are left; the last one's failure is
    raised as it came (the transport error, or `ApiError` for the status).
    """
    failed = isinstance(outcome, httpx.TransportError) or outcome.status_code in RETRY_STATUSES
    if failed and attempt < retries:
        return _Retry(_backoff(attempt))
    if isinstance(outcome, httpx.TransportError):
        raise outcome
    return _read(call, outcome)


def _request(http: httpx.Client | httpx.AsyncClient, call: Call[Any]) -> httpx.Request:
    """The call as a request of this connection pool (its base URL and auth header), sent as is on retries."""
    return http.build_request(
        call.method, call.path, json=call.json, params=call.params, headers=call.headers
    )


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class Client:
    """Synchronous client. `retries` is how many times a request failed in transit is sent again."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url, headers=_auth(token), timeout=timeout, transport=transport
        )
        self._retries = retries

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def send(self, call: Call[T]) -> T:
        """Send a prepared call, retrying transport failures and 502/503/504 with the same key."""
        request = _request(self._http, call)
        for attempt in range(self._retries + 1):
            answer = _settle(call, self._attempt(request), attempt, self._retries)
            if not isinstance(answer, _Retry):
                return answer
            time.sleep(answer.delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _attempt(self, request: httpx.Request) -> httpx.Response | httpx.TransportError:
        try:
            return self._http.send(request)
        except httpx.TransportError as exc:
            return exc

    def create_session(self, create: SessionCreate | str, *, idempotency_key: str | None = None) -> Session:
        """Open a session (a `SessionCreate`, or just the user's query)."""
        return self.send(create_session_call(create, idempotency_key))

    def step(
        self,
        session_id: str,
        kind: StepKind | str,
        payload: StepPayload | Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        if_match: int | None = None,
    ) -> StepResult:
        """Run one plan, tool or LLM step."""
        return self.send(step_call(session_id, kind, payload, idempotency_key, if_match))

    def record_llm(
        self,
        session_id: str,
        messages: Sequence[Message | Mapping[str, Any]],
        reply: RecordedReply | Mapping[str, Any],
        *,
        call_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> StepResult:
        """Record a call the agent made to its own model (text, tool calls, usage, tokens)."""
        return self.send(record_llm_call(session_id, messages, reply, call_id, idempotency_key))

    def record_tool(
        self,
        session_id: str,
        tool: str,
        params: Mapping[str, Any],
        result: RecordedResult | Mapping[str, Any],
        *,
        call_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> StepResult:
        """Record a call the agent made to its own tool (output or error, status, latency)."""
        return self.send(record_tool_call(session_id, tool, params, result, call_id, idempotency_key))

    def feedback(
        self, session_id: str, feedback: FeedbackIn, *, idempotency_key: str | None = None
    ) -> FeedbackResult:
        """Record feedback for a session."""
        return self.send(feedback_call(session_id, feedback, idempotency_key))

    def finish(
        self,
        session_id: str,
        output: FinalOutput | str,
        *,
        idempotency_key: str | None = None,
        if_match: int | None = None,
    ) -> FinishResult:
        """Give the final output and close the session."""
        return self.send(finish_call(session_id, output, idempotency_key, if_match))

    def get_session(self, session_id: str) -> Session:
        """The session's current read view."""
        return self.send(get_session_call(session_id))

    def list_sessions(self, **filters: Any) -> SessionPage:
        """Sessions matching the filters of `GET /v1/sessions` (state, scenario, tag, limit, ...)."""
        return self.send(list_sessions_call(filters))

    def skills(self) -> list[SkillInfo]:
        """The skills the service can call."""
        return self.send(skills_call())

    def health(self) -> Health:
        """Liveness."""
        return self.send(health_call())


class AsyncClient:
    """Asynchronous client with the same methods as `Client`, awaited."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
        limits: httpx.Limits | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers=_auth(token),
            timeout=timeout,
            transport=transport,
            limits=limits or httpx.Limits(max_connections=256, max_keepalive_connections=256),
        )
        self._retries = retries

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        """Send a prepared call, retrying transport failures and 502/503/504 with the same key."""
        request = _request(self._http, call)
        for attempt in range(self._retries + 1):
            answer = _settle(call, await self._attempt(request), attempt, self._retries)
            if not isinstance(answer, _Retry):
                return answer
            await asyncio.sleep(answer.delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _attempt(self, request: httpx.Request) -> httpx.Response | httpx.TransportError:
        try:
            return await self._http.send(request)
        except httpx.TransportError as exc:
            return exc

    async def create_session(
        self, create: SessionCreate | str, *, idempotency_key: str | None = None
    ) -> Session:
        """Open a session (a `SessionCreate`, or just the user's query)."""
        return await self.send(create_session_call(create, idempotency_key))

    async def step(
        self,
        session_id: str,
        kind: StepKind | str,
        payload: StepPayload | Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        if_match: int | None = None,
    ) -> StepResult:
        """Run one plan, tool or LLM step."""
        return await self.send(step_call(session_id, kind, payload, idempotency_key, if_match))

    async def record_llm(
        self,
        session_id: str,
        messages: Sequence[Message | Mapping[str, Any]],
        reply: RecordedReply | Mapping[str, Any],
        *,
        call_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> StepResult:
        """Record a call the agent made to its own model (text, tool calls, usage, tokens)."""
        return await self.send(record_llm_call(session_id, messages, reply, call_id, idempotency_key))

    async def record_tool(
        self,
        session_id: str,
        tool: str,
        params: Mapping[str, Any],
        result: RecordedResult | Mapping[str, Any],
        *,
        call_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> StepResult:
        """Record a call the agent made to its own tool (output or error, status, latency)."""
        return await self.send(record_tool_call(session_id, tool, params, result, call_id, idempotency_key))

    async def feedback(
        self, session_id: str, feedback: FeedbackIn, *, idempotency_key: str | None = None
    ) -> FeedbackResult:
        """Record feedback for a session."""
        return await self.send(feedback_call(session_id, feedback, idempotency_key))

    async def finish(
        self,
        session_id: str,
        output: FinalOutput | str,
        *,
        idempotency_key: str | None = None,
        if_match: int | None = None,
    ) -> FinishResult:
        """Give the final output and close the session."""
        return await self.send(finish_call(session_id, output, idempotency_key, if_match))

    async def get_session(self, session_id: str) -> Session:
        """The session's current read view."""
        return await self.send(get_session_call(session_id))

    async def list_sessions(self, **filters: Any) -> SessionPage:
        """Sessions matching the filters of `GET /v1/sessions` (state, scenario, tag, limit, ...)."""
        return await self.send(list_sessions_call(filters))

    async def skills(self) -> list[SkillInfo]:
        """The skills the service can call."""
        return await self.send(skills_call())

    async def health(self) -> Health:
        """Liveness."""
        return await self.send(health_call())
