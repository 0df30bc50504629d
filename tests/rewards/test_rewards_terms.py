"""Every default rule and every Python term on hand-built sessions, with the arithmetic written out."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from rewards_support import EN_COMMENT, ZH_COMMENT, at, build, feedback, plan_of, tool

from sessionrl.rewards.rules import RuleSet, load_rules
from sessionrl.rewards.terms import (
    ScoringContext,
    TermResult,
    anchor_steps,
    discount,
    efficiency,
    judge_correction,
    predicted_rating,
    recovery,
)
from sessionrl.session import Anchor, CallStatus, FeedbackType, Session, ToolCall

FT = FeedbackType


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules()


@pytest.fixture
def rctx(ctx: ScoringContext, rules: RuleSet) -> ScoringContext:
    """The shared context with the default rule file's weights, budgets and λ = 0.01/s."""
    return replace(ctx, params=rules.file)


def run(rules: RuleSet, name: str, session: Session, ctx: ScoringContext) -> TermResult:
    term = next(t for t in rules.terms if t.name == name)
    return term.fn(session, replace(ctx, memo={}))


def test_tool_failure_costs_each_failed_call_its_tool_weight(rules: RuleSet, rctx: ScoringContext) -> None:
    session = build(
        [
            tool("t1", "db_query", CallStatus.ERROR),
            tool("t2", "pdf_parse", CallStatus.TIMEOUT),
            tool("t3", "db_query"),
            tool("t4", "unlisted_tool", CallStatus.REFUSED),
        ]
    )
    result = run(rules, "tool_failure", session, rctx)
    # -1.0 × w(db_query)=1.0, -1.0 × w(pdf_parse)=0.5, -1.0 × default 1.0; t3 succeeded
    assert result.value == pytest.approx(-1.0 - 0.5 - 1.0)
    assert result.steps == {"t1": -1.0, "t2": -0.5, "t4": -1.0}
    assert "3/4" in result.explanation


def test_sla_breach_compares_latency_with_the_tool_budget(rules: RuleSet, rctx: ScoringContext) -> None:
    session = build(
        [
            tool("t1", "db_query", latency_ms=6000.0),  # budget 5000 → breach
            tool("t2", "pdf_parse", latency_ms=9000.0, start=10),  # budget 10000 → fine
            tool("t3", "other", latency_ms=4500.0, start=20),  # default budget 4000 → breach
        ]
    )
    result = run(rules, "sla_breach", session, rctx)
    assert result.value == pytest.approx(-0.2 * 2)  # two breaches × -0.2
    assert result.steps == {"t1": -0.2, "t3": -0.2}


@pytest.mark.parametrize(
    ("score", "expected"), [(4.0, 0.5), (1.0, -1.0), (5.0, 1.0), (2.0, -0.5), (3.0, 0.0)]
)
def test_human_rating_maps_one_to_five_onto_minus_one_to_one(
    rules: RuleSet, rctx: ScoringContext, score: float, expected: float
) -> None:
    session = build(fb=[feedback(FT.HUMAN_RATING, score, delay=3600.0)])
    result = run(rules, "human_rating", session, rctx)
    assert result.value == pytest.approx(expected)  # (score - 3) / 2, not discounted
    assert result.steps == {}  # a session-level rating names no step


def test_auto_validation_is_discounted_by_its_delay(rules: RuleSet, rctx: ScoringContext) -> None:
    passed = feedback(FT.AUTO_VALIDATION, 1.0, anchor=Anchor(call_id="t1"), delay=100.0)
    failed = feedback(FT.AUTO_VALIDATION, 0.0, anchor=Anchor(call_id="t2"), occurred=200.0)
    session = build([tool("t1"), tool("t2", start=5)], [passed, failed])
    result = run(rules, "auto_validation", session, rctx)
    expected = 0.3 * math.exp(-0.01 * 100.0)  # 0.3 · e^-1 = 0.110364; the failed one does not fire
    assert result.value == pytest.approx(expected)
    assert result.steps == pytest.approx({"t1": expected})


