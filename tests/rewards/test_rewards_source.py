"""Hot reload: edits apply to the next scoring; a bad edit is rejected and the previous rules stay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rewards_support import build, tool

from sessionrl.rewards.engine import RewardConfig, RewardEngine
from sessionrl.rewards.judge import Severity
from sessionrl.rewards.rules import RuleFileError
from sessionrl.rewards.source import RuleSource
from sessionrl.session import CallStatus

RULES = """
name: hot
normalise: false
tool_weights: {db_query: WEIGHT}
rules:
  - name: tool_failure
    for_each: tool_call
    when: "!call.ok"
    value: -1.0 * weight
    layer: completion
"""


def write(path: Path, text: str, tick: int) -> None:
    """Write the file and give it a distinct modification time (coarse clocks cannot hide the edit)."""
    path.write_text(text, encoding="utf-8")
    stamp = 1_700_000_000 + tick
    os.utime(path, (stamp, stamp))


@pytest.fixture
def rule_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    write(path, RULES.replace("WEIGHT", "1.0"), 0)
    return path


def failure_value(engine: RewardEngine) -> float:
    vector = engine.score(build([tool("t1", "db_query", CallStatus.ERROR)]))
    return next(t.value for t in vector.terms if t.name == "tool_failure")


def test_an_edit_applies_to_the_next_score_without_a_restart(rule_file: Path) -> None:
    engine = RewardEngine(RewardConfig(rules=rule_file))
    first = engine.ruleset.version
    assert failure_value(engine) == -1.0  # -1.0 × w(db_query)=1.0
    write(rule_file, RULES.replace("WEIGHT", "3.0"), 1)
    assert failure_value(engine) == -3.0  # -1.0 × w(db_query)=3.0, same engine
    assert engine.ruleset.version != first


@pytest.mark.parametrize(
    ("broken", "rule"),
    [
        (RULES.replace("WEIGHT", "1.0").replace("!call.ok", "!call.ok &&"), "tool_failure"),
        (
            RULES.replace("WEIGHT", "1.0").replace(
                "    layer: completion", "    layer: completion\n    extra: 1"
            ),
            "tool_failure",
        ),
        (RULES.replace("WEIGHT", "1.0").replace("    value: -1.0 * weight\n", ""), "tool_failure"),
        ("name: hot\nrules: [", None),
    ],
)
def test_a_bad_edit_is_rejected_and_the_old_rules_stay(
    rule_file: Path, broken: str, rule: str | None
) -> None:
    engine = RewardEngine(RewardConfig(rules=rule_file))
    before = engine.ruleset.version
    write(rule_file, broken, 1)
    assert failure_value(engine) == -1.0  # still the old rules
    assert engine.ruleset.version == before
    error = engine.source.last_error
    assert isinstance(error, RuleFileError)
    assert error.rule == rule
    write(rule_file, RULES.replace("WEIGHT", "2.0"), 2)  # fixing the file brings the new rules in
    assert failure_value(engine) == -2.0
    assert engine.source.last_error is None


def test_explicit_reload_raises_and_keeps_the_old_rules(rule_file: Path) -> None:
    source = RuleSource(rule_file)
    before = source.current().version
    write(rule_file, RULES.replace("WEIGHT", "'heavy'"), 1)
    with pytest.raises(RuleFileError, match="tool_weights"):
        source.reload()
    assert source.current().version == before


def test_an_unchanged_file_is_not_recompiled(rule_file: Path) -> None:
    source = RuleSource(rule_file)
    ruleset = source.current()
    assert source.current() is ruleset  # same stat: nothing read
    write(rule_file, RULES.replace("WEIGHT", "1.0"), 5)  # touched, same content
    assert source.current() is ruleset


def test_a_deleted_file_keeps_the_rules_and_reports_it(rule_file: Path) -> None:
    source = RuleSource(rule_file)
    before = source.current()
    rule_file.unlink()
    assert source.current() is before
    assert source.last_error is not None
    assert "cannot read" in str(source.last_error)


def test_a_penalty_table_edit_is_picked_up(tmp_path: Path, rule_file: Path) -> None:
    table = tmp_path / "penalties.yaml"
    shipped = Path(RuleSource().current().penalties_path).read_text(encoding="utf-8")
    write(table, shipped, 0)
    write(rule_file, RULES.replace("WEIGHT", "1.0") + "penalties: penalties.yaml\n", 1)
    source = RuleSource(rule_file)
    before = source.current().version
    write(table, shipped.replace("high: -0.2}", "high: -0.4}", 1), 2)
    after = source.current()
    assert after.version != before
    assert after.penalties.default_penalties[Severity.HIGH] == -0.4


def test_the_first_load_must_succeed(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n", encoding="utf-8")
    with pytest.raises(RuleFileError, match="rules: missing"):
        RuleSource(bad)
