"""Operations end to end on `orders`: v1 serves sessions through the gateway; feedback arrives late; the
loop attributes the failures, trains v2 (a tiny SFT run) and starts it as a 20% canary; the canary check
promotes it when it is better; a deliberately broken v3 is canaried and rolled back automatically with an
alert. Every routing decision is checked against the sessions the store recorded.

What each version answers is scripted (`VersionChat`: v1 solves about 70% of tasks, v2 about 95%, the
broken v3 about 10%), so the test is about operations, not about what a tiny model learns in seconds; the
training the loop runs, its gate, lineage and registration are real.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from ops_support import make_app, serving, webhook

from sessionrl.envs.base import Split, Task
from sessionrl.envs.orders import DomainConfig, OrdersEnv
from sessionrl.gateway import ChatReply, ChatRequest
from sessionrl.ops.config import CanaryConfig, OpsConfig
from sessionrl.ops.loop import Loop, LoopConfig
from sessionrl.ops.registry import Lineage, PolicyRegistry, Stage
from sessionrl.ops.routing import ROUTE_KEY, choose
from sessionrl.ops.serving import Operations, load_hf_policy, route_gateway
from sessionrl.session.model import Message, ToolRequest
from sessionrl.store import SessionStore
from tiny_run_support import SFT_SECTION, tiny_run

ENV = OrdersEnv(DomainConfig(train=16, dev=4, test=24))
TASKS = [*ENV.tasks(Split.TEST), *ENV.tasks(Split.DEV)]
BY_QUERY = {t.instruction: t for t in TASKS}
QUALITY = {1: 0.7, 2: 0.95, 3: 0.1}
"""Share of tasks each version's answers solve."""
TINY_SFT = tiny_run(
    trainer="sft",
    env={"name": "orders"},
    rollout={"full_schemas": False, "domain_policy": False},
    sft=SFT_SECTION | {"demos": 4},
    evaluation={"tasks": 1, "gate_tasks": 1, "max_new_tokens": 8},
)
OPS = OpsConfig(
    policy="orders",
    canary=CanaryConfig(
        share=0.2,
        min_sessions=6,
        rollback_when="success_drop > 0.2 or tcsr_drop > 0.005 or dvr_drop > 0.02",
        promote_when="success_gain > 0 and tcsr_gain >= 0",
    ),
)


def solves(version: int, session_id: str) -> bool:
    draw = int.from_bytes(hashlib.sha256(f"{version}:{session_id}".encode()).digest()[:8], "big") / 2.0**64
    return draw < QUALITY[version]


class VersionChat:
    """One version of the orders agent's model: the task's first expert tool call, then its answer
    (right for `QUALITY[version]` of the sessions)."""

    def __init__(self, version: int) -> None:
        self.version = version

    async def complete(self, request: ChatRequest, session_id: str) -> ChatReply:
        task = BY_QUERY[next(m.text for m in request.messages if m.role == "user")]
        plan = ENV.expert(task)
        model = f"orders-v{self.version}"
        if not any(m.role == "tool" for m in request.messages):
            step = plan.steps[0]
            call = ToolRequest(
                id=f"call-{session_id}", name=step.tool, arguments=orjson.dumps(step.params).decode()
            )
            return ChatReply(tool_calls=(call,), model=model)
        text = plan.final_message if solves(self.version, session_id) else "Sorry, I could not sort this out."
        return ChatReply(text=text, model=model)

    async def models(self) -> list[str]:
        return [f"orders-v{self.version}"]


async def serve(client: httpx.AsyncClient, sid: str, task: Task) -> str:
    """One session through the gateway: a tool call, its result, the answer, which finishes the session
    (the gateway's `finish_on_answer`)."""
    base = f"/gateway/sessions/{sid}/v1/chat/completions"
    tool = ENV.expert(task).steps[0].tool
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.instruction}]
    body = {
        "model": "orders",
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": tool}}],
    }
    first = await client.post(base, json=body)
    assert first.status_code == 200, first.text
    asked = first.json()["choices"][0]["message"]
    messages += [
        asked,
        {"role": "tool", "tool_call_id": asked["tool_calls"][0]["id"], "content": '{"ok": true}'},
    ]
    second = await client.post(base, json=body | {"messages": messages})
    text = str(second.json()["choices"][0]["message"]["content"])
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    assert (session["state"], session["metadata"]["finished_by"]) == ("finished", "final_answer"), session
    return text


async def traffic(client: httpx.AsyncClient, prefix: str, n: int) -> dict[str, tuple[Task, str]]:
    served = {}
    for i in range(n):
        sid, task = f"{prefix}-{i:03d}", TASKS[i % len(TASKS)]
        served[sid] = (task, await serve(client, sid, task))
    return served


async def late_feedback(client: httpx.AsyncClient, served: dict[str, tuple[Task, str]]) -> None:
    """The verdicts, arriving after every session of the batch has ended."""
    for sid, (task, text) in served.items():
        score = 1.0 if text == ENV.expert(task).final_message else 0.0
        answer = await client.post(
            f"/v1/sessions/{sid}/feedback", json={"type": "task_outcome", "score": score}
        )
        assert answer.status_code == 201, answer.text


