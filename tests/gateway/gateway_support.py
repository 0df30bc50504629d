"""Shared pieces of the gateway tests: a server on loopback, the orders domain as an agent's tools, and a
scripted chat backend that solves orders tasks with real tool calls (the expert's plan, one call a turn)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import uvicorn

from sessionrl.envs.base import DecisionEnv, Episode, Split, Task
from sessionrl.envs.registry import build
from sessionrl.gateway import ChatReply, ChatRequest, ScriptedChat
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session.model import ToolRequest
from sessionrl.skills import SystemClock

REPO = Path(__file__).resolve().parents[2]
WRITER = "gateway-writer"
TOKENS = parse_tokens(f"{WRITER}:read,write")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving_on_loopback(app: Any) -> Iterator[str]:
    """`app` served by uvicorn on a free loopback port in a thread; yields its root URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def gateway_app(db_url: str, **kwargs: Any) -> Any:
    """A service (no skills of its own) whose gateway answers with `kwargs['chat']` or the config's."""
    fields = {k: kwargs.pop(k) for k in ("upstream_url", "upstream_api_key") if k in kwargs}
    config = ServiceConfig(db_url=db_url, tokens=TOKENS, **fields)
    return create_app(config, skills=[], **kwargs)


class OrdersDesk:
    """The orders domain seen by an agent: its tools as OpenAI function tools, each task's episode to
    run them in, and a script that answers a task's k-th turn with the expert's k-th call."""

    def __init__(self, n_tasks: int) -> None:
        self.env: DecisionEnv = build("orders")
        self.tasks: Sequence[Task] = self.env.tasks(Split.TEST)[:n_tasks]
        self.tools = [c.to_openai_tool() for c in self.env.contracts()]
        self._by_instruction = {t.instruction: t for t in self.tasks}

    def episode(self, task: Task) -> tuple[Episode, Any]:
        """A fresh episode of `task` and the agent's tool function over it."""
        episode = self.env.episode(task)
        skills = {s.contract.name: s for s in episode.skills()}
        clock = SystemClock()

        def call_tool(name: str, arguments: dict[str, Any]) -> Any:
            return asyncio.run(skills[name].invoke(arguments, clock))

        return episode, call_tool

    def reply(self, request: ChatRequest) -> ChatReply:
        """The expert's next call for the request's task, or its final message once every call is made."""
        task = self._by_instruction[next(m.text for m in request.messages if m.role == "user")]
        plan = self.env.expert(task)
        turn = sum(m.role == "assistant" for m in request.messages)
        if turn >= len(plan.steps):
            return ChatReply(text=plan.final_message, usage={"prompt_tokens": 50, "completion_tokens": 9})
        step = plan.steps[turn]
        call = ToolRequest(
            id=f"call_{task.task_id}_{turn}",
            name=step.tool,
            arguments=orjson.dumps(dict(step.params)).decode(),
        )
        return ChatReply(tool_calls=(call,), usage={"prompt_tokens": 40, "completion_tokens": 12})

    def backend(self) -> ScriptedChat:
        return ScriptedChat(self.reply, model="scripted-expert")
