"""Shared pieces of the operations tests: a service with operations, a webhook that records its alerts."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from fastapi import FastAPI

from sessionrl.gateway import ChatBackend
from sessionrl.ops.config import OpsConfig
from sessionrl.ops.routing import ROUTE_KEY, version_tag
from sessionrl.ops.serving import Loader, Operations
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session import (
    CallStatus,
    Feedback,
    FeedbackAdded,
    FeedbackType,
    SessionCreate,
    StateChanged,
    ToolCall,
    ToolCallRecorded,
)
from sessionrl.skills import Skill, SkillContract, callable_skill
from sessionrl.store import SessionStore

TOKEN = "ops-writer"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def contract(name: str) -> SkillContract:
    return SkillContract.model_validate(
        {"name": name, "description": f"The {name} skill.", "input_schema": {"type": "object"}}
    )


def skills() -> list[Skill]:
    """Two tools of a support desk: find an order, refund it."""
    return [
        callable_skill(contract("find"), lambda p: {"order": "#1"}),
        callable_skill(contract("refund"), lambda p: {"refunded": True}),
    ]


def make_app(
    db_url: str,
    ops: OpsConfig,
    *,
    backends: Sequence[PolicyBackend] = (),
    loader: Loader | None = None,
    chat: ChatBackend | None = None,
    operations: Operations | None = None,
) -> FastAPI:
    """A service over `db_url` with the support skills and operations configured by `ops`."""
    config = ServiceConfig(db_url=db_url, tokens=parse_tokens(f"{TOKEN}:read,write"), ops=ops)
    if operations is None:
        operations = Operations(ops) if loader is None else Operations(ops, loader=loader)
    return create_app(config, skills=skills(), backends=backends, chat=chat, ops=operations)


@asynccontextmanager
async def serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan; a writer's client talking to it in process."""
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://service", headers=AUTH) as client,
    ):
        yield client


class Webhook:
    """A local HTTP server recording the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                outer.received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hook"


@contextmanager
def webhook() -> Iterator[Webhook]:
    """A running `Webhook`, stopped afterwards."""
    hook = Webhook()
    thread = threading.Thread(target=hook.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        hook.server.shutdown()
        hook.server.server_close()
        thread.join()


def served(
    store: SessionStore, sid: str, version: int, *, calls: list[bool], solved: bool | None, task: str
) -> None:
    """Write a session that `orders` v`version` served: its tool calls (ok or not) and its verdict."""
    route = {"policy": "orders", "version": version, "arm": "test", "key": sid}
    store.create(
        SessionCreate(
            user_query="q",
            session_id=sid,
            scenario="orders",
            tags=(version_tag("orders", version),),
            metadata={"task_id": task, ROUTE_KEY: route},
        )
    )
    store.append(sid, StateChanged(state="executing"))
    for i, ok in enumerate(calls):
        status = CallStatus.SUCCESS if ok else CallStatus.ERROR
        store.append(sid, ToolCallRecorded(call=ToolCall(call_id=f"c{i}", tool="find", status=status)))
    if solved is not None:
        verdict = Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0 if solved else 0.0)
        store.append(sid, FeedbackAdded(feedback=verdict))
