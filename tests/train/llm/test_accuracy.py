"""A run's final evaluation measures per-turn tool accuracy on the gold trajectories of its held-out tasks:
one scored turn per expert tool call, recorded beside the task metrics in the run's `eval` records."""

from __future__ import annotations

import json
from pathlib import Path

from sessionrl.envs.base import Split
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.dispatch import run_trainer
from sessionrl.train.llm.loop import TrainResult
from tiny_run_support import SFT_SECTION, tiny_run


def test_the_report_scores_one_turn_per_gold_tool_call_and_records_it(tmp_path: Path) -> None:
    rollout = {"full_schemas": False, "domain_policy": False}  # a prompt the tiny model's context holds
    data = tiny_run(run_dir=str(tmp_path), trainer="sft", sft=SFT_SECTION, rollout=rollout)
    config = RunConfig.model_validate(data)
    result = run_trainer(config)
    assert isinstance(result, TrainResult)
    tools = result.report["sft"].tools
    assert tools is not None
    with SessionStore.open(config.store_url) as store:
        gold = [s for s in store.iter_sessions() if s.metadata.get("stage") == "gold"]
    assert len(gold) + tools.missing == config.evaluation.tasks
    assert all(s.metadata["split"] == Split.TEST for s in gold)
    assert len(tools.turns) == sum(len(s.tool_calls) for s in gold) > 0
    assert tools.answers == sum(s.final_output is not None for s in gold)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if r["stage"] == "eval" and r["label"] == "sft"]
    assert logged["tool_turns"] == len(tools.turns)
    assert logged["tool_acc"] == round(tools.accuracy, 4)
    assert 0.0 <= logged["tool_acc"] <= logged["tool_name_acc"] <= logged["tool_parse_rate"] <= 1.0
