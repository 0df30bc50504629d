"""A/B analysis over the sessions each version served, canary rules, and the canary check that rolls a
worse canary back (with an alert) and promotes a better one, reporting its sample sizes."""

from __future__ import annotations

import pytest
from ops_support import served, webhook

from sessionrl.errors import InvalidEvent
from sessionrl.ops.analysis import compare_versions
from sessionrl.ops.canary import Action, check_canary
from sessionrl.ops.config import CanaryConfig, OpsConfig
from sessionrl.ops.registry import PolicyRegistry, Stage
from sessionrl.ops.rules import compile_rule, holds
from sessionrl.store import SessionStore


def test_a_comparison_gives_each_metric_with_its_test_and_interval() -> None:
    with SessionStore.open("sqlite://") as store:
        for i in range(10):
            served(store, f"a{i}", 1, calls=[True, i % 2 == 0], solved=i < 5, task=f"t{i}")
            served(store, f"b{i}", 2, calls=[True, True], solved=i < 8, task=f"t{i}")
        served(store, "other", 3, calls=[False], solved=False, task="t0")
        result = compare_versions(store, "orders", 1, 2)
    assert (result.n_a, result.n_b, result.paired_tasks) == (10, 10, 10)
    tcsr = result.metrics["tcsr"]
    assert (tcsr.a, tcsr.b, tcsr.n_a, tcsr.test) == (0.75, 1.0, 20, "two_proportion")
    assert tcsr.ci is not None
    assert tcsr.ci[0] <= 0.25 <= tcsr.ci[1]
    success = result.metrics["success"]
    assert (success.a, success.b, success.test) == (0.5, 0.8, "mcnemar")  # the tasks match: paired
    assert success.p_value == pytest.approx(0.25)  # 3 tasks only B solved, none only A: 2 / 2**3
    assert result.metrics["spt"].a == 2.0
    assert result.metrics["rating"].diff is None  # nobody rated
    values = result.variables()
    assert values["tcsr_drop"] == pytest.approx(-0.25)
    assert values["success_gain"] == pytest.approx(0.3)


def test_rules_read_only_known_metrics_and_take_words_or_symbols() -> None:
    assert holds("tcsr_drop > 0.005 or dvr_drop > 0.02", {"tcsr_drop": 0.0, "dvr_drop": 0.03})
    assert not holds("tcsr_drop > 0.005 && n_b >= 10", {"tcsr_drop": 0.1, "n_b": 3})
    with pytest.raises(InvalidEvent, match="unknown metric"):
        compile_rule("tcsr_dorp > 0.1")
    with pytest.raises(InvalidEvent, match="does not compile"):
        compile_rule("tcsr_drop >")
    with pytest.raises(ValueError, match="unknown metric"):
        CanaryConfig(rollback_when="latency > 3")


def canary_setup(store: SessionStore) -> PolicyRegistry:
    registry = PolicyRegistry(store)
    registry.register("orders", "v1")
    registry.register("orders", "v2")
    registry.promote("orders", 1, Stage.PRODUCTION)
    registry.promote("orders", 2, Stage.CANARY, share=0.2)
    return registry


def test_a_worse_canary_is_rolled_back_with_an_alert_once_the_sample_is_large_enough() -> None:
    rules = CanaryConfig(min_sessions=8, rollback_when="tcsr_drop > 0.005 or dvr_drop > 0.02")
    with SessionStore.open("sqlite://") as store, webhook() as hook:
        config = OpsConfig(policy="orders", canary=rules, webhook_url=hook.url)
        registry = canary_setup(store)
        for i in range(8):
            served(store, f"a{i}", 1, calls=[True, True], solved=True, task=f"t{i}")
        for i in range(7):
            served(store, f"b{i}", 2, calls=[True, False], solved=False, task=f"u{i}")
        waiting = check_canary(registry, config)
        assert waiting is not None
        assert (waiting.action, waiting.judged) == (Action.WAIT, (8, 7))
        assert registry.canary("orders") is not None
        served(store, "b7", 2, calls=[True, False], solved=False, task="u7")
        verdict = check_canary(registry, config)
        assert verdict is not None
        assert (verdict.action, verdict.judged) == (Action.ROLLBACK, (8, 8))
        assert registry.canary("orders") is None
        assert registry.get("orders", 2).stage is Stage.RETIRED
        assert check_canary(registry, config) is None  # nothing left to check
        (alert,) = hook.received
        checks = [e.detail["action"] for e in registry.log(kind="canary_check")]
    assert alert["event"] == "canary_rolled_back"
    assert (alert["judged_production"], alert["judged_canary"]) == (8, 8)
    assert alert["variables"]["tcsr_drop"] == pytest.approx(0.5)
    assert checks == ["wait", "rollback"]


def test_a_better_canary_goes_to_production() -> None:
    with SessionStore.open("sqlite://") as store:
        config = OpsConfig(policy="orders", canary=CanaryConfig(min_sessions=4))
        registry = canary_setup(store)
        for i in range(4):
            served(store, f"a{i}", 1, calls=[True, False], solved=i < 2, task=f"t{i}")
            served(store, f"b{i}", 2, calls=[True, True], solved=True, task=f"u{i}")
        verdict = check_canary(registry, config)
        assert verdict is not None
        assert verdict.action == Action.PROMOTE
        assert registry.production("orders") == registry.get("orders", 2)
        assert registry.get("orders", 1).stage is Stage.RETIRED
        assert "canary" in registry.get("orders", 2).evaluation
