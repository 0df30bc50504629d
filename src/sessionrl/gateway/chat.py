"""The OpenAI chat-completions wire, as much of it as an agent loop uses: requests (messages, tools,
`tool_choice`, `stream`), answers, stream chunks and errors.

Requests are read leniently (an OpenAI client sends fields this gateway has no use for, such as
`temperature`; they are kept and passed on to an upstream), answers are written as plain JSON objects.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

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


class ChatRequest(_Lenient):
    """A chat-completions request."""

    model: str = Field(default="", max_length=200)
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[str, str] | None = Field(
        default=None,
        max_length=16,
        description="OpenAI's request metadata; the request that opens a session gives it to the session "
        "(such as {env, task_id}, which let training replay the session's task).",
    )

    def tool_names(self) -> frozenset[str]:
        """The names of the function tools the request offers."""
        names = (t.get("function", {}).get("name") for t in self.tools or () if isinstance(t, dict))
        return frozenset(n for n in names if isinstance(n, str))

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
    call_id: str, model: str, text: str | None, calls: tuple[ToolRequest, ...], usage: dict[str, int]
) -> dict[str, Any]:
    """A `chat.completion` answer with one choice."""
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = wire_tool_calls(calls)
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason(calls), "logprobs": None}
        ],
        "usage": full_usage(usage),
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
    if include_usage:
        yield b"data: " + orjson.dumps({**head, "choices": [], "usage": answer["usage"]}) + b"\n\n"
    yield b"data: [DONE]\n\n"


def error_body(message: str, kind: str, code: str, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error document: `{"error": {"message", "type", "param", "code"}}`; `param` names
    the field or header at fault, when one is."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def models_page(names: list[str]) -> dict[str, Any]:
    """A `GET /models` answer listing `names`."""
    data = [{"id": n, "object": "model", "created": 0, "owned_by": "sessionrl"} for n in names]
    return {"object": "list", "data": data}
