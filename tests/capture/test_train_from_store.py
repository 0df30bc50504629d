"""`sessionrl train` with `sft.data: store`: captured sessions (here, an OpenAI agent's, through the
gateway) imitated after the integrity check, each dropped session reported with its reason, and GRPO
replaying the tasks the captured sessions name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from openai import OpenAI
from pydantic import ValidationError

from example_agents_support import load_example
from sessionrl.envs.base import Split
from sessionrl.envs.registry import build
from sessionrl.service import ServiceConfig, create_app, parse_tokens
from sessionrl.session import SessionCreate, created
from sessionrl.session.events import LLMCallRecorded
from sessionrl.session.model import CallStatus, LLMCall, Message
from sessionrl.store import SessionQuery, SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.loop import train, train_sft
from tiny_run_support import tiny_run

TINY = tiny_run(trainer="sft")


def captured_store(tmp_path: Path) -> str:
    """Three orders sessions of the example agent through the gateway, on training tasks of the run's
    environment which their metadata names, and one session whose only call failed (naming no task)."""
    agent, demo = load_example("openai_agent"), load_example("gateway_demo")
    desk = demo.OrdersDesk(n_tasks=3, split=Split.TRAIN, env=build("orders", **TINY["env"]))
    url = f"sqlite:///{tmp_path / 'captured.db'}"
    config = ServiceConfig(db_url=url, tokens=parse_tokens("tok:read,write"))
    with demo.serving(create_app(config, skills=[], chat=desk.backend())) as root:
        for task in desk.tasks:
            _, call_tool = desk.episode(task)
            client = OpenAI(
                base_url=f"{root}/gateway/sessions/{task.task_id}/v1", api_key="tok", max_retries=0
            )
            agent.run_agent(client, task.instruction, desk.tools, call_tool, metadata=desk.metadata(task))
    with SessionStore.open(url) as store:
        store.append("broken", created(SessionCreate(user_query="q", session_id="broken", tags=("gateway",))))
        failed = LLMCall(
            call_id="x",
            messages=(Message(role="user", content="q"),),
            status=CallStatus.ERROR,
            error_message="503",
        )
        store.append("broken", LLMCallRecorded(call=failed))
    return url


def test_a_store_source_needs_data_store_and_the_other_way_round() -> None:
    with pytest.raises(ValidationError, match="go together"):
        RunConfig.model_validate({**TINY, "sft": {"data": "store"}})
    with pytest.raises(ValidationError, match="go together"):
        RunConfig.model_validate({**TINY, "sft": {"store": {"db": "sqlite:///x.db"}}})


def test_sft_trains_on_captured_sessions_and_reports_the_dropped(tmp_path: Path, capsys: Any) -> None:
    url = captured_store(tmp_path)
    sft = {
        "data": "store",
        "store": {"db": url, "filters": {"tags": ["gateway"]}},
        "trainer": {"steps": 2, "batch_sessions": 2, "token_budget": 2048},
    }
    config = RunConfig.model_validate({**TINY, "run_dir": str(tmp_path / "run"), "sft": sft})
    train_sft(config)
    assert (tmp_path / "run" / "sft_policy" / "config.json").is_file()
    records = [orjson.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_bytes().splitlines()]
    (captured,) = [r for r in records if r["stage"] == "captured"]
    assert (captured["kept"], captured["dropped"]) == (3, 1)
    assert "dropped captured session broken: no successful model call" in capsys.readouterr().out


def test_grpo_replays_the_tasks_the_captured_sessions_name(tmp_path: Path, capsys: Any) -> None:
    url = captured_store(tmp_path)
    with SessionStore.open(url) as store:
        captured = {store.get(r.session_id).metadata.get("task_id") for r in store.query(SessionQuery())}
    captured.discard(None)
    sft = {
        "data": "store",
        "store": {"db": url, "filters": {"tags": ["gateway"]}},
        "trainer": {"steps": 1, "batch_sessions": 2, "token_budget": 2048},
    }
    rl = {
        "iterations": 1,
        "tasks_per_iteration": 2,
        "sampling": {"max_new_tokens": 8},
        "trainer": {"group_size": 2, "token_budget": 2048},
    }
    evaluation = {**TINY["evaluation"], "gate_min_success": 0.0}
    run = {**TINY, "trainer": "grpo", "evaluation": evaluation, "run_dir": str(tmp_path / "run")}
    train(RunConfig.model_validate({**run, "sft": sft, "rl": rl}))
    records = [orjson.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_bytes().splitlines()]
    (replay,) = [r for r in records if r["stage"] == "replay"]
    assert (replay["tasks"], replay["skipped"]) == (3, 1)
    assert "not replayed: captured session broken: its metadata names no task_id" in capsys.readouterr().out
    with SessionStore.open(f"sqlite:///{tmp_path / 'run' / 'sessions.db'}") as store:
        rows = store.query(SessionQuery(limit=1000))
        replayed = [store.get(r.session_id) for r in rows if r.session_id.startswith("rl-")]
    assert len(replayed) == 4  # two of the captured tasks, twice each (a group)
    assert {s.session_id.rsplit("-", 1)[0].removeprefix("rl-0000-") for s in replayed} <= captured
