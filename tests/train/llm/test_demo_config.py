"""The main job's configuration: it must hold together before anyone waits minutes to find out it does not."""

from __future__ import annotations

from pathlib import Path

from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.train.config import RunConfig
from sessionrl.train.llm.demo import demo_config


def test_the_demo_config_round_trips_and_leaves_rl_unseen_tasks(tmp_path: Path) -> None:
    config = demo_config(tmp_path / "demo")
    assert RunConfig.model_validate_json(config.model_dump_json()) == config
    assert config.rl.unseen_tasks
    assert config.env.options["train"] > config.sft.demos
    assert config.faults.demo_rate < config.faults.eval_rate  # RL meets more faults than imitation saw
    assert config.evaluation.tasks >= 50
    assert config.evaluation.temperature == 0.0


def test_the_demo_rules_load_and_charge_only_the_policys_own_mistakes(tmp_path: Path) -> None:
    rules = demo_config(tmp_path / "demo").rewards.rules
    assert rules is not None
    assert rules.is_file()
    ruleset = RewardEngine(RewardConfig(rules=rules)).source.current()
    by_name = {spec.name: spec for spec in ruleset.file.rules}
    assert set(by_name) == {"policy_error", "not_an_action", "task_outcome"}
    assert "!call.retryable" in by_name["policy_error"].when
