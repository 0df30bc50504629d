"""The reward examples run as documented."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from sessionrl.rewards import RuleSet, check_reward_term, load_rules, sample_sessions

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "rewards"


@pytest.fixture(scope="module")
def three_layer() -> RuleSet:
    return load_rules(EXAMPLES / "three_layer.yaml")


def test_three_layer_example_loads_and_its_rules_conform(three_layer: RuleSet) -> None:
    assert three_layer.file.scheme == "three_layer"
    sessions = sample_sessions(12)
    for term in three_layer.terms:
        check_reward_term(term.fn, sessions)


def test_late_feedback_walkthrough() -> None:
    module = runpy.run_path(str(EXAMPLES / "late_feedback.py"))
    outcome = module["run"](160)
    assert outcome.before.rating is None
    assert outcome.after.rating == 4.0
    values = {t.name: t.value for t in outcome.after.terms}
    assert values["human_rating"] == pytest.approx(0.5)  # (4 - 3) / 2
    assert values["judge_correction"] == pytest.approx(-0.2)
    assert outcome.after.session_version > outcome.before.session_version
    assert len(outcome.queue) == 5


def test_custom_term_example_scores_its_term_in_the_layer_the_file_gives() -> None:
    module = runpy.run_path(str(EXAMPLES / "custom_term.py"))
    vectors = module["run"](60)
    contributions = [t for v in vectors for t in v.terms if t.name == "abandoned_failures"]
    assert len(contributions) == len(vectors)
    assert {t.layer for t in contributions} == {"completion"}
    paid = [t for t in contributions if t.value]
    assert paid
    assert all(t.value == pytest.approx(sum(t.steps.values())) for t in paid)
