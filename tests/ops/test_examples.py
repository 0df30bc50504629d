"""The operations examples load as the configs they document."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sessionrl.ops.config import OpsConfig
from sessionrl.ops.loop import LoopConfig

REPO = Path(__file__).resolve().parents[2]


def test_the_service_example_is_an_ops_config() -> None:
    config = OpsConfig.model_validate(yaml.safe_load((REPO / "examples/ops/service.yaml").read_text()))
    assert config.policy == "orders"
    assert [s.tool for s in config.plan_templates["support"]] == ["find_order", "refund"]


def test_the_loop_example_is_a_loop_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # its paths are the repository's, as the README runs it
    config = LoopConfig.load("examples/ops/loop.yaml")
    assert (config.threshold, config.thresholds, config.ops.canary.min_sessions) == (
        0.05,
        {"timeout": 0.1},
        20,
    )
