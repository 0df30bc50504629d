"""Dev validation of the RL stage (`rl.dev_tasks`): GRPO's weights judged on dev tasks, undone when they
solve fewer than the kept ones, and the verdicts logged and read back on resume; on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from sessionrl.eval.collapse import CollapseConfig, Health
from sessionrl.train.config import RFTSection, RLSection, RunConfig
from sessionrl.train.llm import evaluation, loop
from sessionrl.train.llm.checkpoint import read_state
from sessionrl.train.llm.evaluation import DEV_POLICY
from sessionrl.train.llm.loop import train
from sessionrl.train.llm.watch import GOOD, UNDONE, trainable_weights
from tiny_run_support import SFT_SECTION, tiny_run

pytestmark = pytest.mark.slow

Weights = dict[str, torch.Tensor]


def dev_run(folder: Path, iterations: int, dev_every: int = 0, tools: bool = False) -> RunConfig:
    """Imitation, then `iterations` of GRPO judged on 2 dev tasks (every `dev_every` and after the last;
    on tool accuracy too with `tools`) at a learning rate that moves the weights."""
    rl = {
        "iterations": iterations,
        "tasks_per_iteration": 2,
        "dev_tasks": 2,
        "dev_every": dev_every,
        "dev_tool_accuracy": tools,
        "sampling": {"max_new_tokens": 16},
        "trainer": {"group_size": 2, "token_budget": 4096, "lr": 0.01},
    }
    rollout = {"full_schemas": False, "domain_policy": False}  # short prompts for the tiny model
    return RunConfig.model_validate(tiny_run(run_dir=str(folder), sft=SFT_SECTION, rollout=rollout, rl=rl))


def records(folder: Path, stage: str) -> list[dict[str, Any]]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["stage"] == stage]


def same(a: Weights, b: Weights) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def exported_said(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each end of RL says rl_policy/ holds, should its rollouts have ended unhealthy."""
    said: list[str] = []
    real_warn = loop.warn_unsettled

    def warn(run: Any, guard: Any, console: Any, exported: str = "the last update") -> str | None:
        said.append(exported)
        return real_warn(run, guard, console, exported)

    monkeypatch.setattr(loop, "warn_unsettled", warn)
    return said


def test_rl_is_judged_on_dev_after_its_last_iteration_and_logs_the_verdict(tmp_path: Path) -> None:
    config = dev_run(tmp_path / "run", iterations=2)
    train(config)
    folder = config.run_dir
    evals = {r["label"]: r for r in records(folder, "eval")}
    (verdict,) = records(folder, "rl_dev")  # dev_every 0: only after the last iteration
    assert verdict["iteration"] == 1
    assert verdict["dev_tasks"] == 2
    assert verdict["before"] == round(evals["rl-dev-0"]["success"] * 2)
    assert verdict["solved"] == round(evals["rl-dev-2"]["success"] * 2)
    assert verdict["kept"] is (verdict["solved"] >= verdict["before"])
    start = load_file(str(folder / "sft_policy" / "model.safetensors"))
    final = load_file(str(folder / "rl_policy" / "model.safetensors"))
    assert same(start, final) is not verdict["kept"]  # lr 0.01 moves the weights; undone, they come back
    kept = load_file(str(folder / DEV_POLICY))
    assert same(kept, final)


