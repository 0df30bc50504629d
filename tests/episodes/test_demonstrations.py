"""Demonstrations through the training path (`record_demonstrations`, what the SFT stage calls): every one
reaches the store, or the run says how many are missing and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sessionrl.cli import app
from sessionrl.envs.base import Split
from sessionrl.episodes import MissingDemonstrations
from sessionrl.episodes.verdict import task_success
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.imitation import record_demonstrations
from sessionrl.train.llm.run import open_run


def demos_records(folder: Path) -> list[dict[str, Any]]:
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["stage"] == "demos"]


@pytest.mark.slow
def test_all_500_retail_training_demonstrations_reach_the_store(retail_data: Path, tmp_path: Path) -> None:
    config = RunConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "env": {"name": "retail", "data": str(retail_data)},
            "sft": {"demos": 500},
        }
    )
    console = Console(record=True, width=200)
    with open_run(config) as run:
        assert len(run.env.tasks(Split.TRAIN)) == 500
        demos = record_demonstrations(run, console)
        stored = {s.session_id: s for s in run.store.iter_sessions()}
    assert len(demos) == 500
    assert {d.metadata["task_id"] for d in demos} == {t.task_id for t in run.env.tasks(Split.TRAIN)}
    assert all(task_success(stored[d.session_id]) is True for d in demos)
    assert all(d.metadata["stage"] == "demo" and d.metadata["agent"] == "expert" for d in demos)
    (record,) = demos_records(config.run_dir)
    assert {k: record[k] for k in ("requested", "usable", "missing")} == {
        "requested": 500,
        "usable": 500,
        "missing": 0,
    }
    assert "500 of 500 demonstrations usable" in console.export_text()


def test_a_run_stops_when_its_guards_refuse_too_many_demonstrations(tmp_path: Path) -> None:
    # the run's orchestrator forbids a tool the orders expert uses on some tickets
    config = RunConfig.model_validate(
        {
            "run_dir": str(tmp_path / "run"),
            "env": {"name": "orders", "train": 20, "dev": 2, "test": 2},
            "orchestrator": {"forbidden_tools": ["order_update_address"]},
            "sft": {"demos": 24},
        }
    )
    console = Console(record=True, width=200)
    with open_run(config) as run, pytest.raises(MissingDemonstrations) as raised:
        record_demonstrations(run, console)
    tally = raised.value.tally
    refused = tally.reasons["plan_rejected:forbidden_tool"]
    assert refused > 0
    assert tally.reasons == {"plan_rejected:forbidden_tool": refused, "no_task": 4}
    assert (tally.requested, tally.usable) == (24, 20 - refused)
    assert f"{refused} plan_rejected:forbidden_tool" in str(raised.value)
    assert "4 no_task" in str(raised.value)
    (record,) = demos_records(config.run_dir)
    assert record["missing"] == refused + 4
    assert record["missing/plan_rejected:forbidden_tool"] == refused
    assert tally.describe() in console.export_text()


def test_the_train_command_exits_with_the_count_of_missing_demonstrations(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        f"run_dir: {tmp_path / 'run'}\n"
        "env: {name: orders, train: 20, dev: 2, test: 2}\n"
        "orchestrator: {forbidden_tools: [order_update_address]}\n"
        "sft: {demos: 20}\n",
        encoding="utf-8",
    )
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 1
    assert "error:" in result.stderr
    assert "demonstrations usable" in result.stderr
    assert "plan_rejected:forbidden_tool" in result.stderr
    assert not (tmp_path / "run" / "sft_policy").exists()  # stopped before any training
