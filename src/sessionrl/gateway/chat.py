"""The OpenAI chat-completions wire, as much of it as an agent loop uses: requests (messages, tools,
`tool_choice`, `stream`), answers, stream chunks and errors.

Requests are checked as OpenAI checks them (the types and ranges of its fields, and the order of the
messages: `request_problem`), so a request OpenAI would refuse is refused here before anything is
recorded; fields this gateway does not know are kept and passed on to an upstream. Answers are written
as plain JSON objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sessionrl.session.model import Message, ToolRequest


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class FunctionCall(_Lenient):
    """The function a tool call names, with its arguments as the JSON text the model wrote."""

    name: str = Field(min_length=1, max_length=200)
    arguments: str = "{}"


class ChatToolCall(_Lenient):
    """One tool call of an assistant message."""

    id: str = Field(min_length=1, max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Lenient):
    """One message of a conversation; `content` may be text, a list of parts, or none (tool calls only)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = Field(default=None, max_length=200)
    name: str | None = None

    @property
    def text(self) -> str:
        """The message's text: its content, or the text parts of a list of parts joined."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""

    def to_message(self) -> Message:
        """The session's own form of this message (a developer message is a system one)."""
        calls = tuple(
            ToolRequest(id=c.id, name=c.function.name, arguments=c.function.arguments)
            for c in self.tool_calls or ()
        )
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=self.text, tool_calls=calls, tool_call_id=self.tool_call_id)


Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]
"""A JSON number, as OpenAI takes one: `"0.5"` or `true` is refused, not converted."""


class FunctionSpec(_Lenient):
    """The function a tool offers: its name (OpenAI's pattern) and the JSON schema of its parameters."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = Field(default=None, strict=True)


class ChatTool(_Lenient):
    """One tool a request offers (OpenAI's function tools)."""

    type: Literal["function"]
    function: FunctionSpec


class StreamOptions(_Lenient):
    """`stream_options`: whether a streamed answer ends with a chunk carrying the usage."""

    include_usage: bool | None = Field(default=None, strict=True)


class ChatRequest(_Lenient):
    """A chat-completions request. The sampling fields OpenAI defines are checked with its types and
    ranges (a request OpenAI would refuse is refused before anything is recorded); fields this gateway
    does not know are kept and passed on to an upstream (vLLM's own, such as `top_k`)."""

    model: str = Field(default="", max_length=200)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, ge=0, le=1)
    n: int | None = Field(default=None, ge=1, le=1, description="The gateway records one choice.")
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    presence_penalty: Number | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: Number | None = Field(default=None, ge=-2, le=2)
    stop: str | list[str] | None = Field(default=None)
    seed: int | None = None
    logprobs: bool | None = Field(default=None, strict=True)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = Field(
        default=None,
        max_length=16,
        description="OpenAI's request metadata; the request that opens a session gives it to the session "
        "(such as {env, task_id}, which let training replay the session's task).",
    )

    @field_validator("n", "max_tokens", "max_completion_tokens", "seed", "top_logprobs", mode="before")
    @classmethod
    def _a_count(cls, value: Any) -> Any:
        """A count is a number (`10.0` is one), never text or a boolean, as OpenAI reads it."""
        if isinstance(value, str | bool):
            raise ValueError("Input should be a valid integer, not text or a boolean")
        return value

    def tool_names(self) -> frozenset[str]:
        """The names of the function tools the request offers."""
        return frozenset(t.function.name for t in self.tools or ())

    def tool_dicts(self) -> list[dict[str, Any]]:
        """The offered tools as the JSON the agent sent."""
        return [t.model_dump(mode="json", exclude_none=True) for t in self.tools or ()]

    @property
    def include_usage(self) -> bool:
        """Whether a streamed answer should end with the usage."""
        return bool(self.stream_options is not None and self.stream_options.include_usage)

    def allows_tools(self) -> bool:
        """Whether the model may answer with tool calls (tools offered, and `tool_choice` is not none)."""
        return bool(self.tools) and self.tool_choice != "none"


def wire_tool_calls(calls: tuple[ToolRequest, ...]) -> list[dict[str, Any]]:
    """Tool calls as an assistant message spells them."""
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def completion(
    call_id: str,
    model: str,
    text: str | None,
    calls: tuple[ToolRequest, ...],
    usage: dict[str, int],
    created: int,
) -> dict[str, Any]:
    """A `chat.completion` answer with one choice, made at `created` (Unix seconds)."""
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = wire_tool_calls(calls)
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason(calls), "logprobs": None}
        ],
        "usage": full_usage(usage) if usage else None,  # an upstream that sent none: null, never zeros
    }


def finish_reason(calls: tuple[ToolRequest, ...]) -> str:
    """`tool_calls` when the model asked for tools, else `stop`."""
    return "tool_calls" if calls else "stop"


def full_usage(usage: dict[str, int]) -> dict[str, int]:
    """OpenAI's usage object, with each of its three counts present."""
    prompt, completion_tokens = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    total = usage.get("total_tokens", prompt + completion_tokens)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": total}


