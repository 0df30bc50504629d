"""The loop's decisions with a stand-in trainer: too few sessions, below the threshold, a class past it
trains on a sample of that class, a failed gate registers nothing, and a restarted loop reads the feed on
from its cursor."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops_support import served

from sessionrl.eval.metrics import AgentMetrics
from sessionrl.ops.config import OpsConfig
from sessionrl.ops.loop import Loop, LoopConfig, class_shares
from sessionrl.ops.registry import PolicyRegistry, Stage
from sessionrl.session import StateChanged
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig


@dataclass
class Evaluated:
    metrics: AgentMetrics


@dataclass
class Result:
    report: dict[str, Evaluated]


class FakeTrainer:
    """Records the configs it was given and reports the success it was told to."""

    def __init__(self, success: float) -> None:
        self.success = success
        self.configs: list[RunConfig] = []

    def __call__(self, config: RunConfig) -> Any:
        self.configs.append(config)
        metrics = AgentMetrics(1, 1, self.success, {}, 1.0, None, None, 2.0)
        return Result({"sft": Evaluated(metrics)})


@pytest.fixture
def config(tmp_path: Path) -> LoopConfig:
    train = tmp_path / "sft.yaml"
    train.write_text(yaml.safe_dump({"trainer": "sft", "run_dir": str(tmp_path / "unused")}))
    return LoopConfig(
        db="sqlite://",
        ops=OpsConfig(policy="orders"),
        train=train,
        runs_dir=tmp_path / "loop",
        threshold=0.3,
        min_sessions=4,
        sample=2,
        min_success=0.5,
    )


def production(store: SessionStore) -> PolicyRegistry:
    registry = PolicyRegistry(store)
    registry.register("orders", "v1")
    registry.promote("orders", 1, Stage.PRODUCTION)
    return registry


def finish(store: SessionStore, sid: str, version: int, *, solved: bool) -> None:
    served(store, sid, version, calls=[True], solved=solved, task=sid)
    store.append(sid, StateChanged(state="finished"))


def test_the_loop_waits_then_trains_on_the_class_past_its_threshold(config: LoopConfig) -> None:
    with SessionStore.open("sqlite://") as store:
        registry = production(store)
        trainer = FakeTrainer(success=0.9)
        loop = Loop(config, store, trainer=trainer)
        for i in range(3):
            finish(store, f"s{i}", 1, solved=True)
        assert loop.run_cycle().decision == "too_few_sessions"
        finish(store, "s3", 1, solved=True)
        below = loop.run_cycle()
        assert (below.decision, below.changed, below.shares) == ("below_threshold", 1, {})
        for i in range(4, 8):
            finish(store, f"s{i}", 1, solved=False)  # half of the eight now answer wrongly
        cycle = loop.run_cycle()
        assert cycle.decision == "canary_started"
        assert cycle.shares == {"wrong_answer": 0.5}
        assert cycle.rescored == 4
        (run,) = trainer.configs
        sample = json.loads((run.run_dir / "sample.json").read_text())
        assert sample["class"] == "wrong_answer"
        assert len(sample["sessions"]) == 2
        assert set(sample["sessions"]) <= {f"s{i}" for i in range(4, 8)}
        v2 = registry.get("orders", 2)
        assert (v2.stage, v2.share, v2.lineage.parent, v2.lineage.data_cursor) == (
            Stage.CANARY,
            0.05,
            1,
            cycle.cursor,
        )
        assert v2.artifact.endswith("sft_policy")
        assert loop.run_cycle().decision == "canary_wait"  # one release at a time


def test_a_failed_gate_registers_nothing_and_a_new_loop_reads_on(config: LoopConfig) -> None:
    with SessionStore.open("sqlite://") as store:
        registry = production(store)
        for i in range(4):
            finish(store, f"s{i}", 1, solved=i == 0)
        cycle = Loop(config, store, trainer=FakeTrainer(success=0.1)).run_cycle()
        assert (cycle.decision, cycle.detail["success"]) == ("gate_failed", 0.1)
        assert [v.version for v in registry.versions("orders")] == [1]
        again = Loop(config, store, trainer=FakeTrainer(success=0.1)).run_cycle()
        assert (again.changed, again.rescored) == (0, 0)  # the cursor was kept in the store
        assert again.decision == "no_changes"  # no retraining on the data that failed the gate
        finish(store, "s4", 1, solved=False)
        assert Loop(config, store, trainer=FakeTrainer(success=0.1)).run_cycle().changed == 1
        decisions = [e.detail["decision"] for e in registry.log(kind="loop")]
    assert decisions == [
        "train",
        "gate_failed",
        "no_changes",
        "train",
        "gate_failed",
    ]


def test_class_shares_count_sessions_not_calls() -> None:
    with SessionStore.open("sqlite://") as store:
        served(store, "a", 1, calls=[False, False, False], solved=False, task="t")
        served(store, "b", 1, calls=[True], solved=True, task="t")
        sessions = [store.get("a"), store.get("b")]
    assert class_shares(sessions) == {"tool_error": 0.5}
