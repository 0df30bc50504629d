"""Reward terms: pure functions `(session, ctx) -> TermResult`, and the context they read.

A term looks at one session and says how much reward it earns, which steps (call ids) earned it, and why,
in a sentence. Terms never change the session and give the same answer for the same inputs; the
`check_reward_term` checker holds them to that. CEL rules from the rule file become terms
(`sessionrl.rewards.rules`); four terms are written in Python here: `efficiency`, `recovery`,
`judge_correction` and `predicted_rating`. Terms of your own are plain functions too: give them to
`RewardEngine(terms=...)`, or name them in the rule file as `module:function` (see
`sessionrl.rewards.catalog`).

Temporal discounting multiplies a feedback-driven value by exp(-λ·Δt), where Δt is how late the feedback
reached us: `received_at - occurred_at`, in seconds, never negative. This is defined for every feedback
item (anchored or not) and does not depend on how long the session itself ran.

>>> from datetime import timedelta
>>> from sessionrl.session import Feedback, FeedbackType
>>> f = Feedback(type=FeedbackType.AUTO_VALIDATION, score=1.0)
>>> late = f.model_copy(update={"received_at": f.occurred_at + timedelta(seconds=100)})
>>> round(discount(late, 0.01), 4)  # exp(-0.01 * 100)
0.3679
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from sessionrl.rewards.aggregate import Aggregate, Combined, combine, combine_feedback
from sessionrl.rewards.judge.runner import JudgeRunner
from sessionrl.rewards.judge.table import PenaltyTable
from sessionrl.rewards.layers import TermKind
from sessionrl.session.model import CallStatus, Feedback, FeedbackType, Session, SessionState


@dataclass(frozen=True)
class TermResult:
    """What one term gives one session: a value, its attribution to steps by call id, and why."""

    value: float
    steps: Mapping[str, float] = field(default_factory=dict)
    explanation: str = ""


Labeller = Callable[[Feedback], str]


def _by_id(feedback: Feedback) -> str:
    return feedback.feedback_id


class Params(BaseModel):
    """Settings terms read: discounting, tool weights and latency budgets (top-level keys of a rule file)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    discount_per_s: float = Field(default=0.01, ge=0, description="λ of exp(-λ·Δt), per second.")
    tool_weights: dict[str, float] = Field(default_factory=dict, description="Weight per tool name.")
    default_tool_weight: float = Field(default=1.0, description="Weight of tools not listed.")
    latency_budget_ms: dict[str, float] = Field(
        default_factory=dict, description="Latency budget per tool (the contract's SLA), in ms."
    )
    default_latency_budget_ms: float | None = Field(default=None, gt=0, description="Budget of others.")
    aggregate: Aggregate = Field(
        default=Aggregate.MEAN,
        description="How values of one feedback type on one anchor from several sources combine: mean,"
        " median, or weighted (by source_weights); see `sessionrl.rewards.aggregate`.",
    )
    source_weights: dict[str, Annotated[float, Field(gt=0)]] = Field(
        default_factory=dict, description="Weight per source (annotator, validator, judge) for `weighted`."
    )
    default_source_weight: float = Field(default=1.0, gt=0, description="Weight of sources not listed.")

    def tool_weight(self, tool: str) -> float:
        """The weight of a tool."""
        return self.tool_weights.get(tool, self.default_tool_weight)

    def latency_budget(self, tool: str) -> float:
        """The latency budget of a tool in ms; infinite when it has none."""
        budget = self.latency_budget_ms.get(tool, self.default_latency_budget_ms)
        return math.inf if budget is None else budget

    def combine(self, scored: Iterable[tuple[Feedback, float]], label: Labeller = _by_id) -> list[Combined]:
        """Feedback values grouped by type and anchor, each group combined over its sources by
        `aggregate` (see `sessionrl.rewards.aggregate.combine_feedback`)."""
        rule, weights = self.aggregate, self.source_weights
        return combine_feedback(scored, rule, weights, self.default_source_weight, label)