def test_weights_that_solve_fewer_dev_tasks_are_undone_and_rl_goes_on_from_the_kept_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    solved = iter([2, 1, 2, 3])  # before RL; after iteration 1 (worse: undone); after 2 and 3 (kept)
    judged: list[Weights] = []  # the weights each dev evaluation saw
    learned: list[tuple[Weights, Any, int]] = []  # each update's starting weights, trainer, optimiser state

    def on_dev(run: Any, tasks: int, label: str) -> int:
        judged.append(trainable_weights(run.need_policy().model))
        return next(solved)

    def learn(run: Any, trainer: Any, *args: Any) -> Any:
        model = run.need_policy().model
        learned.append((trainable_weights(model), trainer, len(trainer.optimizer.state)))
        return real_learn(run, trainer, *args)

    real_learn = loop.learn
    monkeypatch.setattr(evaluation, "solved_on_dev", on_dev)
    monkeypatch.setattr(loop, "learn", learn)
    said = exported_said(monkeypatch)
    config = dev_run(tmp_path / "run", iterations=3, dev_every=1)
    train(config)
    folder = config.run_dir

    verdicts = records(folder, "rl_dev")
    assert [(v["iteration"], v["before"], v["solved"], v["kept"]) for v in verdicts] == [
        (0, 2, 1, False),
        (1, 2, 2, True),
        (2, 2, 3, True),
    ]
    start, after_first, _, after_third = judged
    assert not same(start, after_first)  # iteration 1 trained, and was undone:
    (_, first, _), (restored, second, fresh_state), (_, third, _) = learned
    assert same(restored, start)  # iteration 2 started from the weights RL started from,
    assert second is not first  # with a fresh trainer
    assert fresh_state == 0  # and optimiser,
    assert third is second  # which then goes on
    exported = load_file(str(folder / "rl_policy" / "model.safetensors"))
    assert same({k: exported[k] for k in after_third}, after_third)  # kept last: RL ends on it
    state = read_state(folder / "checkpoint")
    assert state is not None
    assert state.policy_version == 4  # three updates and one restore, each a version the engine serves
    assert said == ["the last update"]


def test_when_the_last_verdict_undoes_rl_says_it_ends_on_the_kept_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    solved = iter([2, 1])  # before RL; after its only iteration: worse, undone
    monkeypatch.setattr(evaluation, "solved_on_dev", lambda *_: next(solved))
    said = exported_said(monkeypatch)
    config = dev_run(tmp_path / "run", iterations=1)
    train(config)
    assert [v["kept"] for v in records(config.run_dir, "rl_dev")] == [False]
    assert said == ["the weights dev validation kept"]  # judged first, so an unhealthy end says so


def test_a_collapse_on_a_judged_iteration_has_dev_validation_judge_the_weights_rolled_back_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # iterations 0 and 1 healthy, 2 (judged by dev_every 3) collapses at once (patience 1)
    healths = iter([Health(0.5, 0.0), Health(0.5, 0.0), Health(0.0, 0.0)])
    monkeypatch.setattr(Health, "of", staticmethod(lambda *_: next(healths)))
    solved = iter([2, 3])  # before RL; then the only weights judged after it
    judged: list[Weights] = []

    def on_dev(run: Any, tasks: int, label: str) -> int:
        judged.append(trainable_weights(run.need_policy().model))
        return next(solved)

    monkeypatch.setattr(evaluation, "solved_on_dev", on_dev)
    config = dev_run(tmp_path / "run", iterations=4, dev_every=3)
    collapse = CollapseConfig(patience=1)
    train(config.model_copy(update={"rl": config.rl.model_copy(update={"collapse": collapse})}))
    folder = config.run_dir

    (stop,) = records(folder, "collapse")
    assert (stop["step"], stop["rolled_back_to"]) == (2, 1)
    assert stop["message"].startswith("RL stopped at iteration 3: ")  # counted from 1, as the console
    assert "rolled back to the weights that played iteration 2, the last healthy;" in stop["message"]
    assert stop["message"].endswith("dev validation judges it next.")
    (verdict,) = records(folder, "rl_dev")  # the collapsed weights were never judged
    assert (verdict["iteration"], verdict["kept"]) == (2, True)
    good = load_file(str(folder / GOOD))  # the weights that played iteration 1
    start, rolled_back = judged
    assert not same(start, rolled_back)
    assert same(rolled_back, good)
    assert same(load_file(str(folder / DEV_POLICY)), good)
    exported = load_file(str(folder / "rl_policy" / "model.safetensors"))
    assert same({k: exported[k] for k in good}, good)  # RL ends on the judged weights