def stream_events(answer: dict[str, Any], *, include_usage: bool) -> Iterator[bytes]:
    """A finished `chat.completion` as server-sent events of `chat.completion.chunk`s, then `[DONE]`: the
    role, the text, one chunk per tool call, the finish reason, and the usage when asked for."""
    choice = answer["choices"][0]
    message = choice["message"]
    head = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]})
    for i, call in enumerate(message.get("tool_calls", ())):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage and answer["usage"] is not None:
        yield b"data: " + orjson.dumps({**head, "choices": [], "usage": answer["usage"]}) + b"\n\n"
    yield b"data: [DONE]\n\n"


OPENAI_PATHS = ("/gateway/", "/v1/chat/", "/v1/models")
"""Where the gateway answers: every error under these paths is in OpenAI's shape, whoever answers it
(a route, the body limit, the framework's 404 or 405)."""


def error_type(status: int) -> str:
    """The OpenAI error type of a status.

    >>> error_type(401), error_type(413), error_type(502)
    ('authentication_error', 'invalid_request_error', 'server_error')
    """
    kinds = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
    return kinds.get(status, "invalid_request_error" if status < 500 else "server_error")


def error_body(message: str, kind: str, code: str, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error document: `{"error": {"message", "type", "param", "code"}}`; `param` names
    the field or header at fault, when one is."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def models_page(names: list[str]) -> dict[str, Any]:
    """A `GET /models` answer listing `names`."""
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "sessionrl"} for n in names]
    return {"object": "list", "data": data}


@dataclass(frozen=True)
class Refusal:
    """Why OpenAI would refuse a request that validates field by field, and the field at fault."""

    message: str
    param: str


def request_problem(request: ChatRequest) -> Refusal | None:
    """What OpenAI refuses in a request whose fields are each well formed: `tool_choice` or
    `stream_options` without what they need, or messages in an order it does not take
    (`message_order_problem`).

    >>> request_problem(ChatRequest(messages=[{"role": "user", "content": "hi"}], tool_choice="auto")).param
    'tool_choice'
    """
    if request.tool_choice is not None and not request.tools:
        return Refusal("'tool_choice' is only allowed when 'tools' are specified", "tool_choice")
    if isinstance(request.tool_choice, dict):
        named = (request.tool_choice.get("function") or {}).get("name")
        if named not in request.tool_names():
            return Refusal(f"'tool_choice' names a function the tools do not offer: {named!r}", "tool_choice")
    if request.stream_options is not None and not request.stream:
        return Refusal("'stream_options' is only allowed when 'stream' is enabled", "stream_options")
    return message_order_problem(request.messages)


def message_order_problem(messages: Sequence[ChatMessage]) -> Refusal | None:
    """Why OpenAI would refuse the order of `messages`: a `tool` message must answer a tool call of the
    assistant message just before it (only other `tool` messages between them), every tool call of an
    assistant message must be answered before the next message that is not a `tool` one, and an
    assistant message has content or tool calls.

    >>> call = {"id": "c1", "function": {"name": "f"}}
    >>> ok = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [call]},
    ...       {"role": "tool", "tool_call_id": "c1", "content": "r"}]
    >>> message_order_problem([ChatMessage.model_validate(m) for m in ok]) is None
    True
    >>> stray = [ok[0], {"role": "tool", "tool_call_id": "c9", "content": "r"}]
    >>> message_order_problem([ChatMessage.model_validate(m) for m in stray]).param
    'messages.[1].tool_call_id'
    """
    waiting: dict[str, None] = {}  # tool call ids of the last assistant message not yet answered
    for i, message in enumerate(messages):
        if message.role == "tool":
            if message.tool_call_id not in waiting:
                return Refusal(
                    f"messages.[{i}]: a message with role 'tool' must answer a tool call of the assistant "
                    f"message before it; none of them has the id {message.tool_call_id!r}",
                    f"messages.[{i}].tool_call_id",
                )
            del waiting[message.tool_call_id]
            continue
        if waiting:
            return _unanswered(waiting, i)
        if message.role != "assistant":
            continue
        ids = [c.id for c in message.tool_calls or ()]
        if len(set(ids)) < len(ids):
            return Refusal(f"messages.[{i}]: tool call ids repeat: {ids}", f"messages.[{i}].tool_calls")
        if not ids and message.content is None:
            return Refusal(
                f"messages.[{i}]: an assistant message needs 'content' or 'tool_calls'", f"messages.[{i}]"
            )
        waiting = dict.fromkeys(ids)
    return _unanswered(waiting, len(messages)) if waiting else None


def _unanswered(waiting: dict[str, None], at: int) -> Refusal:
    return Refusal(
        "an assistant message with 'tool_calls' must be followed by tool messages answering each "
        f"'tool_call_id'; these had none: {', '.join(waiting)}",
        f"messages.[{at}]" if at else "messages",
    )