class RatingPredictor(Protocol):
    """A model of the rating a person would give (1–5), for sessions nobody rated."""

    def predict_rating(self, session: Session) -> float: ...


@dataclass(frozen=True)
class ScoringContext:
    """Everything a term may read besides the session. One context serves one scoring of one session."""

    now: datetime
    params: Params = field(default_factory=Params)
    best_steps: Mapping[str, int] = field(default_factory=dict)
    """Fewest tool calls a successful session needed, per scenario (see `scenario_key`)."""
    penalties: PenaltyTable | None = None
    judge: JudgeRunner | None = None
    rating_model: RatingPredictor | None = None
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    """Scratch space terms may share within one scoring (e.g. CEL variables); never part of a result."""


TermFn = Callable[[Session, ScoringContext], TermResult]


@dataclass(frozen=True)
class PythonTerm:
    """A term written in Python that a rule file switches on by name, with the kind of its signal.

    The kind is the term's layer in the three-layer scheme; in the five-layer scheme the rule file gives
    the layer.
    """

    name: str
    fn: TermFn
    kind: TermKind = TermKind.RULE


@dataclass(frozen=True)
class Term:
    """A term as a rule-set uses it: its name, function, kind and five-layer layer."""

    name: str
    fn: TermFn
    kind: TermKind
    layer: str


def discount(feedback: Feedback, lam: float) -> float:
    """exp(-λ·Δt) with Δt = received_at - occurred_at in seconds (0 when it arrived before it happened)."""
    delay = max(0.0, (feedback.received_at - feedback.occurred_at).total_seconds())
    return math.exp(-lam * delay)


def anchor_steps(session: Session, feedback: Feedback, value: float) -> dict[str, float]:
    """Spread a feedback-driven value over the steps its anchor names.

    A call anchor gets it all; a sub-goal anchor splits it evenly over that sub-goal's tool calls; a time
    anchor gives it to the last call that started at or before that time; a session anchor names no step.
    """
    anchor = feedback.anchor
    if anchor.call_id is not None:
        return {anchor.call_id: value}
    if anchor.subgoal_id is not None:
        ids = [c.call_id for c in session.tool_calls if c.subgoal_id == anchor.subgoal_id]
        return {i: value / len(ids) for i in ids} if ids else {}
    if anchor.at is not None:
        calls = [(c.started_at, c.call_id) for c in session.tool_calls]
        calls += [(c.started_at, c.call_id) for c in session.llm_calls]
        before = [c for c in calls if c[0] <= anchor.at]
        return {max(before)[1]: value} if before else {}
    return {}


def add_steps(total: dict[str, float], steps: Mapping[str, float]) -> None:
    """Add one attribution into a running total, key by key."""
    for call_id, v in steps.items():
        total[call_id] = total.get(call_id, 0.0) + v


def scenario_key(session: Session) -> str:
    """The key of a session's scenario in `best_steps`."""
    return session.scenario or "default"


@dataclass(frozen=True)
class Rating:
    """A session's human rating (1–5): each source's latest scored rating, combined by the rule file's
    `aggregate`, and the sources it came from."""

    score: float
    sources: tuple[str, ...]


def human_rating(session: Session, params: Params | None = None) -> Rating | None:
    """The session's human rating combined over its raters (`params.aggregate`, mean by default), or None
    when nobody gave a score. A rater who rated several anchors counts once, with their latest."""
    latest: dict[str, Feedback] = {}
    for f in session.feedback:
        rated = f.type is FeedbackType.HUMAN_RATING and f.score is not None
        if rated and (f.source not in latest or f.occurred_at >= latest[f.source].occurred_at):
            latest[f.source] = f
    if not latest:
        return None
    p = params or Params()
    pairs = [(source, float(f.score or 0.0)) for source, f in latest.items()]
    return Rating(combine(pairs, p.aggregate, p.source_weights, p.default_source_weight), tuple(latest))


