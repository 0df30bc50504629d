"""The strategy switch and human takeover, through the service: a switch takes effect on the next step of
every running session; a parked session survives a restart and resumes, with no event lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from ops_support import make_app, serving, webhook

from sessionrl.ops.config import OpsConfig, TemplateStep
from sessionrl.ops.registry import PolicyRegistry
from sessionrl.ops.takeover import NEEDS_HUMAN
from sessionrl.orchestrator.policy import ScriptedBackend
from sessionrl.store import SessionStore

PLAN = {
    "root_goal": "refund the order",
    "subgoals": [
        {"id": "a", "description": "find the order", "tool": "find"},
        {"id": "b", "description": "refund it", "tool": "refund", "depends_on": ["a"]},
    ],
}
OPS = OpsConfig(
    policy="support",
    plan_templates={"support": (TemplateStep(tool="find"), TemplateStep(tool="refund"))},
)
FIND = '{"tool": "find", "params": {}, "subgoal_id": "a"}'


async def open_planned(client: httpx.AsyncClient, sid: str) -> None:
    created = await client.post(
        "/v1/sessions", json={"user_query": "refund #1", "session_id": sid, "scenario": "support"}
    )
    assert created.status_code == 201, created.text
    planned = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "plan", "payload": {"plan": PLAN}})
    assert planned.json()["ok"], planned.text


async def policy_step(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """A tool step the server's strategy decides (no tool named)."""
    answer = await client.post(f"/v1/sessions/{sid}/steps", json={"kind": "tool", "payload": {}})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def session(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    return dict((await client.get(f"/v1/sessions/{sid}")).json())


async def test_a_switch_takes_effect_on_the_next_step_of_every_running_session(tmp_path: Path) -> None:
    sids = ["s1", "s2", "s3"]
    policy = ScriptedBackend([FIND] * len(sids), policy_version=7)
    app = make_app(f"sqlite:///{tmp_path / 'ops.db'}", OPS, backends=[policy])
    async with serving(app) as client:
        for sid in sids:
            await open_planned(client, sid)
            assert (await policy_step(client, sid))["ok"]  # the policy served the first step
        assert len(policy.calls) == 3
        switched = await client.put("/v1/policies/strategy", json={"mode": "rules", "reason": "drill"})
        assert switched.json() == {"mode": "rules"}
        for sid in sids:
            assert (await policy_step(client, sid))["ok"]
            s = await session(client, sid)
            first, second = s["llm_calls"]
            assert first["policy_version"] == 7
            assert second["policy_version"] is None
            assert '"tool":"refund"' in second["response"]  # the template's next step, not the policy's
            assert [c["tool"] for c in s["tool_calls"]] == ["find", "refund"]
        assert len(policy.calls) == 3  # the policy was not asked again
        back = await client.put("/v1/policies/strategy", json={"mode": "policy"})
        assert back.json() == {"mode": "policy"}


async def test_a_parked_session_resumes_after_a_restart_without_losing_an_event(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    with webhook() as hook:
        ops = OPS.model_copy(update={"webhook_url": hook.url})
        policy = ScriptedBackend([FIND])
        async with serving(make_app(url, ops, backends=[policy])) as client:
            await open_planned(client, "s1")
            assert (await policy_step(client, "s1"))["ok"]
            await client.put("/v1/policies/strategy", json={"mode": "human"})
            parked = await policy_step(client, "s1")
            assert not parked["ok"]
            assert parked["error_code"] == "POLICY_ERROR"
            assert "needs_human" in parked["error_message"]
            again = await policy_step(client, "s1")  # still parked: no second alert
            assert not again["ok"]
            before = await session(client, "s1")
            assert NEEDS_HUMAN in before["tags"]
        assert [a["event"] for a in hook.received] == ["needs_human"]
        assert hook.received[0]["trace_id"] == before["trace_id"]
        with SessionStore.open(url) as store:
            events_before = [e.event_id for e in store.events("s1")]

        # a new service process over the same store
        async with serving(make_app(url, ops, backends=[ScriptedBackend([])])) as client:
            waiting = (await client.get("/v1/policies/takeover")).json()
            assert [(w["session_id"], w["trace_id"]) for w in waiting] == [("s1", before["trace_id"])]
            step = {"kind": "tool", "tool": "refund", "subgoal_id": "b"}
            resumed = await client.post("/v1/policies/takeover/s1/steps", json={"step": step, "by": "ana"})
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["ok"]
            after = await session(client, "s1")
            assert NEEDS_HUMAN not in after["tags"]
            assert after["metadata"]["takeover"]["resumed_by"] == "ana"
            assert [c["tool"] for c in after["tool_calls"]] == ["find", "refund"]
            refused = await client.post("/v1/policies/takeover/s1/steps", json={"step": step})
            assert refused.status_code == 409  # no longer parked
            finished = await client.post("/v1/sessions/s1/finish", json={"text": "refunded"})
            assert finished.status_code == 200, finished.text
    with SessionStore.open(url) as store:
        events_after = [e.event_id for e in store.events("s1")]
        log = PolicyRegistry(store).log()
    assert events_after[: len(events_before)] == events_before  # nothing written before the restart was lost
    assert len(events_after) > len(events_before)
    assert [e.kind for e in log if e.kind in ("alert", "resumed")] == ["alert", "resumed"]
    assert log[-1].detail["trace_id"] == before["trace_id"]
