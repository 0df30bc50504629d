"""Routing: a canary's share of keys, sticky per key and drawn afresh per canary; pins; and, through the
service's steps, each session served by the version its recorded route names, re-routed once that version
is rolled back; the gateway in `rules` and `human` modes."""

from __future__ import annotations

from pathlib import Path

from ops_support import make_app, serving

from sessionrl.gateway import ChatReply, ScriptedChat
from sessionrl.ops.config import OpsConfig, TemplateStep
from sessionrl.ops.registry import PolicyRegistry, PolicyVersion, Stage
from sessionrl.ops.routing import Arm, Router, bucket, choose, routing_key
from sessionrl.ops.serving import route_gateway
from sessionrl.orchestrator.policy import PolicyBackend, PolicyReply
from sessionrl.session.model import Message, Session, utcnow
from sessionrl.store import SessionStore


def test_a_canary_gets_its_share_of_keys_and_keeps_them() -> None:
    keys = [f"user-{i}" for i in range(4000)]
    arms = [choose(production=1, canary=2, share=0.2, key=k, policy="orders").version for k in keys]
    assert 0.18 < arms.count(2) / len(keys) < 0.22
    again = [choose(production=1, canary=2, share=0.2, key=k, policy="orders").version for k in keys]
    assert again == arms  # sticky
    later = [choose(production=2, canary=3, share=0.2, key=k, policy="orders").version for k in keys]
    first = {k for k, v in zip(keys, arms, strict=True) if v == 2}
    second = {k for k, v in zip(keys, later, strict=True) if v == 3}
    assert len(first & second) < 0.4 * len(first)  # a new canary draws its own users
    assert all(0.0 <= bucket("orders", 2, k) < 1.0 for k in keys[:50])


def test_the_key_is_the_user_when_there_is_one() -> None:
    now = utcnow()
    bare = Session(session_id="s1", trace_id="0" * 32, user_query="q", created_at=now, updated_at=now)
    assert routing_key(bare) == "s1"
    assert routing_key(bare.model_copy(update={"metadata": {"user": "u7"}})) == "u7"
    assert routing_key(bare.model_copy(update={"user_id": "u8", "metadata": {"user": "u7"}})) == "u8"


def test_a_pin_wins_while_its_version_is_not_retired() -> None:
    with SessionStore.open("sqlite://") as store:
        registry = PolicyRegistry(store)
        for artifact in ("a", "b", "c"):
            registry.register("orders", artifact)
        registry.promote("orders", 1, Stage.PRODUCTION)
        router = Router(registry, "orders")
        assert router.route("k", pin=3).arm == Arm.PIN
        registry.retire("orders", 3)
        assert router.route("k", pin=3).arm == Arm.PRODUCTION
        assert router.route("k", pin=99).version == 1


class Versioned:
    """A policy backend that says which version it is."""

    def __init__(self, version: int) -> None:
        self.version = version

    async def generate(self, messages: tuple[Message, ...] | list[Message], *, purpose: str) -> PolicyReply:
        return PolicyReply(
            text=f'{{"tool": "find", "params": {{"v": {self.version}}}}}', policy_version=self.version
        )


def loader(version: PolicyVersion) -> PolicyBackend:
    return Versioned(version.version)


async def test_steps_are_served_by_the_recorded_version_and_rerouted_after_a_rollback(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    with SessionStore.open(url) as store:
        registry = PolicyRegistry(store)
        registry.register("orders", "v1")
        registry.register("orders", "v2")
        registry.promote("orders", 1, Stage.PRODUCTION)
        registry.promote("orders", 2, Stage.CANARY, share=0.5)
    async with serving(make_app(url, OpsConfig(policy="orders"), loader=loader)) as client:
        sids = [f"s{i}" for i in range(12)]
        for sid in sids:
            await client.post("/v1/sessions", json={"user_query": "q", "session_id": sid})
            await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "tool", "payload": {}})
        pinned = {"user_query": "q", "session_id": "pinned", "metadata": {"pin_version": 2}}
        await client.post("/v1/sessions", json=pinned)
        await client.post("/v1/sessions/pinned/steps", json={"kind": "tool", "payload": {}})
        sessions = {sid: (await client.get(f"/v1/sessions/{sid}")).json() for sid in [*sids, "pinned"]}
        for sid, s in sessions.items():
            route = s["metadata"]["route"]
            if sid != "pinned":
                assert route == choose(production=1, canary=2, share=0.5, key=sid, policy="orders").metadata()
            assert s["llm_calls"][0]["policy_version"] == route["version"]
            assert f"orders@v{route['version']}" in s["tags"]
        assert sessions["pinned"]["metadata"]["route"]["arm"] == "pin"
        on_canary = [sid for sid in sids if sessions[sid]["metadata"]["route"]["version"] == 2]
        assert on_canary
        assert (
            await client.post("/v1/policies/orders/rollback", json={"reason": "drill"})
        ).status_code == 200
        await client.post(f"/v1/sessions/{on_canary[0]}/steps", json={"kind": "tool", "payload": {}})
        moved = (await client.get(f"/v1/sessions/{on_canary[0]}")).json()
        assert moved["metadata"]["route"]["version"] == 1
        assert moved["llm_calls"][-1]["policy_version"] == 1


async def test_the_gateway_follows_the_strategy_mode(tmp_path: Path) -> None:
    ops = OpsConfig(policy="orders", plan_templates={"default": (TemplateStep(tool="find"),)})
    app = make_app(f"sqlite:///{tmp_path / 'ops.db'}", ops)
    route_gateway(app, lambda version: ScriptedChat(lambda request: ChatReply(text="from the model")))
    with SessionStore.open(f"sqlite:///{tmp_path / 'ops.db'}") as store:
        PolicyRegistry(store).register("orders", "v1")
        PolicyRegistry(store).promote("orders", 1, Stage.PRODUCTION)
    body = {
        "messages": [{"role": "user", "content": "where is #1?"}],
        "tools": [{"type": "function", "function": {"name": "find"}}],
    }
    async with serving(app) as client:
        served = await client.post("/gateway/sessions/g1/v1/chat/completions", json=body)
        assert served.json()["choices"][0]["message"]["content"] == "from the model"
        await client.put("/v1/policies/strategy", json={"mode": "rules"})
        ruled = await client.post("/gateway/sessions/g2/v1/chat/completions", json=body)
        assert ruled.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "find"
        await client.put("/v1/policies/strategy", json={"mode": "human"})
        parked = await client.post("/gateway/sessions/g3/v1/chat/completions", json=body)
        assert parked.status_code == 503
        assert "needs_human" in parked.json()["error"]["message"]
        waiting = [w["session_id"] for w in (await client.get("/v1/policies/takeover")).json()]
        assert waiting == ["g3"]
