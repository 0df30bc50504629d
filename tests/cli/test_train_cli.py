"""`sessionrl train` on a tiny grpo run, off a terminal: it says its plan first, prints plain progress lines,
and a run the gate stops exits with status 1 saying why and what to try."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sessionrl.cli import app
from tiny_run_support import SFT_SECTION, tiny_run

pytestmark = pytest.mark.slow

TINY_GRPO = tiny_run(
    trainer="grpo",
    rollout={"full_schemas": False, "domain_policy": False},
    sft=SFT_SECTION,
    rl={"iterations": 1, "tasks_per_iteration": 2, "sampling": {"max_new_tokens": 16}},
    evaluation={"gate_min_success": 1.0},
)
"""A run the gate stops: a two-step imitation policy does not solve every gate task."""


def test_a_run_the_gate_stops_exits_non_zero_saying_why(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**TINY_GRPO, "run_dir": str(tmp_path / "run")}), encoding="utf-8")
    result = CliRunner().invoke(app, ["train", str(config)], terminal_width=200)
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "plan: 6 expert demonstrations, then 2 imitation steps, then a gate on 2 dev tasks, then 1 GRPO "
        "iterations of 2 tasks x 4, then an evaluation of each policy on 2 test tasks"
    )
    assert re.search(r"^demonstrations 1/6 \d+s \(~\d+s left\)$", result.output, re.M)  # plain lines
    assert re.search(r"imitation 2/2 \d+s loss \d+\.\d+$", result.output, re.M)
    stopped = next(line for line in lines if line.startswith("stopped at the gate:"))
    assert "evaluation.gate_min_success 1.0, so GRPO did not start" in stopped
    assert "sft.demos" in stopped
    assert (tmp_path / "run" / "sft_policy").is_dir()
    assert not (tmp_path / "run" / "rl_policy").exists()


def test_threads_sets_torchs_thread_count_and_silences_loading_bars() -> None:
    import torch
    from transformers.utils import logging as hf_logging

    from sessionrl.cli.train import quiet_model_loading

    before = torch.get_num_threads()
    try:
        quiet_model_loading(1)
        assert torch.get_num_threads() == 1
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        torch.set_num_threads(before)
        hf_logging.enable_progress_bar()


def test_eval_reads_a_runs_policy_back_without_loading_bars(tmp_path: Path) -> None:
    from transformers.utils import logging as hf_logging

    config = tmp_path / "run.yaml"
    rollout = {"full_schemas": False, "domain_policy": False}
    run = tiny_run(trainer="sft", rollout=rollout, sft=SFT_SECTION, run_dir=str(tmp_path / "run"))
    config.write_text(yaml.safe_dump(run), encoding="utf-8")
    trained = CliRunner().invoke(app, ["train", str(config)])
    assert trained.exit_code == 0, trained.output
    hf_logging.enable_progress_bar()  # as a process that has not trained before would find it
    try:
        result = CliRunner().invoke(app, ["eval", str(tmp_path / "run"), "--split", "dev", "--tasks", "1"])
        assert result.exit_code == 0, result.output
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
    evaluated = json.loads(result.output.strip().splitlines()[-1])
    assert set(evaluated) == {"sft"}
    assert evaluated["sft"]["n_tasks"] == 1


def test_the_plan_of_a_stage_that_starts_from_a_trained_policy_names_it() -> None:
    from sessionrl.cli.train import _plan
    from sessionrl.train.config import RunConfig

    config = RunConfig.model_validate(
        {
            **TINY_GRPO,
            "model": {"path": "runs/earlier/rl_policy"},
            "sft": {"demos": 1, "trainer": {"steps": 0}},
            "rl": {"iterations": 0},
        }
    )
    assert _plan(config) == (
        "plan: 1 expert demonstration, then no imitation (the policy of runs/earlier/rl_policy), then a gate"
        " on 2 dev tasks, then an evaluation of each policy on 2 test tasks"
    )
