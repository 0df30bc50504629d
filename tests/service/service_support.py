"""Shared pieces of the service tests: tokens, skills, and an app with a client wired to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI

from sessionrl.gateway import ChatBackend
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.skills import Skill, SkillContract, callable_skill

WRITER = "writer-token"
OTHER_WRITER = "second-writer-token"
READER = "reader-token"
TOKENS = parse_tokens(f"{WRITER}:read,write;{OTHER_WRITER}:write;{READER}:read")
AUTH = {"Authorization": f"Bearer {WRITER}"}

PLAN = {
    "root_goal": "refund the order",
    "subgoals": [
        {"id": "a", "description": "find the order", "tool": "find"},
        {"id": "b", "description": "refund it", "tool": "refund", "depends_on": ["a"]},
    ],
}


def contract(name: str, **fields: Any) -> SkillContract:
    return SkillContract.model_validate(
        {"name": name, "description": f"The {name} skill.", "input_schema": {"type": "object"}, **fields}
    )


def skills() -> list[Skill]:
    return [
        callable_skill(contract("find"), lambda p: {"order": "#1", **p}),
        callable_skill(contract("refund"), lambda p: {"refunded": True}),
    ]


def make_app(
    skill_list: Sequence[Skill] | None = None,
    backends: Sequence[PolicyBackend] = (),
    chat: ChatBackend | None = None,
    **fields: Any,
) -> FastAPI:
    config = ServiceConfig(db_url="sqlite://", tokens=TOKENS, **fields)
    chosen = skills() if skill_list is None else skill_list
    return create_app(config, skills=chosen, backends=backends, chat=chat)


@asynccontextmanager
async def serving(app: FastAPI, *, raise_errors: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app's lifespan and yield a writer's client talking to it in process."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_errors)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://service", headers=AUTH) as client,
    ):
        yield client
