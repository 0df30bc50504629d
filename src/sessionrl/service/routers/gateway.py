"""The OpenAI-compatible gateway: `POST .../v1/chat/completions` and `GET .../v1/models`.

An agent names its session in its base URL (`/gateway/sessions/{session_id}/v1`) or, at `/v1`, in an
`X-Session-Id` header; its API key is a sessionrl token. Each request is recorded in its session (see
`sessionrl.gateway.capture`) and answered by the app's chat backend, as JSON or, with `stream: true`, as
server-sent events. Every error these routes meet (a body that does not parse or validate, a missing
session, a token refused, a named sessionrl error, a failed upstream) is answered as an OpenAI error
(`{"error": {"message", "type", "param", "code"}}`), which OpenAI clients read; `OpenAIRoute` turns the
framework's own errors into that shape.

These routes are not among `ROUTERS`: the app includes them after the others. The service's shortcut
serves their well-formed requests as it serves the session API's writes, and leaves the others to the
framework.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Path, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from sessionrl.access import Principal
from sessionrl.errors import InvalidTransition, NotFound, SessionRLError
from sessionrl.gateway.backends import ChatBackend, UpstreamError
from sessionrl.gateway.capture import ID, Turn, record_llm, record_sent_tools, replayed, take_turn
from sessionrl.gateway.chat import (
    ChatRequest,
    completion,
    error_body,
    error_type,
    models_page,
    request_problem,
    stream_events,
)
from sessionrl.gateway.config import GatewayConfig
from sessionrl.gateway.streaming import relay
from sessionrl.gateway.upstream import UpstreamChat
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.results import StepIds
from sessionrl.service import problems
from sessionrl.service.deps import (
    IdempotencyKey,
    JSONAnswer,
    Reader,
    Writer,
    engine_of,
    scoped_key,
)
from sessionrl.service.problems import ProblemError, malformed_json
from sessionrl.session.lifecycle import ACTIVE

SESSION_HEADER = "X-Session-Id"
NO_SESSION = (
    "name the session to record in: use the base URL /gateway/sessions/{session_id}/v1, "
    f"or send an {SESSION_HEADER} header to /v1"
)


class OpenAIRoute(APIRoute):
    """A route whose errors (validation, authentication, rate limits, named errors) are answered as
    OpenAI errors rather than problem documents, since its callers are OpenAI clients; the service's
    shortcut, which serves these routes too, asks `error_response` as the framework's handler does."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                response = self.error_response(exc)
                if response is None:
                    raise
                return response

        return answer

    def error_response(self, exc: Exception) -> Response | None:
        """`exc` as an OpenAI error; None for an error that is not the caller's to read (a server fault)."""
        if isinstance(exc, RequestValidationError):
            return invalid_request(exc)
        if isinstance(exc, ProblemError):
            return openai_error(exc.status, exc.detail, error_type(exc.status), exc.code, exc.headers)
        if isinstance(exc, SessionRLError):
            return named_error(exc)
        if isinstance(exc, HTTPException):  # such as a body that is not UTF-8
            code = problems.HTTP_CODES.get(exc.status_code, "http_error")
            return openai_error(exc.status_code, str(exc.detail), error_type(exc.status_code), code)
        return None


router = APIRouter(tags=["gateway"], route_class=OpenAIRoute)

SessionHeader = Annotated[
    str,
    Header(
        alias=SESSION_HEADER,
        pattern=ID.pattern,
        description="The session to record in (opened on first use), when the base URL does not name one.",
    ),
]
SessionId = Annotated[str, Path(pattern=ID.pattern, description="The session (opened on first use).")]

OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "string"},
            },
        }
    },
}


