"""The policy registry on both backends: versions and lineage read back equal, the stage table is enforced,
one production and one canary at a time, rollback undoes the last release, and every change is logged."""

from __future__ import annotations

import pytest

from sessionrl.errors import InvalidEvent, NotFound
from sessionrl.ops.registry import InvalidStage, Lineage, PolicyRegistry, Stage
from sessionrl.ops.strategy import StrategyMode, current_mode, set_mode
from sessionrl.store import SessionStore


def test_a_version_reads_back_with_its_lineage_and_evaluation(ops_store: SessionStore) -> None:
    registry = PolicyRegistry(ops_store)
    lineage = Lineage(run_dir="runs/x", data_cursor=42, ruleset_version="r1", trainer="sft", parent=1)
    v1 = registry.register("orders", "runs/x/sft_policy", lineage=lineage, evaluation={"success": 0.5})
    assert (v1.version, v1.stage, v1.share) == (1, Stage.CANDIDATE, 0.0)
    assert registry.get("orders", 1) == v1
    assert registry.get("orders", 1).lineage == lineage
    assert registry.get("orders", 1).evaluation == {"success": 0.5}
    assert registry.register("orders", "b").version == 2
    assert registry.register("clinic", "c").version == 1
    assert [v.version for v in registry.versions("orders")] == [1, 2]
    with pytest.raises(NotFound):
        registry.get("orders", 9)


def test_stages_follow_the_table_and_rollback_restores(ops_store: SessionStore) -> None:
    registry = PolicyRegistry(ops_store)
    for artifact in ("a", "b", "c"):
        registry.register("orders", artifact)
    registry.promote("orders", 1, Stage.PRODUCTION, reason="first")
    registry.promote("orders", 2, Stage.CANARY, share=0.2)
    assert registry.get("orders", 2).share == 0.2
    assert registry.canary("orders") == registry.get("orders", 2)
    with pytest.raises(InvalidEvent):
        registry.promote("orders", 3, Stage.CANARY)  # a canary needs its share
    registry.promote("orders", 2, Stage.PRODUCTION, reason="better")
    assert [(v.version, v.stage) for v in registry.versions("orders")] == [
        (1, Stage.RETIRED),
        (2, Stage.PRODUCTION),
        (3, Stage.CANDIDATE),
    ]
    with pytest.raises(InvalidStage):  # retired comes back only by rollback
        registry.promote("orders", 1, Stage.PRODUCTION)
    registry.promote("orders", 3, Stage.CANARY, share=0.5)
    assert registry.rollback("orders", reason="canary worse").version == 2  # the canary stops
    assert registry.canary("orders") is None
    assert registry.get("orders", 3).stage is Stage.RETIRED
    assert registry.rollback("orders", reason="v2 regressed").version == 1  # production goes back
    assert registry.production("orders") == registry.get("orders", 1)
    kinds = [e.kind for e in registry.log(policy="orders")]
    assert kinds.count("registered") == 3
    assert kinds.count("rolled_back") == 2
    moves = [(e.version, e.detail["to"]) for e in registry.log(kind="stage", policy="orders")]
    assert moves[-2:] == [(2, "retired"), (1, "production")]


def test_the_strategy_mode_is_a_logged_setting(ops_store: SessionStore) -> None:
    registry = PolicyRegistry(ops_store)
    assert current_mode(registry) is StrategyMode.POLICY
    set_mode(registry, "rules", reason="incident 7")
    assert current_mode(registry) is StrategyMode.RULES
    (entry,) = registry.log(kind="setting")
    assert entry.detail == {"key": "strategy_mode", "value": "rules", "reason": "incident 7"}


def test_a_repeated_key_returns_the_first_answer_and_changes_nothing(ops_store: SessionStore) -> None:
    registry = PolicyRegistry(ops_store)
    first = registry.register("orders", "a", key="k1")
    assert registry.register("orders", "a", key="k1") == first
    assert len(registry.versions("orders")) == 1
    registry.register("orders", "b")
    production = registry.promote("orders", 1, Stage.PRODUCTION, key="k2")
    canary = registry.promote("orders", 2, Stage.CANARY, share=0.1, key="k3")
    assert registry.promote("orders", 2, Stage.CANARY, share=0.1, key="k3") == canary
    assert registry.rollback("orders", reason="r", key="k4") == production
    assert registry.rollback("orders", reason="r", key="k4") == production  # not a second rollback
    assert [e.kind for e in registry.log(kind="rolled_back")] == ["rolled_back"]
    with pytest.raises(InvalidEvent):
        registry.register("orders@v2", "x")  # a name that would read as a version tag
