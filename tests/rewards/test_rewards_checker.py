"""check_reward_term: built-in terms and shipped rules pass; each kind of broken term fails with a fix."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from sessionrl.rewards.checker import TermCheckError, check_reward_term, sample_sessions
from sessionrl.rewards.rules import load_rules
from sessionrl.rewards.terms import BUILTIN_TERMS, ScoringContext, TermResult
from sessionrl.session import FeedbackType, Session

SESSIONS = sample_sessions()


def test_the_samples_exercise_what_terms_react_to() -> None:
    kinds = {f.type for s in SESSIONS for f in s.feedback}
    assert {FeedbackType.HUMAN_RATING, FeedbackType.AUTO_VALIDATION} <= kinds
    assert any(f.comment for s in SESSIONS for f in s.feedback)
    assert any(c.status != "success" for s in SESSIONS for c in s.tool_calls)


@pytest.mark.parametrize("name", sorted(BUILTIN_TERMS))
def test_builtin_terms_conform(name: str) -> None:
    check_reward_term(BUILTIN_TERMS[name].fn, SESSIONS)


@pytest.mark.parametrize("term", load_rules().terms, ids=lambda t: t.name)
def test_shipped_rules_conform(term: object) -> None:
    check_reward_term(term.fn, SESSIONS)  # type: ignore[attr-defined]


def returns_float(session: Session, ctx: ScoringContext) -> float:
    return 1.0


def returns_nan(session: Session, ctx: ScoringContext) -> TermResult:
    return TermResult(math.nan, {}, "nan")


def credits_a_stranger(session: Session, ctx: ScoringContext) -> TermResult:
    return TermResult(1.0, {"not-a-call": 1.0}, "who?")


def credits_inf_to_a_step(session: Session, ctx: ScoringContext) -> TermResult:
    steps = {c.call_id: math.inf for c in session.tool_calls[:1]}
    return TermResult(0.0, steps, "inf step")


def mutates(session: Session, ctx: ScoringContext) -> TermResult:
    session.metadata["touched"] = True
    return TermResult(0.0, {}, "touched the session")


_counter = itertools.count()


def random_term(session: Session, ctx: ScoringContext) -> TermResult:
    return TermResult(float(next(_counter)), {}, "changes every call")


def no_explanation(session: Session, ctx: ScoringContext) -> TermResult:
    return TermResult(0.0, {}, " ")


def rambles(session: Session, ctx: ScoringContext) -> TermResult:
    return TermResult(0.0, {}, "x" * 5000)


def one_argument(session: Session) -> TermResult:
    return TermResult(0.0, {}, "x")


def needs_a_key(session: Session, ctx: ScoringContext) -> TermResult:
    return TermResult(float(session.metadata["refund_total"]), {}, "refunded")


@pytest.mark.parametrize(
    ("term", "message"),
    [
        (returns_float, "return TermResult"),
        (returns_nan, "finite"),
        (credits_a_stranger, "not call ids"),
        (credits_inf_to_a_step, "steps["),
        (mutates, "terms are pure"),
        (random_term, "must not depend on randomness"),
        (no_explanation, "gave no explanation"),
        (rambles, "keep it under"),
        (one_argument, "must accept exactly (session, ctx)"),
        (needs_a_key, "raised KeyError: 'refund_total'"),
        ("not a function", "not callable"),
    ],
)
def test_broken_terms_fail_with_a_fix(term: object, message: str) -> None:
    sessions = [s for s in SESSIONS if s.tool_calls][:3]
    with pytest.raises(
        TermCheckError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        check_reward_term(term, [s.model_copy(deep=True) for s in sessions])  # type: ignore[arg-type]


def test_random_seeded_per_call_is_still_caught() -> None:
    def jitter(session: Session, ctx: ScoringContext) -> TermResult:
        return TermResult(random.random(), {}, "jitter")

    with pytest.raises(TermCheckError, match="randomness"):
        check_reward_term(jitter, SESSIONS[:2])