def check_routes(
    store: SessionStore, sids: list[str], production: int, canary: int | None, share: float
) -> dict[int, int]:
    """Every session's recorded route is the one routing gives its key, and its model calls came from that
    version; returns how many sessions each version served."""
    counts: dict[int, int] = {}
    for sid in sids:
        session = store.get(sid)
        expected = choose(production=production, canary=canary, share=share, key=sid, policy="orders")
        assert session.metadata[ROUTE_KEY] == expected.metadata(), sid
        assert {c.model for c in session.llm_calls} == {f"orders-v{expected.version}"}, sid
        assert expected.version is not None
        counts[expected.version] = counts.get(expected.version, 0) + 1
    return counts


@pytest.mark.slow
async def test_the_loop_canaries_a_better_version_and_a_broken_one_is_rolled_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    train = tmp_path / "sft.yaml"
    train.write_text(yaml.safe_dump(TINY_SFT | {"run_dir": str(tmp_path / "unused")}))
    with webhook() as hook, SessionStore.open(url) as store:
        ops = OPS.model_copy(update={"webhook_url": hook.url})
        registry = PolicyRegistry(store)
        registry.register("orders", "scripted:v1", lineage=Lineage(note="the first release"))
        registry.promote("orders", 1, Stage.PRODUCTION, reason="first release")
        loop = Loop(
            LoopConfig(db=url, ops=ops, train=train, runs_dir=tmp_path / "loop", min_sessions=10, sample=8),
            store,
        )
        operations = Operations(ops)
        app = make_app(url, ops, operations=operations)
        route_gateway(app, lambda version: VersionChat(version.version))
        async with serving(app) as client:
            # 1. v1 serves everything; 2. the verdicts come late
            first = await traffic(client, "a", 20)
            assert check_routes(store, list(first), 1, None, 0.0) == {1: 20}
            await late_feedback(client, first)

            # 3. the loop sees 'wrong_answer' past its threshold, trains v2 and starts a 20% canary
            cycle = await asyncio.to_thread(loop.run_cycle)
            assert cycle.decision == "canary_started", cycle
            assert cycle.shares["wrong_answer"] > 0.05
            v2 = registry.get("orders", 2)
            assert (v2.stage, v2.share, v2.lineage.parent, v2.lineage.trainer) == (
                Stage.CANARY,
                0.2,
                1,
                "sft",
            )
            assert Path(v2.artifact, "model.safetensors").exists()
            trained = load_hf_policy(v2)  # what `sessionrl serve --ops` would load for it
            reply = await trained.generate(
                [Message(role="user", content=TASKS[0].instruction)], purpose="chat"
            )
            assert reply.token_ids
            assert v2.lineage.data_cursor == cycle.cursor
            assert "success" in v2.evaluation

            # 4. traffic splits by key; feedback; the check promotes v2
            second = await traffic(client, "b", 60)
            counts = check_routes(store, list(second), 1, 2, 0.2)
            assert counts[2] >= 6
            await late_feedback(client, second)
            cycle = await asyncio.to_thread(loop.run_cycle)
            assert cycle.decision == "canary_promote", cycle
            assert registry.production("orders") == registry.get("orders", 2)

            # 5. a broken v3 (trained on corrupted demonstrations) is canaried and rolled back; its weights
            # stand in as a copy of v2's (registering loads them; VersionChat plays its answers)
            shutil.copytree(v2.artifact, tmp_path / "corrupted")
            promoted = await client.post(
                "/v1/policies/orders/versions",
                json={
                    "artifact": str(tmp_path / "corrupted"),
                    "lineage": {"note": "adapter trained on corrupted demonstrations", "parent": 2},
                },
            )
            assert promoted.status_code == 201, promoted.text
            canary = await client.post(
                "/v1/policies/orders/versions/3/promote", json={"to": "canary", "share": 0.2}
            )
            assert canary.json()["stage"] == "canary"
            third = await traffic(client, "c", 60)
            counts = check_routes(store, list(third), 2, 3, 0.2)
            await late_feedback(client, third)
            cycle = await asyncio.to_thread(loop.run_cycle)
            assert cycle.decision == "canary_rollback", cycle
            assert cycle.detail["judged_canary"] == counts[3]
            assert registry.get("orders", 3).stage is Stage.RETIRED
            after = await traffic(client, "d", 10)  # routing to v3 has stopped
            assert check_routes(store, list(after), 2, None, 0.0) == {2: 10}
        (alert,) = hook.received
        log = [(e.kind, e.detail.get("decision")) for e in registry.log(kind="loop")]
    assert alert["event"] == "canary_rolled_back"
    assert (alert["canary"], alert["judged_canary"]) == (3, counts[3])
    decisions = [d for _, d in log]
    assert decisions == ["train", "canary_started", "canary_promote", "canary_rollback"]
