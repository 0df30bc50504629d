"""A small, faithful simulator of an OpenAI-compatible server, for the gateway's proxy tests.

It is a simulator, not a model: it answers `POST /v1/chat/completions` by calling the first offered tool
once (with the last user message as `q`), then answering in text with what the tool returned. It is
faithful in what a proxy meets: bearer-key checks (401), a fixed latency, scheduled failures (503 with an
OpenAI error body, or a dropped connection), `GET /v1/models`, and answers shaped as OpenAI's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

MODEL = "sim-1"


@dataclass
class Simulator:
    """Settings and counters of one simulated upstream."""

    api_key: str = "upstream-key"
    latency_s: float = 0.01
    fail: set[int] = field(default_factory=set)
    """Numbers (from 0) of the completion requests answered with a 503."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    chunk_delay_s: float = 0.0
    """Between the chunks of a streamed answer."""
    parallel: bool = False
    """Call every offered tool at once (parallel tool calls), not only the first."""
    send_usage: bool = True
    streams_done: list[float] = field(default_factory=list)
    """When (`time.monotonic()`) each streamed answer sent its last chunk."""

    def app(self) -> Starlette:
        counter = itertools.count()

        async def completions(request: Request) -> JSONResponse:
            if request.headers.get("authorization") != f"Bearer {self.api_key}":
                return error(401, "Incorrect API key provided", "invalid_api_key")
            body = await request.json()
            self.requests.append(body)
            n = next(counter)
            await asyncio.sleep(self.latency_s)
            if n in self.fail:
                return error(503, "The server is overloaded; try again later", "overloaded")
            whole = answer(body, n, parallel=self.parallel)
            if not self.send_usage:
                whole.pop("usage")
            if body.get("return_token_ids"):  # as vLLM's OpenAI server answers when asked
                with_tokens(whole)
            if body.get("stream"):
                return StreamingResponse(self.stream(whole, body), media_type="text/event-stream")
            return JSONResponse(whole)

        async def models(request: Request) -> JSONResponse:
            return JSONResponse(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "sim"}]}
            )

        return Starlette(
            routes=[
                Route("/v1/chat/completions", completions, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
            ]
        )

    async def stream(self, whole: dict[str, Any], body: dict[str, Any]) -> AsyncIterator[bytes]:
        """`whole` as OpenAI streams it: the role, the text word by word, each tool call's name then its
        arguments in two pieces, the finish reason, and the usage when asked for; `chunk_delay_s` apart."""
        for chunk in chunks_of(
            whole, include_usage=bool((body.get("stream_options") or {}).get("include_usage"))
        ):
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            await asyncio.sleep(self.chunk_delay_s)
        self.streams_done.append(time.monotonic())
        yield b"data: [DONE]\n\n"


PROMPT_IDS = [1, 2, 3]


def with_tokens(whole: dict[str, Any]) -> None:
    """Give an answer vLLM's token fields: the prompt's ids, one sampled id per word of its text (or per
    tool call), and their log-probabilities (ids spelled `token_id:N`, as `return_tokens_as_token_ids`
    asks)."""
    choice = whole["choices"][0]
    message = choice["message"]
    text = message.get("content") or ""
    count = len(text.split(" ")) if text else len(message["tool_calls"])
    ids = [100 + i for i in range(count)]
    whole["prompt_token_ids"] = PROMPT_IDS
    choice["token_ids"] = ids
    content = [{"token": f"token_id:{t}", "logprob": -0.25 * (i + 1)} for i, t in enumerate(ids)]
    choice["logprobs"] = {"content": content}


def chunks_of(whole: dict[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    head = {"id": whole["id"], "object": "chat.completion.chunk", "created": whole["created"], "model": MODEL}
    choice = whole["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    out = [chunk({"role": "assistant", "content": ""})]
    if "prompt_token_ids" in whole:
        out[0]["prompt_token_ids"] = whole["prompt_token_ids"]
    words = (message.get("content") or "").split(" ")
    for i, w in enumerate(words if message.get("content") else ()):
        piece = chunk({"content": w if i == 0 else " " + w})
        if "token_ids" in choice:  # each word its own token, as the whole answer counted them
            piece["choices"][0]["token_ids"] = choice["token_ids"][i : i + 1]
            piece["choices"][0]["logprobs"] = {"content": choice["logprobs"]["content"][i : i + 1]}
        out.append(piece)
    for i, call in enumerate(message.get("tool_calls") or ()):
        arguments = call["function"]["arguments"]
        half = len(arguments) // 2
        named = {
            "index": i,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        out.append(chunk({"tool_calls": [named]}))
        out += [
            chunk({"tool_calls": [{"index": i, "function": {"arguments": part}}]})
            for part in (arguments[:half], arguments[half:])
        ]
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage and "usage" in whole:
        out.append({**head, "choices": [], "usage": whole["usage"]})
    return out


def error(status: int, message: str, code: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


def answer(body: dict[str, Any], n: int, *, parallel: bool = False) -> dict[str, Any]:
    """A tool call to the first tool (to every tool, `parallel`) while no tool has answered, then a text
    answer."""
    messages = body["messages"]
    tool_results = [m for m in messages if m["role"] == "tool"]
    tools = body.get("tools") or []
    if tools and not tool_results:
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        calls = [
            {
                "id": f"call_sim_{n}" + (f"_{i}" if parallel else ""),
                "type": "function",
                "function": {"name": tool["function"]["name"], "arguments": json.dumps({"q": user})},
            }
            for i, tool in enumerate(tools if parallel else tools[:1])
        ]
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    else:
        said = tool_results[-1]["content"] if tool_results else "nothing"
        message, finish = {"role": "assistant", "content": f"done: {said}"}, "stop"
    return {
        "id": f"chatcmpl-sim-{n}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 20 + n, "completion_tokens": 5, "total_tokens": 25 + n},
    }
