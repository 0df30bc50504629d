"""A run's final evaluation measures per-turn tool accuracy on the gold trajectories of its held-out tasks:
one scored turn per expert tool call, recorded beside the task metrics in the run's `eval` records; a turn
whose prompt the policy cannot take is counted, and scored as a reply that did not parse."""

from __future__ import annotations

import json

import pytest

from sessionrl.envs.base import Split
from sessionrl.policy.llm import HFPolicy, SamplingConfig
from sessionrl.policy.toolcalls import ToolFormat
from sessionrl.store import SessionStore
from sessionrl.train.config import RunConfig
from sessionrl.train.dispatch import run_trainer
from sessionrl.train.llm.accuracy import gold_replies, gold_sessions, measure_tool_accuracy
from sessionrl.train.llm.loop import TrainResult
from sessionrl.train.llm.run import open_run
from tiny_run_support import SFT_SECTION, tiny_run


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, TrainResult]:
    folder = tmp_path_factory.mktemp("accuracy")
    rollout = {"full_schemas": False, "domain_policy": False}  # a prompt the tiny model's context holds
    data = tiny_run(run_dir=str(folder), trainer="sft", sft=SFT_SECTION, rollout=rollout)
    config = RunConfig.model_validate(data)
    result = run_trainer(config)
    assert isinstance(result, TrainResult)
    return config, result


def test_the_report_scores_one_turn_per_gold_tool_call_and_records_it(
    trained: tuple[RunConfig, TrainResult],
) -> None:
    config, result = trained
    tools = result.report["sft"].tools
    assert tools is not None
    with SessionStore.open(config.store_url) as store:
        gold = [s for s in store.iter_sessions() if s.metadata.get("stage") == "gold"]
    assert len(gold) + tools.missing == config.evaluation.tasks
    assert all(s.metadata["split"] == Split.TEST for s in gold)
    assert len(tools.turns) == sum(len(s.tool_calls) for s in gold) > 0
    assert tools.answers == sum(s.final_output is not None for s in gold)
    assert tools.unanswered == 0
    records = [json.loads(line) for line in (config.run_dir / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if r["stage"] == "eval" and r["label"] == "sft"]
    assert logged["tool_turns"] == len(tools.turns)
    assert logged["tool_acc"] == round(tools.accuracy, 4)
    assert 0.0 <= logged["tool_acc"] <= logged["tool_name_acc"] <= logged["tool_parse_rate"] <= 1.0


def test_a_turn_too_long_for_the_policy_counts_as_unanswered_and_unparsed(
    trained: tuple[RunConfig, TrainResult],
) -> None:
    config, result = trained
    cramped = HFPolicy.load(config.run_dir / "sft_policy", SamplingConfig(max_prompt_tokens=8))
    with open_run(config) as run:
        tools = measure_tool_accuracy(run, cramped, Split.TEST, config.evaluation.tasks)
    before = result.report["sft"].tools
    assert before is not None
    assert tools.unanswered == len(tools.turns) == len(before.turns)
    assert tools.parse_rate == 0.0


def test_gold_turns_open_with_the_system_prompt_of_the_evaluated_policy_s_tool_format(
    trained: tuple[RunConfig, TrainResult],
) -> None:
    """`sessionrl eval` opens a run without a live policy; the gold turns must still be asked in the
    format of the policy evaluated, as training's own report asks them."""
    config, _ = trained
    tagged = HFPolicy.load(config.run_dir / "sft_policy")
    tagged.tool_format = ToolFormat.TAGGED
    with open_run(config) as run:
        assert run.policy is None
        gold, _ = gold_sessions(run, Split.TEST, config.evaluation.tasks)
        replies = gold_replies(run, tagged, gold)
        run.policy = tagged
        want = run.system
    systems = {r.messages[0].content for turns in replies.values() for r in turns}
    assert systems == {want}
    assert "<tool_call>" in want
