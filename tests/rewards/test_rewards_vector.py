"""Running normalisation and reward-vector assembly, checked against numbers worked out by hand."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rewards_support import T0, build, feedback, tool

from sessionrl.rewards.checker import default_context
from sessionrl.rewards.layers import MIN_SCALE, RunningStats, Scheme, TermKind
from sessionrl.rewards.rules import RuleSet, compile_rules
from sessionrl.rewards.terms import Term, TermResult
from sessionrl.rewards.vector import RewardVector, assemble
from sessionrl.session import Anchor, CallStatus, FeedbackType

FIVE = """
name: five
normalise: NORMALISE
clip: 2.0
layer_weights: {completion: 2.0, efficiency: 0.5, risk: 1.0, experience: 1.0, long_term: 0.5}
rules:
  - name: tool_failure
    for_each: tool_call
    when: "!call.ok"
    value: -1.0
    layer: completion
  - name: rating
    for_each: feedback
    when: feedback.type == "human_rating"
    value: (feedback.score - 1.0) / 4.0
    layer: experience
  - name: outcome
    for_each: feedback
    when: feedback.type == "task_outcome"
    value: feedback.score
    layer: long_term
terms:
  judge_correction: {layer: experience}
"""


def ruleset(tmp_path: Path, normalise: bool = False, scheme: str = "five_layer") -> RuleSet:
    text = FIVE.replace("NORMALISE", str(normalise).lower()).replace(
        "name: five", f"name: five\nscheme: {scheme}"
    )
    if scheme == "three_layer":
        text = text.replace(
            "{completion: 2.0, efficiency: 0.5, risk: 1.0, experience: 1.0, long_term: 0.5}",
            "{rule: 1.0, model: 0.5, judge: 2.0}",
        )
    return compile_rules(text.encode(), "five", tmp_path)


def fixed(
    name: str, kind: TermKind, layer: str, value: float, steps: dict[str, float]
) -> tuple[Term, TermResult]:
    term = Term(name, lambda s, c: TermResult(value, steps, "x"), kind, layer)
    return term, TermResult(value, steps, "x")


def test_welford_matches_numpy() -> None:
    values = [0.5, -1.0, 2.25, 3.0, 0.0, -0.75]
    stats = RunningStats()
    for v in values:
        stats = stats.update(v)
    assert stats.count == 6
    assert stats.mean == pytest.approx(np.mean(values))
    assert stats.variance == pytest.approx(np.var(values))  # population variance M2 / n


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=50))
def test_welford_is_stable_on_any_stream(values: list[float]) -> None:
    stats = RunningStats()
    for v in values:
        stats = stats.update(v)
    assert stats.mean == pytest.approx(float(np.mean(values)), abs=1e-6)
    assert stats.variance == pytest.approx(float(np.var(values)), rel=1e-6, abs=1e-6)


def test_normalise_centres_on_the_shrunk_mean_and_divides_only_wide_spreads() -> None:
    wide = RunningStats().update(-2.0).update(6.0)  # mean 2, variance ((-4)² + 4²) / 2 = 16: σ = 4
    assert wide.centre == pytest.approx(1 / 3)  # n · mean / (n + 10) = 2 · 2 / 12
    assert wide.scale == pytest.approx(4.0)
    assert wide.normalise(5.0, clip=5.0) == pytest.approx((5.0 - 1 / 3) / 4)
    assert wide.normalise(100.0, clip=5.0) == 5.0  # (100 - 1/3) / 4, clipped to 5
    flat = RunningStats().update(0.0).update(0.0)  # variance 0: the scale stays at its floor of 1
    assert flat.scale == MIN_SCALE == 1.0
    assert flat.normalise(-0.2, clip=5.0) == pytest.approx(-0.2)  # not blown up to -2
    assert RunningStats().normalise(4.0, clip=5.0) == 4.0  # nothing seen: centre 0, scale 1
    assert RunningStats().normalise(-9.0, clip=5.0) == -5.0
    one = RunningStats().update(7.0)  # one value seen moves the centre a little, not all the way to 7
    assert one.normalise(4.0, clip=5.0) == pytest.approx(4.0 - 7 / 11)


def test_assembly_without_normalisation(tmp_path: Path) -> None:
    rules = ruleset(tmp_path)
    session = build([tool("t1", status=CallStatus.ERROR)])
    results = [
        fixed("a", TermKind.RULE, "completion", -1.0, {"t1": -1.0}),
        fixed("b", TermKind.RULE, "efficiency", -0.4, {"t1": -0.4}),
        fixed("c", TermKind.JUDGE, "experience", 0.75, {}),
        fixed("d", TermKind.RULE, "long_term", 1.0, {}),
    ]
    v = assemble(session, rules, results, {}, T0)
    # weights: completion 2, efficiency 0.5, risk 1, experience 1, long_term 0.5
    assert v.layers["completion"].contribution == pytest.approx(2.0 * -1.0)
    assert v.session_reward == pytest.approx(2.0 * -1.0 + 0.5 * -0.4 + 1.0 * 0.75)  # = -1.45
    assert v.long_term_reward == pytest.approx(-1.45 + 0.5 * 1.0)  # = -0.95
    assert v.step_rewards == pytest.approx({"t1": 2.0 * -1.0 + 0.5 * -0.4})  # = -2.2
    assert [t.name for t in v.terms] == ["a", "b", "c", "d"]


def test_assembly_with_normalisation(tmp_path: Path) -> None:
    rules = ruleset(tmp_path, normalise=True)
    session = build([tool("t1", status=CallStatus.ERROR)])
    results = [fixed("a", TermKind.RULE, "completion", -1.0, {"t1": -1.0})]
    stats = {"completion": RunningStats().update(0.0).update(-4.0)}  # mean -2, variance 4: σ = 2
    v = assemble(session, rules, results, stats, T0)
    layer = v.layers["completion"]
    assert layer.raw == -1.0
    assert layer.mean == pytest.approx(-1 / 3)  # the centre: 2 · -2 / (2 + 10)
    assert layer.normalised == pytest.approx((-1.0 + 1 / 3) / 2)  # (raw - centre) / σ
    assert layer.scale == pytest.approx(2.0)
    assert v.step_rewards == pytest.approx({"t1": 2.0 * -1.0 / 2.0})  # w · a / σ, not centred
    high = assemble(session, rules, [fixed("a", TermKind.RULE, "completion", 9.0, {})], stats, T0)
    assert high.layers["completion"].normalised == 2.0  # (9 + 1/3) / 2 = 4.67, clipped to clip = 2
    assert high.session_reward == pytest.approx(2.0 * 2.0)


def test_three_layer_scheme_groups_by_kind(tmp_path: Path) -> None:
    rules = ruleset(tmp_path, scheme="three_layer")
    session = build()
    results = [
        fixed("a", TermKind.RULE, "completion", -1.0, {}),
        fixed("b", TermKind.RULE, "long_term", 1.0, {}),
        fixed("c", TermKind.JUDGE, "experience", -0.2, {}),
        fixed("d", TermKind.MODEL, "experience", 0.5, {}),
    ]
    v = assemble(session, rules, results, {}, T0)
    assert v.scheme is Scheme.THREE_LAYER
    assert {k: x.raw for k, x in v.layers.items()} == {"rule": 0.0, "model": 0.5, "judge": -0.2}
    assert v.session_reward == pytest.approx(1.0 * 0.0 + 0.5 * 0.5 + 2.0 * -0.2)  # = -0.15
    assert v.long_term_reward == v.session_reward  # no long-term layer in this scheme


def test_vector_from_real_terms_round_trips_through_json(tmp_path: Path) -> None:
    rules = ruleset(tmp_path)
    rating = feedback(FeedbackType.HUMAN_RATING, 4.0, "fine", anchor=Anchor(call_id="t1"))
    session = build([tool("t1", status=CallStatus.ERROR)], [rating])
    ctx = default_context()
    results = [(t, t.fn(session, ctx)) for t in rules.terms]
    v = assemble(session, rules, results, {}, datetime(2025, 3, 2, tzinfo=UTC))
    assert v.rating == 4.0
    assert v.session_version == session.state_version
    assert v.step_rewards == pytest.approx({"t1": 2.0 * -1.0 + 1.0 * 0.75})  # failure + anchored rating
    again = RewardVector.model_validate_json(v.model_dump_json())
    assert again == v
    assert RewardVector.model_validate(v.model_dump(mode="json")) == v
    assert all(math.isfinite(x) for x in again.step_rewards.values())