def answers(*openai_statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries of a gateway route: the answer (JSON, or server-sent events) and OpenAI-style
    errors, those the body limit answers before any route (413) among them."""
    documented: dict[int | str, dict[str, Any]] = {}
    for status in (400, 401, 403, 413, 422, 429, *openai_statuses):
        content = {"application/json": {"schema": OPENAI_ERROR}}
        documented[status] = {"description": problems.TITLES.get(status, "Error"), "content": content}
    ok = {
        "application/json": {"schema": {"type": "object"}},
        "text/event-stream": {"schema": {}},
    }
    return {200: {"description": "The completion", "content": ok}, **documented}


CHAT_ANSWERS = answers(404, 409, 500, 502, 503, 504)


@router.post(
    "/gateway/sessions/{session_id}/v1/chat/completions",
    summary="Chat completion in a session",
    response_class=Response,
    responses=CHAT_ANSWERS,
)
async def chat_in_session(
    session_id: SessionId,
    body: ChatRequest,
    request: Request,
    principal: Writer,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """An OpenAI chat completion, recorded in the session the base URL names. Each `tool` message
    answering an earlier tool call becomes a tool step: a failed one when its content is a JSON object whose
    `error` is a string or `{"code", "message"}`, else a successful one with the content as its output."""
    return await chat(request, session_id, body, principal, idempotency_key)


@router.post(
    "/v1/chat/completions",
    summary="Chat completion in the header's session",
    response_class=Response,
    responses=CHAT_ANSWERS,
)
async def chat_by_header(
    body: ChatRequest,
    request: Request,
    principal: Writer,
    session_id: SessionHeader,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """An OpenAI chat completion, recorded in the session of the `X-Session-Id` header (or name the
    session in the base URL: `/gateway/sessions/{session_id}/v1`); its `tool` messages are recorded as
    there."""
    return await chat(request, session_id, body, principal, idempotency_key)


MODELS_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"description": "The models", "content": {"application/json": {"schema": {"type": "object"}}}}
}


@router.get(
    "/gateway/sessions/{session_id}/v1/models",
    summary="Models, in a session's base URL",
    response_class=Response,
    responses={**MODELS_ANSWERS, **answers()},
)
async def models_in_session(session_id: SessionId, request: Request, principal: Reader) -> Response:
    """The models the gateway serves."""
    return await served_models(request)


@router.get(
    "/v1/models",
    summary="Models the gateway serves",
    response_class=Response,
    responses={**MODELS_ANSWERS, **answers()},
)
async def models(request: Request, principal: Reader) -> Response:
    """The models the gateway serves."""
    return await served_models(request)


async def served_models(request: Request) -> Response:
    """The chat backend's models as a `GET /models` answer."""
    backend: ChatBackend | None = request.app.state.chat
    names = await backend.models() if backend is not None else []
    return JSONAnswer(orjson.dumps(models_page(names)))


async def chat(
    request: Request, session_id: str, body: ChatRequest, principal: Principal, key: str | None
) -> Response:
    """Check the request as OpenAI would, then take the turn (`capture.take_turn`: record the request's
    tool results, ask the backend, record the model call) and answer the agent. With an
    `Idempotency-Key`, a retry is answered as first recorded, and the same key with other messages is a
    422 `idempotency_key_reused`; nothing is written for either."""
    if not ID.match(session_id):
        return openai_error(400, f"not a session id: {session_id[:40]!r}", "invalid_request_error", "bad_id")
    refusal = request_problem(body)
    if refusal is not None:
        return openai_error(
            400, refusal.message, "invalid_request_error", "invalid_request", param=refusal.param
        )
    backend: ChatBackend | None = request.app.state.chat
    if backend is None:
        return openai_error(503, "this service has no chat backend", "server_error", "no_backend")
    engine = engine_of(request)
    scoped = scoped_key(principal, request, key)
    scoped = None if scoped is None else f"{scoped} {session_id}"  # /v1 names the session in a header
    call_id = f"chatcmpl-{uuid.uuid4().hex[:24] if scoped is None else StepIds.of(scoped).base}"
    settings: GatewayConfig = request.app.state.config.gateway
    if body.stream and isinstance(backend, UpstreamChat):
        return await stream_chat(engine, backend, session_id, body, call_id, scoped, settings)
    try:
        turn = await engine.writer.once(
            None if scoped is None else f"turn {scoped} {digest(body)}",  # its step runs under `scoped`
            lambda: take_turn(
                engine,
                backend,
                session_id,
                body,
                call_id,
                key=scoped,
                finish_on_answer=settings.finish_on_answer,
            ),
        )
    except SessionRLError as exc:
        return named_error(exc)
    return answer_turn(turn, body)


def digest(body: ChatRequest) -> str:
    """A digest of a request: concurrent retries of one keyed request share one turn, while another
    request under the same key runs on its own, to be refused (`idempotency_key_reused`) as it records.
    Pydantic writes the JSON, as it reads it: a field passed on with an integer past 64 bits digests too."""
    return hashlib.blake2b(body.model_dump_json().encode(), digest_size=12).hexdigest()


def answer_turn(turn: Turn, body: ChatRequest) -> Response:
    """A turn as the agent reads it: the completion (JSON, or replayed as server-sent events), or the
    backend's failure as an OpenAI error."""
    if turn.reply is None:
        error = turn.error or UpstreamError(502, "the backend gave no answer")
        return openai_error(agent_status(error.status), error.message, "upstream_error", "upstream_failed")
    reply = turn.reply
    model = reply.model or body.model
    answer = completion(turn.call_id, model, reply.text, reply.tool_calls, reply.usage, turn.created)
    if body.stream:
        events = stream_events(answer, include_usage=body.include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    return JSONAnswer(orjson.dumps(answer))


async def stream_chat(
    engine: Orchestrator,
    backend: UpstreamChat,
    session_id: str,
    body: ChatRequest,
    call_id: str,
    key: str | None,
    settings: GatewayConfig,
) -> Response:
    """A streamed request to an upstream: its events pass on as they arrive (`streaming.relay`), and the
    call is recorded when the stream ends. A keyed retry is answered from the record; an upstream that
    refuses to start is an OpenAI error, recorded as a failed call."""
    try:
        if key is not None:
            replay = await replayed(engine, session_id, body, call_id, key)
            if replay is not None:
                return answer_turn(replay, body)
        source = backend.token_source
        await record_sent_tools(engine, session_id, body, source)
        await check_open(engine, session_id)  # before the answer starts: a stream cannot end in a 409
        started = time.perf_counter()
        try:
            chunks = await backend.open_stream(body)
        except UpstreamError as exc:
            elapsed_ms = (time.perf_counter() - started) * 1000
            await record_llm(
                engine, session_id, body, call_id, exc.message, elapsed_ms, key=key, token_source=source
            )
            return answer_turn(Turn(call_id, error=exc), body)
    except SessionRLError as exc:
        return named_error(exc)
    events = relay(
        engine,
        session_id,
        body,
        call_id,
        chunks,
        key=key,
        finish_on_answer=settings.finish_on_answer,
        started=started,
        token_source=source,
    )
    return StreamingResponse(events, media_type="text/event-stream")


async def check_open(engine: Orchestrator, session_id: str) -> None:
    """`InvalidTransition` when the session has ended (one not opened yet is opened by its first step)."""
    with contextlib.suppress(NotFound):
        session = await engine.session(session_id)
        if session.state not in ACTIVE:
            raise InvalidTransition(session_id, session.state, "llm step")


def agent_status(status: int) -> int:
    """The status the agent is given for a backend's failure: the backend's own 4xx (a request it
    refused) and 502 to 504 as they are; any other server error is the upstream's fault, a 502.

    >>> [agent_status(s) for s in (400, 429, 500, 503, 504, 200)]
    [400, 429, 502, 503, 504, 502]
    """
    if 400 <= status < 500 or 502 <= status <= 504:
        return status
    return 502


def openai_error(
    status: int,
    message: str,
    kind: str,
    code: str,
    headers: Mapping[str, str] | None = None,
    *,
    param: str | None = None,
) -> Response:
    """An OpenAI-style error answer."""
    return JSONAnswer(orjson.dumps(error_body(message, kind, code, param)), status, headers=headers)


def named_error(exc: SessionRLError) -> Response:
    """A named sessionrl error as an OpenAI-style error, with the status the session API gives it."""
    known = ((status, code) for kind, status, code in problems.STATUS if isinstance(exc, kind))
    status, code = next(known, (500, "internal"))
    return openai_error(status, str(exc), error_type(status), code)


def invalid_request(exc: RequestValidationError) -> Response:
    """A request the route could not read, as OpenAI answers one (400, `invalid_request_error`): where
    its JSON stopped parsing, that it names no session, or which fields are wrong and why."""
    unreadable = malformed_json(exc)
    if unreadable is not None:
        return openai_error(400, unreadable, "invalid_request_error", "malformed_json")
    errors = exc.errors()
    if any(
        e.get("type") == "missing" and tuple(e.get("loc", ())) == ("header", SESSION_HEADER) for e in errors
    ):
        return openai_error(400, NO_SESSION, "invalid_request_error", "missing_session", param=SESSION_HEADER)
    fields = [".".join(str(p) for p in tuple(e.get("loc", ()))[1:]) or "body" for e in errors]
    detail = "; ".join(f"{f}: {e.get('msg', 'invalid')}" for f, e in zip(fields, errors, strict=True))
    return openai_error(400, detail[:2000], "invalid_request_error", "invalid_request", param=fields[0])
