"""Operations inside a service: routing each session to a policy version, the strategy switch, takeover.

`Operations` is the orchestrator's `Chooser`: before every step that asks the policy it reads the strategy
mode, then either parks the session for a person (`human`), answers with the rule-based strategy
(`rules`), or routes the session to a registered version (`policy`) and records the route in the session
the first time. When the policy has no registered version, the engine's own backends answer, as without
operations. `RoutedChat` does the same for the OpenAI-compatible gateway.

Versions are turned into backends by a `Loader` (by default an `HFPolicy` loaded from the version's
artifact folder), each loaded once per process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sessionrl.gateway.backends import ChatBackend, ChatReply, PolicyChat, UpstreamError
from sessionrl.gateway.capture import open_session
from sessionrl.gateway.chat import ChatRequest
from sessionrl.ops.alerts import send_alert
from sessionrl.ops.config import OpsConfig
from sessionrl.ops.registry import PolicyRegistry, PolicyVersion
from sessionrl.ops.routing import ROUTE_KEY, Route, Router, recorded_route, version_tag
from sessionrl.ops.strategy import RulesBackend, StrategyMode, current_mode, fallback_plan
from sessionrl.ops.takeover import is_parked, park_patch
from sessionrl.orchestrator.engine import Orchestrator
from sessionrl.orchestrator.policy import PolicyBackend, PolicyError
from sessionrl.session.model import Session, SessionPatch
from sessionrl.store import SessionStore

Loader = Callable[[PolicyVersion], PolicyBackend]
"""Turns a registered version into the backend that serves it."""
ChatLoader = Callable[[PolicyVersion], ChatBackend]
"""Turns a registered version into the gateway backend that serves it."""


def load_hf_policy(version: PolicyVersion) -> PolicyBackend:
    """The default loader: the Hugging Face (or tiny) policy exported in the version's artifact folder."""
    from sessionrl.policy.llm import HFPolicy

    return HFPolicy.load(Path(version.artifact))


class Parked(PolicyError):
    """The session waits for a person: no policy answers it until someone posts its next step."""


class Operations:
    """Routing, degradation and takeover for one service (see the module doc). `open(store)` first."""

    def __init__(self, config: OpsConfig | None = None, *, loader: Loader = load_hf_policy) -> None:
        self.config = config or OpsConfig()
        self.loader = loader
        self._registry: PolicyRegistry | None = None
        self._loaded: dict[tuple[str, int], PolicyBackend] = {}

    def open(self, store: SessionStore) -> None:
        """Use the registry in `store` (the service's lifespan calls this when it opens the store)."""
        self._registry = PolicyRegistry(store, check=self.loader)  # what cannot load is never routed to

    @property
    def registry(self) -> PolicyRegistry:
        if self._registry is None:
            raise RuntimeError("Operations.open(store) was not called")
        return self._registry

    @property
    def router(self) -> Router:
        return Router(self.registry, self.config.policy)

    def mode(self) -> StrategyMode:
        """The strategy mode in force, read from the store."""
        return current_mode(self.registry)

    def backend(self, version: PolicyVersion) -> PolicyBackend:
        """The backend serving `version` (loaded on first use)."""
        key = (version.policy, version.version)
        if key not in self._loaded:
            try:
                self._loaded[key] = self.loader(version)
            except Exception as exc:  # e.g. its artifact was deleted after promotion: no retry helps
                tag = version_tag(version.policy, version.version)
                raise PolicyError(f"{tag} does not load: {exc}", retryable=False) from exc
        return self._loaded[key]

    async def decide(self, engine: Orchestrator, session: Session) -> RulesBackend | Route:
        """What answers the session's next policy call: the rule-based strategy, or its routed version
        (`human` mode, or a parked session, raises `Parked` after parking it)."""
        mode = await asyncio.to_thread(self.mode)
        if mode is StrategyMode.HUMAN or is_parked(session):
            await self.park(engine, session, f"strategy_mode is {mode}")
        if mode is StrategyMode.RULES:
            plan = fallback_plan(session, self.config)
            if plan is None:
                raise PolicyError(
                    f"strategy_mode is rules but session {session.session_id!r} has no rule-based plan"
                    " (no env expert for its task, no plan template for its scenario)"
                )
            return RulesBackend(plan, session.plan)
        return await self.routed(engine, session)

    async def __call__(self, engine: Orchestrator, session: Session) -> PolicyBackend:
        """The backend for the session's next policy call (the orchestrator's `Chooser`)."""
        decision = await self.decide(engine, session)
        if isinstance(decision, RulesBackend):
            return decision
        if decision.version is None:
            return engine.route(session.session_id)
        version = await asyncio.to_thread(self.registry.get, decision.policy, decision.version)
        return self.backend(version)

    async def routed(self, engine: Orchestrator, session: Session) -> Route:
        """The session's route; a new decision is written to its metadata before it is used."""
        route = await asyncio.to_thread(self.router.route_session, session)
        if route.version is not None and recorded_route(session) != route:
            metadata = {**session.metadata, ROUTE_KEY: route.metadata()}
            tags = tuple(dict.fromkeys((*session.tags, version_tag(route.policy, route.version))))
            await engine.patch(session.session_id, SessionPatch(metadata=metadata, tags=tags))
        return route

    async def park(self, engine: Orchestrator, session: Session, reason: str) -> None:
        """Park the session for a person (once: alerting with its trace id), then fail the step."""
        if not is_parked(session):
            await engine.patch(session.session_id, park_patch(session, reason))
            detail = {"session_id": session.session_id, "trace_id": session.trace_id, "reason": reason}
            await asyncio.to_thread(
                send_alert,
                self.registry,
                self.config.webhook_url,
                "needs_human",
                detail,
                timeout_s=self.config.webhook_timeout_s,
            )
        raise Parked(
            f"session {session.session_id!r} is parked for a human (needs_human, trace {session.trace_id});"
            " post its next step to /v1/policies/takeover/{session_id}/steps"
        )