def test_hallucination_splits_over_the_sub_goal_calls(rules: RuleSet, rctx: ScoringContext) -> None:
    plan = plan_of(("g1", "db_query"), ("g2", "pdf_parse"))
    calls = [
        tool("t1", subgoal_id="g1"),
        tool("t2", subgoal_id="g1", start=3),
        tool("t3", "pdf_parse", subgoal_id="g2"),
    ]
    session = build(calls, [feedback(FT.HALLUCINATION_PENALTY, anchor=Anchor(subgoal_id="g1"))], plan=plan)
    result = run(rules, "hallucination", session, rctx)
    assert result.value == -2.0
    assert result.steps == {"t1": -1.0, "t2": -1.0}  # -2.0 / 2 calls of g1


def test_provenance_flag_at_a_time_goes_to_the_call_running_then(
    rules: RuleSet, rctx: ScoringContext
) -> None:
    calls = [tool("t1", start=1), tool("t2", start=10), tool("t3", start=20)]
    session = build(calls, [feedback(FT.PROVENANCE_FLAG, anchor=Anchor(at=at(15)))])
    result = run(rules, "provenance_flag", session, rctx)
    assert result.value == -0.5
    assert result.steps == {"t2": -0.5}  # t2 started at 10 s, the last start before 15 s


def test_plan_rejection_is_session_level(rules: RuleSet, rctx: ScoringContext) -> None:
    session = build(fb=[feedback(FT.PLAN_REJECTION)])
    result = run(rules, "plan_rejection", session, rctx)
    assert (result.value, result.steps) == (-1.0, {})


def test_task_outcome_is_plus_or_minus_one_discounted(rules: RuleSet, rctx: ScoringContext) -> None:
    solved = build(fb=[feedback(FT.TASK_OUTCOME, 1.0)])
    assert run(rules, "task_outcome", solved, rctx).value == pytest.approx(1.0)  # (2·1 - 1) · e^0
    failed = build(fb=[feedback(FT.TASK_OUTCOME, 0.0, delay=50.0)])
    assert run(rules, "task_outcome", failed, rctx).value == pytest.approx(
        -math.exp(-0.5)
    )  # (2·0 - 1) · e^-0.5


def test_rules_do_not_fire_without_their_events(rules: RuleSet, rctx: ScoringContext) -> None:
    session = build([tool("t1")])
    for term in rules.terms:
        if term.name not in ("efficiency", "judge_correction", "predicted_rating"):
            assert run(rules, term.name, session, rctx).value == 0.0, term.name


def test_efficiency_against_the_best_known_step_count(ctx: ScoringContext) -> None:
    session = build([tool(f"t{i}", start=i) for i in range(4)])
    result = efficiency(session, replace(ctx, best_steps={"demo": 3}))
    assert result.value == pytest.approx(3 / 4 - 1)  # best / steps - 1 = -0.25
    assert result.steps == pytest.approx({f"t{i}": -0.25 / 4 for i in range(4)})
    assert efficiency(session, ctx).value == 0.0  # no best known yet


def outage(call_id: str, name: str, start: float) -> ToolCall:
    """A call that failed transiently (a retryable UNAVAILABLE)."""
    failed = tool(call_id, name, CallStatus.ERROR, start=start)
    return failed.model_copy(update={"error_code": "UNAVAILABLE", "retryable": True})


def test_recovery_credits_the_call_again_after_an_outage_only(ctx: ScoringContext) -> None:
    session = build(
        [
            outage("a1", "stock", start=1),
            tool("a2", "stock", start=2),  # the same tool again, through: a recovery
            outage("b1", "refund", start=3),
            tool("b2", "sms", start=4),  # another tool after the outage: none
            tool("c1", "sms", CallStatus.ERROR, start=5),  # a failure that is not transient
            tool("c2", "sms", start=6),  # so calling again is no recovery
            outage("d1", "erp", start=7),
            outage("d2", "erp", start=8),  # again, and out again: none yet
            tool("d3", "erp", start=9),
        ]
    )
    result = recovery(session, ctx)
    assert result.steps == {"a2": 1.0, "d3": 1.0}
    assert result.value == 2.0
    assert recovery(build([tool("t1")]), ctx).value == 0.0


