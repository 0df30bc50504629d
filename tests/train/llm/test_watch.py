"""The collapse guard in the loop: it keeps the last healthy weights on disk and rolls back to them; a real
collapse (GRPO at an absurd learning rate) stops RL, rolls back to the imitation policy, says so on the
console and in metrics.jsonl, and a resumed run neither trains further nor loses the gate's verdict."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from sessionrl.eval.autopause import REPORT
from sessionrl.eval.collapse import CollapseConfig, Health
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.checkpoint import Stage
from sessionrl.train.llm.loop import gate_verdict, train
from sessionrl.train.llm.run import MetricsLog, Run
from sessionrl.train.llm.watch import GOOD, UNDONE, Guard, warn_blind, warn_unsettled
from tiny_run_support import tiny_run


def test_the_guard_keeps_the_weights_that_played_a_healthy_iteration(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    guard = Guard(CollapseConfig(patience=2), model, tmp_path, curve=())
    assert (tmp_path / GOOD).is_file()  # the weights RL starts from: the imitation policy
    played = []
    for iteration, record in enumerate(
        [{"success": 0.5}, {"success": 0.4}, {"success": 0.1}, {"success": 0.0, "approx_kl": 2.0}]
    ):
        played.append(model.weight.detach().clone())  # these weights play the iteration's rollouts
        with torch.no_grad():
            model.weight.add_(1.0)  # then the iteration's update; the loop judges after it
        verdict = guard.judge(iteration, [], record)
    # 0.5 is the baseline; 0.4 is healthy; 0.1 and 0.0 fall under 0.5 x 0.5: two in a row collapse
    assert verdict.collapsed
    assert verdict.problems == ("rollout success 0.00 < 0.5 x imitation's 0.50", "KL 2 > 1")
    assert guard.roll_back() == 1
    assert torch.equal(model.weight, played[1])
    assert not torch.equal(played[1], played[0])


def test_a_resumed_guard_rebuilds_its_watch_from_the_curve(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    curve = [{"iteration": 0, "success": 0.5, "unparseable": 0.0}, {"iteration": 1, "success": 0.1}]
    guard = Guard(CollapseConfig(patience=2), model, tmp_path, curve)
    assert guard.watch.baseline is not None
    assert guard.watch.baseline.success == 0.5
    assert guard.watch.last_good == 0
    assert len(guard.watch.streak) == 1
    assert guard.judge(2, [], {"success": 0.0}).collapsed


def test_an_undo_ends_the_streak_live_and_when_a_resumed_guard_rebuilds_it(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    guard = Guard(CollapseConfig(patience=2), model, tmp_path, curve=())
    guard.judge(0, [], {"success": 0.5})
    assert guard.judge(1, [], {"success": 0.1}).problems  # unhealthy, played by weights then undone:
    kept = {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}
    guard.undone(kept)
    assert guard.pending is kept
    assert not guard.judge(2, [], {"success": 0.1}).collapsed  # one in a row: the restored weights'
    assert guard.judge(3, [], {"success": 0.1}).collapsed

    base = {"iteration": 0, "success": 0.5, "unparseable": 0.0}
    undone = [base, {"iteration": 1, "success": 0.1, UNDONE: True}, {"iteration": 2, "success": 0.1}]
    resumed = Guard(CollapseConfig(patience=2), model, tmp_path, undone)
    assert [v.iteration for v in resumed.watch.streak] == [2]
    assert resumed.watch.last_good == 0
    kept_on = [base, {"iteration": 1, "success": 0.1}, {"iteration": 2, "success": 0.1}]
    assert len(Guard(CollapseConfig(patience=3), model, tmp_path, kept_on).watch.streak) == 2


GATE_PASSED = "gate: the imitation policy's success on 2 dev tasks is 0.000 (bar 0); passed: GRPO starts"


def test_the_gate_s_verdict_names_the_stages_that_follow_it() -> None:
    rft_only = RunConfig.model_validate(tiny_run(rft={"rounds": 1}, rl={"iterations": 0}))
    assert gate_verdict(rft_only, 0.2, True).endswith("passed: rejection sampling starts")
    both = RunConfig.model_validate(tiny_run(rft={"rounds": 1}))
    assert gate_verdict(both, 0.0, False).endswith(
        "not passed: rejection sampling then GRPO does not start (sft_policy/ is kept)"
    )
    assert gate_verdict(RunConfig.model_validate(tiny_run()), None, True).endswith("passed: GRPO starts")
    staged = {"stages": ["imitation", "rl", "reflection"], "rl": {"iterations": 0}}
    reflects = RunConfig.model_validate(tiny_run(**staged))
    assert gate_verdict(reflects, 0.0, True).endswith("passed: reflection starts")
    nothing = RunConfig.model_validate(tiny_run(rl={"iterations": 0}))
    assert gate_verdict(nothing, 0.0, True).endswith("passed: the evaluation starts")


DESTRUCTIVE: dict[str, Any] = {
    # imitation long enough that most replies parse; then GRPO at a learning rate 100 times the examples'
    "model": {"tiny": {"hidden_size": 64, "intermediate_size": 128}},
    "rollout": {"max_steps": 4, "full_schemas": False, "domain_policy": False},
    "sft": {"demos": 16, "trainer": {"steps": 120, "batch_sessions": 4, "lr": 0.01, "token_budget": 4096}},
    "rl": {
        "iterations": 6,
        "tasks_per_iteration": 2,
        "sampling": {"max_new_tokens": 32},
        "trainer": {"group_size": 2, "lr": 0.05, "token_budget": 4096},
    },
    "evaluation": {"max_new_tokens": 32},
}


@pytest.mark.slow
def test_a_collapsing_run_stops_rolled_back_and_says_so(tmp_path: Path) -> None:
    config = RunConfig.model_validate(tiny_run(run_dir=str(tmp_path / "run"), **DESTRUCTIVE))
    console = Console(record=True, width=400)
    result = train(config, console=console)
    said = console.export_text()
    assert result.stage is Stage.PAUSED
    assert 0 < len(result.curve) < 6  # stopped early
    assert GATE_PASSED in said
    assert said.index("gate:") < said.index("collapse:")
    folder = config.run_dir
    logged = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    (collapse,) = [r for r in logged if r["stage"] == "collapse"]
    assert f"collapse: RL stopped at iteration {collapse['step'] + 1}:" in said  # counted from 1
    assert "rolled back to the imitation policy's weights, the last healthy" in said
    assert collapse["rolled_back_to"] == 0
    assert "unparseable" in collapse["reason"]
    assert all("unparseable" in r for r in logged if r["stage"] == "rl")
    assert json.loads((folder / REPORT).read_text())["reason"] == collapse["reason"]
    sft, rl = (load_file(str(folder / f"{p}_policy" / "model.safetensors")) for p in ("sft", "rl"))
    assert all(torch.equal(sft[k], rl[k]) for k in sft)  # rolled back to what RL started from
    assert result.report["rl"].metrics.success == result.report["sft"].metrics.success

    again = Console(record=True, width=400)
    resumed = train(config, resume=True, console=again)
    assert resumed.stage is Stage.PAUSED
    assert resumed.curve == result.curve  # no further RL iteration
    assert GATE_PASSED in again.export_text()


def test_a_rollback_refuses_weights_that_lack_some_the_model_trains(tmp_path: Path) -> None:
    Guard(CollapseConfig(), torch.nn.Linear(2, 1), tmp_path, curve=())  # writes weight and bias
    other = Guard(CollapseConfig(), torch.nn.Sequential(torch.nn.Linear(2, 1)), tmp_path, curve=())
    with pytest.raises(ValueError, match="lacks 2 trained weights"):
        other.roll_back()


def test_rl_that_ends_on_too_few_unhealthy_iterations_says_so(tmp_path: Path) -> None:
    """Three iterations with patience 3 cannot call a collapse; the two that fell are still reported."""
    model = torch.nn.Linear(2, 1)
    guard = Guard(CollapseConfig(patience=3), model, tmp_path, curve=())
    run = SimpleNamespace(log=MetricsLog(tmp_path), state=SimpleNamespace(step=3))
    console = Console(record=True, width=300)
    guard.judge(0, [], {"success": 0.25})
    assert warn_unsettled(cast(Run, run), guard, console) is None  # healthy so far: nothing to say
    for iteration, success in ((1, 0.0), (2, 0.0)):
        assert not guard.judge(iteration, [], {"success": success}).collapsed
    message = warn_unsettled(cast(Run, run), guard, console)
    assert message is not None
    assert "iterations 2-3: rollout success 0.00 < 0.5 x imitation's 0.25" in message  # from 1
    assert "the imitation policy's weights, the last judged healthy, are in good_policy" in message
    assert "warning:" in console.export_text()
    undone = warn_unsettled(cast(Run, run), guard, console, "the weights dev validation kept")
    assert undone is not None
    assert "rl_policy/ holds the weights dev validation kept;" in undone
    run.log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["unsettled", "unsettled"]
    assert records[0]["last_good"] == 0


def test_a_baseline_that_blinds_a_rule_is_said_once_and_logged(tmp_path: Path) -> None:
    run = SimpleNamespace(log=MetricsLog(tmp_path), state=SimpleNamespace(step=0))
    console = Console(record=True, width=300)

    def watched(baseline: Health, **config: Any) -> Guard:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        guard = Guard(CollapseConfig(**config), torch.nn.Linear(2, 1), folder, curve=())
        guard.watch.observe(0, baseline)
        return guard

    message = warn_blind(cast(Run, run), watched(Health(0.0, 0.05, 0.8)), console)  # no task solved
    assert message == (
        "the collapse watch cannot fire on rollout success (the baseline solved no task) in this RL stage;"
        " its baseline is the imitation policy's rollouts in the first iteration. rl.dev_tasks judges the"
        " weights on dev tasks (docs/collapse.md)."
    )
    assert "warning: the collapse watch cannot fire" in console.export_text()
    assert warn_blind(cast(Run, run), watched(Health(0.0, 0.05, 0.8), enabled=False), console) is None
    assert warn_blind(cast(Run, run), watched(Health(0.25, 0.05, 0.8)), console) is None  # sees all
    both = warn_blind(cast(Run, run), watched(Health(0.0, 0.05, None)), console)
    assert both is not None
    assert "rollout success (the baseline solved no task) or TCSR (no tool call" in both
    run.log.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in records] == ["blind", "blind"]
    assert records[0]["rules"] == ["rollout success (the baseline solved no task)"]