def test_an_undone_update_ends_the_collapse_watch_s_streak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # iterations 1 and 2 unhealthy; 2 is judged on dev and undone; 3, played by the restored weights,
    # is unhealthy too: three in a row, but not three of one policy's, so no collapse (patience 3)
    healths = iter([Health(0.5, 0.0)] + [Health(0.0, 0.0)] * 3)
    monkeypatch.setattr(Health, "of", staticmethod(lambda *_: next(healths)))
    solved = iter([2, 1, 2])  # before RL; after iteration 3 (undone); after the last (kept)
    monkeypatch.setattr(evaluation, "solved_on_dev", lambda *_: next(solved))
    config = dev_run(tmp_path / "run", iterations=4, dev_every=3)
    assert config.rl.collapse.patience == 3
    train(config)
    folder = config.run_dir

    assert records(folder, "collapse") == []
    assert [r.get(UNDONE, False) for r in records(folder, "rl")] == [False, False, True, False]
    assert [(v["iteration"], v["kept"]) for v in records(folder, "rl_dev")] == [(2, False), (3, True)]
    (unsettled,) = records(folder, "unsettled")  # the stage ends on one unhealthy iteration, not three
    assert unsettled["reason"].startswith("iteration 4:")  # the records' iteration 3, counted from 1


def test_a_resumed_run_judges_against_what_validation_kept_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run"
    train(dev_run(folder, iterations=1, dev_every=1))
    (first,) = records(folder, "rl_dev")
    labels: list[str] = []

    def on_dev(run: Any, tasks: int, label: str) -> int:
        labels.append(label)
        return first["solved"] if first["kept"] else first["before"]  # as good as the kept weights

    monkeypatch.setattr(evaluation, "solved_on_dev", on_dev)
    train(dev_run(folder, iterations=2, dev_every=1), resume=True)
    assert labels == ["rl-dev-2"]  # the weights RL started from were not evaluated again
    second = records(folder, "rl_dev")[1]
    assert second["before"] == max(first["before"], first["solved"])
    assert second["kept"] is True

    longer = dev_run(folder, iterations=3, dev_every=1)
    fewer = longer.model_copy(update={"rl": longer.rl.model_copy(update={"dev_tasks": 1})})
    with pytest.raises(ValueError, match=r"judged 2 dev tasks and rl\.dev_tasks now asks 1"):
        train(fewer, resume=True)


def test_dev_every_without_dev_tasks_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"set rl\.dev_tasks too"):
        RLSection(dev_every=2)


def test_tool_accuracy_judges_too_when_asked_and_each_verdict_logs_both(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    train(dev_run(folder, iterations=1, tools=True))
    (verdict,) = records(folder, "rl_dev")
    assert verdict["turns"] > 0  # the 2 dev tasks' gold turns, measured on the tiny model
    assert 0 <= verdict["exact"] <= verdict["turns"]
    assert 0 <= verdict["exact_before"] <= verdict["turns"]
    holds = verdict["solved"] >= verdict["before"] and verdict["exact"] >= verdict["exact_before"]
    assert verdict["kept"] is holds

    without = dev_run(folder, iterations=2)  # resumed, no longer judging on tool accuracy
    with pytest.raises(ValueError, match=r"judged with tool accuracy and rl\.dev_tool_accuracy is now false"):
        train(without, resume=True)


def test_weights_that_solve_more_but_get_fewer_turns_exact_are_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    solved = iter([2, 3, 2])  # before RL; after iteration 1 (more solved); after iteration 2 (as many)
    exact = iter([(10, 20), (9, 20), (11, 20)])  # gold turns exact: fewer after 1, more after 2
    monkeypatch.setattr(evaluation, "solved_on_dev", lambda *_: next(solved))
    monkeypatch.setattr(evaluation, "exact_on_dev", lambda *_: next(exact))
    config = dev_run(tmp_path / "run", iterations=2, dev_every=1, tools=True)
    train(config)
    verdicts = records(config.run_dir, "rl_dev")
    fields = ("iteration", "before", "solved", "exact_before", "exact", "turns", "kept")
    assert [tuple(v[f] for f in fields) for v in verdicts] == [
        (0, 2, 3, 10, 9, 20, False),
        (1, 2, 2, 10, 11, 20, True),
    ]


@pytest.mark.parametrize("section", [RLSection, RFTSection])
def test_dev_tool_accuracy_without_dev_tasks_is_refused(section: type[RLSection | RFTSection]) -> None:
    with pytest.raises(ValidationError, match=r"dev_tool_accuracy judges on \w+\.dev_tasks"):
        section(dev_tool_accuracy=True)
