"""The app factory: `create_app(config, skills=..., backends=...)` builds one independent service.

The store, the skill executor and the engine are opened in the lifespan and kept on `app.state`; tokens,
the rate limiter and the metrics registry are built with the app. Nothing of an app lives at module level,
so any number of apps can run in one process (the tests do). While it runs, a service schedules the
garbage collector for its long-lived sessions (`collector`, which counts the services sharing the
process's collector) and times the collector's pauses for `/metrics`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp

from sessionrl import __version__
from sessionrl.access import TokenTable
from sessionrl.errors import MissingExtra, require_extra
from sessionrl.gateway.backends import ChatBackend, PolicyChat
from sessionrl.gateway.ending import sweep_idle
from sessionrl.gateway.upstream import UpstreamChat
from sessionrl.ops.serving import Operations
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.policy import PolicyBackend
from sessionrl.service import problems
from sessionrl.service.auth import RateLimiter
from sessionrl.service.collector import scheduled_collector
from sessionrl.service.config import ServiceConfig
from sessionrl.service.limits import BodyLimit
from sessionrl.service.metrics import Metrics
from sessionrl.service.routers import ROUTERS, gateway, policies, traces
from sessionrl.service.shortcut import Shortcut
from sessionrl.skills import ExecutorConfig, Skill, SkillExecutor, load_contracts, simulated_skill
from sessionrl.store import SessionStore

_log = logging.getLogger(__name__)


def simulated_skills(config: ServiceConfig) -> list[Skill]:
    """Simulated stand-ins for every contract in `config.skills_dir` (none without a folder)."""
    if config.skills_dir is None:
        return []
    contracts = load_contracts(config.skills_dir)
    return [simulated_skill(c, seed=i) for i, c in enumerate(contracts.values())]


def create_app(
    config: ServiceConfig,
    *,
    skills: Sequence[Skill] | None = None,
    backends: Sequence[PolicyBackend] = (),
    chat: ChatBackend | None = None,
    ops: Operations | None = None,
) -> FastAPI:
    """A service over the store at `config.db_url`, serving `skills` (default: the simulated contracts of
    `config.skills_dir`) and asking `backends` when a step needs the policy. The OpenAI-compatible
    gateway answers with `chat`; by default, with `config.upstream_url` when set, else with `backends`.
    `ops` routes policy calls to registered versions and applies the strategy mode (`sessionrl.ops`)."""
    operations = ops or Operations(config.ops)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # the store keeps as many sessions as the engine: a write to a session the engine still holds but
        # the store forgot would re-read and re-parse its document on the commit thread
        store = SessionStore.open(config.db_url, cache_sessions=config.orchestrator.cache_size)
        executor = SkillExecutor(
            skills if skills is not None else simulated_skills(config),
            ExecutorConfig(time_factor=config.time_factor),
        )
        operations.open(store)
        engine = Orchestrator(store, executor, backends, config.orchestrator, chooser=operations)
        app.state.engine = engine
        app.state.store = store  # the dashboard's pages read it
        sweeper = asyncio.create_task(sweep_idle(lambda: app.state.engine, config.gateway))
        try:
            async with scheduled_collector(config.full_gc_every_s):
                with app.state.metrics.gc_pauses():
                    yield
        finally:
            sweeper.cancel()
            app.state.engine = None
            if isinstance(app.state.chat, UpstreamChat):
                await app.state.chat.aclose()
            await engine.aclose()
            await executor.aclose()
            store.close()

    app = _Service(
        title="sessionrl",
        version=__version__,
        summary="Capture Decision Sessions: plans, tool calls, LLM calls, feedback and final outputs.",
        lifespan=lifespan,
        docs_url=None,  # served offline by the dashboard (`sessionrl.ui`)
        redoc_url=None,  # ReDoc loads its script from a CDN, which an offline machine cannot reach
        # metrics are this app's own Prometheus registry and logs go through `logging`: the framework's
        # OpenTelemetry metrics and logs would only cost a provider lookup per request (tracing stays on)
        telemetry={"metrics": False, "logs": False},
    )
    metrics = Metrics()
    app.state.config = config
    app.state.tokens = TokenTable(config.tokens)
    app.state.limiter = RateLimiter(config.rate_per_s, config.burst)
    app.state.metrics = metrics
    app.state.engine = None
    app.state.ops = operations
    app.state.chat = chat if chat is not None else default_chat(config, backends)
    metrics.watch(lambda: app.state.engine)
    problems.install(app)
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(gateway.router)  # after ROUTERS, as the shortcut reads them (see `_Service`)
    app.include_router(policies.router)
    app.include_router(traces.router)  # OTLP /v1/traces; its lifespan opens the trace receiver
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(_Measured, metrics=metrics)
    _mount_dashboard(app, config)
    _document_problems(app)
    return app


def _mount_dashboard(app: FastAPI, config: ServiceConfig) -> None:
    """The dashboard (`/ui`) and the offline `/docs`, when the ui extra is installed; else a warning that
    says how to get them, and the API alone."""
    try:
        require_extra("the dashboard (/ui) and the API docs (/docs)", "ui", "jinja2")
    except MissingExtra as missing:
        _log.warning("%s; serving the API without them", missing)
        return
    from sessionrl.ui import UIConfig, mount  # needs jinja2

    mount(app, UIConfig(skills_dir=config.skills_dir))


def default_chat(config: ServiceConfig, backends: Sequence[PolicyBackend]) -> ChatBackend | None:
    """The gateway's backend: the upstream server of the config, else the service's own policy, if any."""
    if config.upstream_url is not None:
        return UpstreamChat(
            config.upstream_url,
            api_key=config.upstream_api_key,
            token_ids=config.gateway.upstream_token_ids,
        )
    return PolicyChat(backends) if backends else None


class _Service(FastAPI):
    """The app, with `Shortcut` around the framework's whole middleware stack (its error layer included),
    so the requests the shortcut serves pass none of it. The shortcut reads the routes of `ROUTERS` and
    then the gateway's, which the app includes first and in that order, as they are (no prefix), so it
    tries them in the framework's order."""

    def build_middleware_stack(self) -> ASGIApp:
        routes = [r for router in (*ROUTERS, gateway.router) for r in router.routes]
        return Shortcut(super().build_middleware_stack(), routes)


class _Measured:
    """ASGI middleware adapter for `Metrics.middleware` (the outermost layer, so it sees every answer)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self._app = metrics.middleware(app)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._app(scope, receive, send)


def _document_problems(app: FastAPI) -> None:
    """Make the generated OpenAPI document include the `Problem` schema the error responses refer to,
    and describe optional parameters as they travel: absent or a value, never a `null`."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _parameters_without_null(problems.add_problem_schema(generate()))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _parameters_without_null(openapi: dict[str, Any]) -> dict[str, Any]:
    """Drop the `null` alternative of optional query, header and path parameters (a header or a query
    parameter cannot carry a JSON null; leaving it out is how a client says none)."""
    for methods in openapi.get("paths", {}).values():
        for operation in methods.values():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                options = [o for o in schema.get("anyOf", []) if o != {"type": "null"}]
                if len(options) == 1 and len(schema["anyOf"]) == 2:
                    rest = {k: v for k, v in schema.items() if k != "anyOf"}
                    parameter["schema"] = {**options[0], **rest}
    return openapi
