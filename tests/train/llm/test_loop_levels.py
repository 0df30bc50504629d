"""The training loop's level hooks: the gate refuses RL below L1/L2, a run whose rollouts' DVR falls three
iterations running pauses, logs it and writes the diagnostic report, and RL draws tasks by level."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from sessionrl.envs import build
from sessionrl.episodes import Ran
from sessionrl.eval.autopause import REPORT, AutoPause, AutoPauseConfig
from sessionrl.eval.levels import Level, LevelsConfig, assess
from sessionrl.eval.metrics import compute
from sessionrl.session import (
    Feedback,
    FeedbackAdded,
    FeedbackType,
    Plan,
    PlanSet,
    SessionCreate,
    SubGoal,
    ToolCall,
    ToolCallRecorded,
)
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.checkpoint import LoopState
from sessionrl.train.llm.evaluation import Evaluation
from sessionrl.train.llm.loop import curriculum_pool, levels_gate, paused, rl_curriculum, rl_specs
from sessionrl.train.llm.run import MetricsLog


def stored(store: SessionStore, sid: str, *, cyclic: bool, tools: tuple[str, ...] = ("a",)) -> str:
    store.create(
        SessionCreate(user_query="order O-1", session_id=sid, metadata={"expected_entities": ["O-1"]})
    )
    first = SubGoal(id="g0", description="d", depends_on=("g1",) if cyclic else ())
    plan = Plan(root_goal="r", subgoals=(first, SubGoal(id="g1", description="d", depends_on=("g0",))))
    store.append(sid, PlanSet(plan=plan))
    if cyclic:
        rejection = Feedback(type=FeedbackType.PLAN_REJECTION, data={"reason": "cycle"})
        store.append(sid, FeedbackAdded(feedback=rejection))
    for i, tool in enumerate(tools):
        call = ToolCall(call_id=f"{sid}-{i}", tool=tool, params={"id": "O-1"}, status="success")
        store.append(sid, ToolCallRecorded(call=call))
    store.append(sid, FeedbackAdded(feedback=Feedback(type=FeedbackType.TASK_OUTCOME, score=1.0)))
    return sid


def fake_run(tmp_path: Path, store: SessionStore, levels: LevelsConfig | None = None) -> Any:
    config = RunConfig(run_dir=tmp_path, levels=levels or LevelsConfig())
    env = build("orders", train=1, dev=1, test=1, time_factor=0)
    return SimpleNamespace(
        config=config, env=env, store=store, log=MetricsLog(tmp_path), state=LoopState(), folder=tmp_path
    )


def test_rl_pauses_when_rollout_dvr_falls_three_iterations_running(tmp_path: Path) -> None:
    with SessionStore.open("sqlite://") as store:
        run = fake_run(tmp_path, store)
        watch = AutoPause(AutoPauseConfig(metric="dvr", patience=3), tmp_path)
        console = Console(record=True, width=200)
        verdicts = []
        for iteration, bad in enumerate(range(4)):  # DVR 1, 3/4, 2/4, 1/4
            ids = [stored(store, f"i{iteration}-{k}", cyclic=k < bad) for k in range(4)]
            verdicts.append(paused(run, watch, iteration, [Ran(i, True) for i in ids], console))
        run.log.close()
    assert verdicts == [False, False, False, True]
    assert "paused: dvr fell 3 times in a row" in console.export_text()
    report = json.loads((tmp_path / REPORT).read_text())
    assert len(report["plan_faults"]) == 3  # the three cyclic plans of the last iteration
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["paused"]


def test_the_level_gate_needs_l1_and_l2(tmp_path: Path) -> None:
    with SessionStore.open("sqlite://") as store:
        sessions = [store.get(stored(store, "s", cyclic=False, tools=("a", "b", "c")))]
        one_tool = [store.get(stored(store, "t", cyclic=False))]
        run = fake_run(tmp_path, store, LevelsConfig(gate=(Level.L1, Level.L2)))
        assert levels_gate(run, Evaluation("gate", compute(sessions), tuple(sessions)))
        assert not levels_gate(run, Evaluation("gate", compute(one_tool), tuple(one_tool)))  # L1: one tool
        open_gate = fake_run(tmp_path / "open", store)
        assert levels_gate(open_gate, Evaluation("gate", compute(one_tool), tuple(one_tool)))
        run.log.close()
        open_gate.log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["L1"]["passed"] for r in records] == [True, False]


def test_rl_draws_its_tasks_from_the_curriculum(tmp_path: Path) -> None:
    with SessionStore.open("sqlite://") as store:
        run = fake_run(tmp_path, store)
        run.config = RunConfig(run_dir=tmp_path, env={"name": "orders", "train": 24}, rl={"curriculum": True})
        run.env = run.config.env.build()
        curriculum = rl_curriculum(run)
        first = curriculum_pool(run, curriculum, None, 0)  # nothing reached: the easiest level present
        specs = rl_specs(run, 0, first)
        levels = dict(curriculum.tasks)
        assert {levels[s.task] for s in specs} == {Level.L2}
        good = store.get(stored(store, "g", cyclic=False, tools=("a", "b", "c")))
        promoted = curriculum_pool(run, curriculum, assess([good]), 1)  # L2 reached: L3 tasks join
        assert len(promoted) > len(first)
        run.log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["limit"], r["reached"]) for r in records] == [("L1", None), ("L3", "L2")]