class RoutedChat:
    """The gateway's backend under operations: the strategy mode, then the session's routed version."""

    def __init__(
        self,
        ops: Operations,
        engine: Callable[[], Orchestrator | None],
        chats: ChatLoader | None = None,
        *,
        model: str = "sessionrl-policy",
    ) -> None:
        self.ops = ops
        self.engine = engine
        self.chats = chats or (lambda version: PolicyChat([ops.backend(version)], model=model))
        self.model = model
        self._chats: dict[tuple[str, int], ChatBackend] = {}

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        """Answer as the mode and the session's route say; a parked session gets a 503."""
        engine = self.engine()
        if engine is None:
            raise UpstreamError(503, "the service is not running")
        session = await open_session(engine, session_id, request)  # a first request opens it here
        try:
            decision = await self.ops.decide(engine, session)
        except PolicyError as exc:
            raise UpstreamError(503, str(exc)) from exc
        if isinstance(decision, RulesBackend):
            return await PolicyChat([decision], model="rules").complete(request, session_id)
        if decision.version is None:
            if not engine.backends:
                raise UpstreamError(503, f"policy {decision.policy!r} has no version serving")
            return await PolicyChat(engine.backends, model=self.model).complete(request, session_id)
        version = await asyncio.to_thread(self.ops.registry.get, decision.policy, decision.version)
        try:
            chat = self._chat(version)
        except PolicyError as exc:  # its artifact does not load: say so, not a 500
            raise UpstreamError(503, str(exc)) from exc
        return await chat.complete(request, session_id)

    def _chat(self, version: PolicyVersion) -> ChatBackend:
        key = (version.policy, version.version)
        if key not in self._chats:
            self._chats[key] = self.chats(version)
        return self._chats[key]

    async def models(self) -> list[str]:
        """The policy's name as the one model served."""
        return [self.ops.config.policy]


def route_gateway(app: Any, chats: ChatLoader | None = None) -> None:
    """Make a service's gateway answer through operations (`RoutedChat` over the app's `Operations`)."""
    app.state.chat = RoutedChat(app.state.ops, lambda: app.state.engine, chats)
