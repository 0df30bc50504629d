"""The main job's configuration: it must hold together before anyone waits minutes to find out it does not."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from sessionrl.cli.demo import command
from sessionrl.eval import compute
from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.session import (
    Feedback,
    FeedbackAdded,
    FeedbackType,
    Session,
    SessionCreate,
    SessionState,
    StateChanged,
    ToolCall,
    ToolCallRecorded,
    created,
    fold,
)
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.demo import RL_ITERATIONS, compare, demo_config, dev_verdicts, final_policy
from sessionrl.train.llm.evaluation import Evaluation


def test_the_demo_config_round_trips_and_leaves_rl_unseen_tasks(tmp_path: Path) -> None:
    config = demo_config(tmp_path / "demo")
    assert RunConfig.model_validate_json(config.model_dump_json()) == config
    assert config.rl.unseen_tasks
    assert config.env.options["train"] > config.sft.demos
    assert config.faults.demo_rate < config.faults.eval_rate  # RL meets more faults than imitation saw
    assert config.evaluation.tasks >= 50
    assert config.evaluation.temperature == 0.0
    assert config.rft is not None
    assert config.rft.accept == "clean"  # a solved episode's wrong calls and non-actions are not imitated
    assert config.rft.trainer.lr < config.sft.trainer.lr
    assert 0 < config.rft.dev_tasks <= config.env.options["dev"]  # every round judged on dev tasks it has
    assert 0 < config.rft.replay < 1  # the rounds replay demonstrations beside the kept episodes
    assert demo_config(tmp_path / "bare", rft_rounds=0).rft is None


def test_the_summary_lists_each_round_and_iteration_the_dev_tasks_judged(tmp_path: Path) -> None:
    lines = [
        {"stage": "rft", "step": 0, "kept": 30},
        {"stage": "rft_dev", "step": 0, "round": 0, "before": 30, "solved": 28, "kept": False},
        {"stage": "rft_dev", "step": 1, "round": 1, "before": 30, "solved": 33, "kept": True},
        {"stage": "rl_dev", "step": 4, "iteration": 4, "before": 33, "solved": 31, "kept": False},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert dev_verdicts(tmp_path, "rft_dev") == [(30, 28, False), (30, 33, True)]
    assert dev_verdicts(tmp_path, "rl_dev") == [(33, 31, False)]


def test_the_demo_rules_load_and_charge_only_the_policys_own_mistakes(tmp_path: Path) -> None:
    rules = demo_config(tmp_path / "demo").rewards.rules
    assert rules is not None
    assert rules.is_file()
    ruleset = RewardEngine(RewardConfig(rules=rules)).source.current()
    by_name = {spec.name: spec for spec in ruleset.file.rules}
    assert set(by_name) == {"policy_error", "not_an_action", "task_outcome"}
    assert "!call.retryable" in by_name["policy_error"].when
    assert set(ruleset.file.terms) == {"recovery"}


def test_the_demo_rules_credit_calling_again_after_an_outage_and_charge_a_bad_call(tmp_path: Path) -> None:
    engine = RewardEngine(RewardConfig(rules=demo_config(tmp_path / "demo").rewards.rules))
    outage = {"status": "error", "error_code": "UNAVAILABLE", "retryable": True}
    bad = {"status": "error", "error_code": "INVALID_PARAMS"}
    calls = [outage, {"status": "success"}, bad, {"status": "success"}]
    events: list[Any] = [created(SessionCreate(user_query="q", metadata={"task_id": "q"}))]
    for i, fields in enumerate(calls):
        events.append(ToolCallRecorded(call=ToolCall(call_id=f"c{i}", tool="t", params={}, **fields)))
    steps = engine.score(fold(events)).step_rewards
    assert steps.get("c0", 0.0) == 0.0  # the outage is not the policy's doing
    assert steps["c1"] == 1.0  # called again, and it went through
    assert steps["c2"] == -1.0  # its own bad parameters
    assert steps.get("c3", 0.0) == 0.0  # after its own mistake, calling again is no recovery


def _session(task: str, solved: bool, statuses: list[str]) -> Session:
    events: list[Any] = [created(SessionCreate(user_query=task, metadata={"task_id": task}))]
    events.append(StateChanged(state=SessionState.EXECUTING))
    for i, status in enumerate(statuses):
        events.append(ToolCallRecorded(call=ToolCall(call_id=f"c{i}", tool="t", params={}, status=status)))
    events.append(FeedbackAdded(feedback=Feedback(type=FeedbackType.TASK_OUTCOME, score=float(solved))))
    return fold(events)


def _evaluation(label: str, sessions: list[Session]) -> Evaluation:
    return Evaluation(label, compute(sessions), tuple(sessions))


def test_the_demo_budgets_rl_in_iterations_and_a_seed_moves_everything_but_the_tasks(tmp_path: Path) -> None:
    one, two = demo_config(tmp_path / "a", seed=1), demo_config(tmp_path / "b", seed=2)
    assert one.rl.minutes is None
    assert one.rl.iterations == RL_ITERATIONS
    assert (one.seed, one.model.tiny.seed, one.rl.sampling.seed) == (1, 1, 1)
    assert two.seed == two.model.tiny.seed == 2
    assert one.env == two.env  # the same tasks, so every seed is judged on the same held-out tickets


def test_the_comparison_pairs_tasks_and_pools_tool_calls() -> None:
    ok, bad = "success", "error"
    sft = [_session("a", False, [ok, bad]), _session("b", False, [bad]), _session("c", True, [ok])]
    rl = [_session("a", True, [ok, ok]), _session("b", True, [ok]), _session("c", True, [ok])]
    comparison = compare(_evaluation("sft", sft), _evaluation("rl", rl))
    assert (comparison.success.first_only, comparison.success.second_only) == (0, 2)
    assert comparison.success.p_value == pytest.approx(0.5)  # 2 of 2 discordant tasks: 2 x (1/2)^2
    assert comparison.success.delta.estimate == pytest.approx(2 / 3)
    assert comparison.tcsr.estimate == pytest.approx(1.0 - 2 / 4)  # calls pooled: 2 of 4 -> 4 of 4
    assert "McNemar p = 0.5" in comparison.describe()


def test_the_demo_reports_the_last_policy_the_run_made() -> None:
    sessions = [_session("a", True, ["success"])]
    sft, rft, rl = (_evaluation(label, sessions) for label in ("sft", "rft", "rl"))
    assert final_policy({"sft": sft, "rft": rft, "rl": rl}) is rl
    assert final_policy({"sft": sft, "rft": rft}) is rft
    assert final_policy({"sft": sft}) is sft


def test_the_cli_default_budget_is_the_demos() -> None:
    assert inspect.signature(command).parameters["rl_iterations"].default == RL_ITERATIONS


def test_the_demo_runs_on_the_thread_count_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from sessionrl.cli import app
    from sessionrl.train.llm import demo
    from sessionrl.train.threads import torch_threads

    counts: list[int] = []
    monkeypatch.setattr(demo, "main", lambda *_, **__: counts.append(torch.get_num_threads()))
    with torch_threads(torch.get_num_threads()):
        for threads in ("1", "2"):
            result = CliRunner().invoke(app, ["demo", "--threads", threads])
            assert result.exit_code == 0, result.output
    assert counts == [1, 2]