def test_judge_correction_prices_the_worked_example(ctx: ScoringContext) -> None:
    session = build(fb=[feedback(FT.HUMAN_RATING, 4.0, ZH_COMMENT)])
    result = judge_correction(session, ctx)
    assert result.value == pytest.approx(-0.2)  # chronic_disease_exclusion / high
    assert "chronic_disease_exclusion/high" in result.explanation
    assert "[offline]" in result.explanation


def test_judge_correction_sums_comments_and_credits_anchors(ctx: ScoringContext) -> None:
    zh = feedback(FT.COMMENT, None, ZH_COMMENT, anchor=Anchor(call_id="t1"), feedback_id="f1")
    en = feedback(FT.HUMAN_RATING, 3.0, EN_COMMENT, feedback_id="f2")
    result = judge_correction(build([tool("t1")], [zh, en]), ctx)
    assert result.value == pytest.approx(-0.4)  # -0.2 per comment
    assert result.steps == pytest.approx({"t1": -0.2})  # only the anchored comment names a step


def test_judge_correction_without_a_judge_is_zero(ctx: ScoringContext) -> None:
    session = build(fb=[feedback(FT.COMMENT, None, ZH_COMMENT)])
    assert judge_correction(session, replace(ctx, judge=None)).value == 0.0


class Fixed:
    def __init__(self, rating: float) -> None:
        self.rating = rating

    def predict_rating(self, session: Session) -> float:
        return self.rating


@pytest.mark.parametrize(("predicted", "expected"), [(3.4, 0.2), (7.0, 1.0), (0.0, -1.0)])
def test_predicted_rating_fills_in_for_unrated_sessions(
    ctx: ScoringContext, predicted: float, expected: float
) -> None:
    unrated = build([tool("t1")])
    # (clip(r̂, 1, 5) - 3) / 2, as a person's rating
    assert predicted_rating(unrated, replace(ctx, rating_model=Fixed(predicted))).value == pytest.approx(
        expected
    )
    rated = build(fb=[feedback(FT.HUMAN_RATING, 2.0)])
    assert predicted_rating(rated, replace(ctx, rating_model=Fixed(predicted))).value == 0.0
    assert predicted_rating(unrated, ctx).value == 0.0  # no model


def test_discount_uses_the_arrival_delay_only() -> None:
    on_time = feedback(FT.AUTO_VALIDATION, 1.0, occurred=5000.0)
    assert discount(on_time, 0.01) == 1.0  # Δt = 0, however late in the session it happened
    late = feedback(FT.AUTO_VALIDATION, 1.0, delay=30.0)
    assert discount(late, 0.01) == pytest.approx(math.exp(-0.3))  # e^(-0.01 · 30)
    early = late.model_copy(update={"received_at": at(0)})  # clock skew: arrived "before" it happened
    assert discount(early, 0.01) == 1.0


def test_anchor_steps_for_each_anchor_kind() -> None:
    session = build([tool("t1", subgoal_id="g1", start=2)], plan=plan_of(("g1", "db_query")))
    assert anchor_steps(session, feedback(FT.COMMENT, anchor=Anchor(call_id="t1")), 1.0) == {"t1": 1.0}
    assert anchor_steps(session, feedback(FT.COMMENT, anchor=Anchor(subgoal_id="g1")), 1.0) == {"t1": 1.0}
    assert anchor_steps(session, feedback(FT.COMMENT, anchor=Anchor(at=at(1))), 1.0) == {}  # before any call
    assert anchor_steps(session, feedback(FT.COMMENT), 1.0) == {}
