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
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
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
            return JSONResponse(answer(body, n))

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


def error(status: int, message: str, code: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


def answer(body: dict[str, Any], n: int) -> dict[str, Any]:
    """A tool call to the first tool while no tool has answered, then a text answer."""
    messages = body["messages"]
    tool_results = [m for m in messages if m["role"] == "tool"]
    tools = body.get("tools") or []
    if tools and not tool_results:
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        call = {
            "id": f"call_sim_{n}",
            "type": "function",
            "function": {"name": tools[0]["function"]["name"], "arguments": json.dumps({"q": user})},
        }
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
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