def efficiency(session: Session, ctx: ScoringContext) -> TermResult:
    """best / steps - 1: 0 at the best known tool-call count, -0.5 at twice as many; spread over the calls."""
    steps = len(session.tool_calls)
    best = ctx.best_steps.get(scenario_key(session))
    if not steps or not best:
        return TermResult(0.0, {}, "no tool calls" if not steps else "no best step count known yet")
    value = best / steps - 1.0
    share = {c.call_id: value / steps for c in session.tool_calls}
    return TermResult(value, share, f"{steps} tool calls against a best of {best}")


def recovery(session: Session, ctx: ScoringContext) -> TermResult:
    """+1 for each call that went through right after the same tool failed transiently (a retryable
    error), credited to that call: calling again is the right move after an outage, and a rule cannot see
    the call before its own."""
    calls = sorted(session.tool_calls, key=lambda c: c.started_at)
    steps = {
        after.call_id: 1.0
        for before, after in itertools.pairwise(calls)
        if before.retryable
        and before.status is not CallStatus.SUCCESS
        and after.tool == before.tool
        and after.status is CallStatus.SUCCESS
    }
    return TermResult(float(len(steps)), steps, f"{len(steps)} outage(s) recovered by calling again")


def judge_correction(session: Session, ctx: ScoringContext) -> TermResult:
    """Sum of the penalties of the corrections every commented feedback item asks for."""
    if ctx.judge is None or ctx.penalties is None:
        return TermResult(0.0, {}, "no judge configured")
    penalties, judge = ctx.penalties, ctx.judge
    scored, found = list[tuple[Feedback, float]](), dict[str, str]()
    for feedback in session.feedback:
        if not feedback.comment:
            continue
        judgement = judge.judge(feedback.comment, penalties)
        scored.append((feedback, sum(penalties.penalty(c) for c in judgement.corrections)))
        corrections = ", ".join(
            f"{c.missing_element}/{c.severity} {penalties.penalty(c):+g}" for c in judgement.corrections
        )
        note = f"{feedback.feedback_id} by {feedback.source}: {corrections or 'nothing missing'}"
        note += f" [{judgement.backend}]"
        if judgement.fallback is not None:
            note += f" (fallback: {judgement.fallback})"
        found[feedback.feedback_id] = note
    total, steps, notes = 0.0, dict[str, float](), list(found.values())
    for group in ctx.params.combine(scored):
        total += group.value
        add_steps(steps, anchor_steps(session, group.item, group.value))
        if len(group.sources) > 1:
            notes.append(group.note)
    return TermResult(total, steps, "; ".join(notes) or "no comments")


def predicted_rating(session: Session, ctx: ScoringContext) -> TermResult:
    """(r̂ - 3) / 2 for the rating r̂ a reward model predicts, clipped to [1, 5], as the `human_rating` rule
    maps a person's; only for unrated sessions."""
    if human_rating(session) is not None:
        return TermResult(0.0, {}, "rated by a person")
    if ctx.rating_model is None:
        return TermResult(0.0, {}, "no reward model")
    rating = min(5.0, max(1.0, ctx.rating_model.predict_rating(session)))
    return TermResult((rating - 3.0) / 2.0, {}, f"predicted rating {rating:.2f}")


BUILTIN_TERMS: dict[str, PythonTerm] = {
    t.name: t
    for t in (
        PythonTerm("efficiency", efficiency, TermKind.RULE),
        PythonTerm("recovery", recovery, TermKind.RULE),
        PythonTerm("judge_correction", judge_correction, TermKind.JUDGE),
        PythonTerm("predicted_rating", predicted_rating, TermKind.MODEL),
    )
}
"""Python terms every rule file can switch on under `terms:`, by name."""


def succeeded(session: Session) -> bool:
    """Whether a session counts as solved for `best_steps`: it finished with an answer and every tool
    sub-goal got a successful call."""
    if session.state not in (SessionState.FINISHED, SessionState.ARCHIVED) or session.final_output is None:
        return False
    ok = {c.subgoal_id for c in session.tool_calls if c.status is CallStatus.SUCCESS}
    goals = session.plan.subgoals if session.plan is not None else ()
    return all(g.id in ok for g in goals if g.tool is not None)
