"""A/B and canary analysis: two policy versions compared on the sessions each served.

A version's sessions are those whose recorded route (`metadata["route"]`, see `routing`) names it, found
by the tag routing gives them (`<policy>@v<version>`), optionally only those created in a time window or of
one scenario. For each metric the comparison gives both arms' values, the difference B − A with a 95%
interval, and a p-value:

    success    task_outcome verdicts (judged sessions only)   two-proportion z (McNemar when tasks match)
    tcsr       tool calls that succeeded, pooled per arm      two-proportion z
    dvr        plans that passed the guards                   two-proportion z
    spt        tool and LLM calls per session                 bootstrap
    risk       sessions with a risk flag (a refused call, a hallucination penalty, a provenance flag)
                                                              two-proportion z
    rating     human ratings (1-5)                            bootstrap
    coherence  1 / (1 + the judge's penalties) over the session's comments, for commented sessions
                                                              bootstrap

When at least `PAIRED_MIN` tasks were served by both arms, success is compared on those tasks, paired
(McNemar on the tasks only one arm solved, bootstrap of per-task differences). `Comparison.variables()`
gives the numbers a canary rule reads (`sessionrl.ops.rules`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from sessionrl.episodes.verdict import task_success
from sessionrl.eval.metrics import dag_validity_rate
from sessionrl.eval.report import LOWER_IS_BETTER
from sessionrl.eval.significance import (
    bootstrap_diff_ci,
    paired_comparison,
    two_proportion_p,
)
from sessionrl.ops.routing import recorded_route, version_tag
from sessionrl.ops.rules import METRICS
from sessionrl.rewards.judge import JudgeRunner, PenaltyTable, load_penalty_table
from sessionrl.session import CallStatus, FeedbackType, Session
from sessionrl.store import SessionQuery, SessionStore

PAIRED_MIN = 5
"""Tasks both arms served before success is compared paired."""

COMMENTED = frozenset({FeedbackType.HUMAN_RATING, FeedbackType.COMMENT})
"""Feedback types whose comments the judge reads for coherence."""


class MetricResult(BaseModel):
    """One metric on both arms: values, sample sizes, B − A with its interval, the test and its p-value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    a: float | None
    b: float | None
    n_a: int
    n_b: int
    diff: float | None
    ci: tuple[float, float] | None
    p_value: float | None
    test: str

    @property
    def drop(self) -> float:
        """How much worse B is than A (0.0 when either arm has no data)."""
        return 0.0 if self.diff is None else self.diff


class Comparison(BaseModel):
    """Versions A (baseline) and B of one policy compared on the sessions each served."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str
    a: int
    b: int
    n_a: int
    n_b: int
    paired_tasks: int
    metrics: dict[str, MetricResult]

    def variables(self) -> dict[str, float]:
        """The names a canary rule reads: `<m>_drop`, `<m>_gain`, `<m>_p`, `<m>_a`, `<m>_b`, `n_a`, `n_b`."""
        out: dict[str, float] = {"n_a": float(self.n_a), "n_b": float(self.n_b)}
        for name, m in self.metrics.items():
            diff = 0.0 if m.diff is None else m.diff
            drop = diff if name in LOWER_IS_BETTER else -diff  # B − A where a rise is a regression
            out |= {f"{name}_drop": drop, f"{name}_gain": -drop, f"{name}_p": _or(m.p_value, 1.0)}
            out |= {f"{name}_a": _or(m.a, 0.0), f"{name}_b": _or(m.b, 0.0)}
        return out


def _or(value: float | None, default: float) -> float:
    return default if value is None or math.isnan(value) else value


def served_sessions(
    store: SessionStore,
    policy: str,
    version: int,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    scenario: str | None = None,
) -> list[Session]:
    """Sessions whose recorded route is this version (created in `[since, until)`, of `scenario`)."""
    query = SessionQuery(
        tags=(version_tag(policy, version),),
        created_after=since,
        created_before=until,
        scenario=scenario,
        limit=100_000,
    )
    sessions = [store.get(row.session_id) for row in store.query(query)]
    return [s for s in sessions if (r := recorded_route(s)) is not None and r.version == version]


def compare_versions(
    store: SessionStore,
    policy: str,
    a: int,
    b: int,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    scenario: str | None = None,
    table: PenaltyTable | None = None,
) -> Comparison:
    """Compare versions `a` and `b` of `policy` on the sessions each served (see the module doc)."""
    first = served_sessions(store, policy, a, since=since, until=until, scenario=scenario)
    second = served_sessions(store, policy, b, since=since, until=until, scenario=scenario)
    return compare_sessions(policy, a, b, first, second, table=table)


def compare_sessions(
    policy: str,
    a: int,
    b: int,
    first: Sequence[Session],
    second: Sequence[Session],
    *,
    table: PenaltyTable | None = None,
) -> Comparison:
    """The comparison of two sets of sessions (each metric as the module doc says)."""
    coherence = _coherence(table or load_penalty_table())
    metrics = {
        "success": _success(first, second),
        "tcsr": _proportion(first, second, _tool_calls),
        "dvr": _proportion(first, second, _plans),
        "spt": _means(first, second, lambda s: [float(len(s.tool_calls) + len(s.llm_calls))]),
        "risk": _proportion(first, second, lambda s: (int(_risky(s)), 1)),
        "rating": _means(first, second, _ratings),
        "coherence": _means(first, second, coherence),
    }
    assert set(metrics) == set(METRICS)
    paired = len(_by_task(first).keys() & _by_task(second).keys())
    return Comparison(
        policy=policy, a=a, b=b, n_a=len(first), n_b=len(second), paired_tasks=paired, metrics=metrics
    )


Counts = Callable[[Session], tuple[int, int]]
"""Successes and trials a session adds to a proportion."""


def _proportion(first: Sequence[Session], second: Sequence[Session], counts: Counts) -> MetricResult:
    sa, na = map(sum, zip(*(counts(s) for s in first), strict=True)) if first else (0, 0)
    sb, nb = map(sum, zip(*(counts(s) for s in second), strict=True)) if second else (0, 0)
    if na == 0 or nb == 0:
        return _empty(na, nb, "two_proportion", sa / na if na else None, sb / nb if nb else None)
    pa, pb = sa / na, sb / nb
    ci = bootstrap_diff_ci([1.0] * sa + [0.0] * (na - sa), [1.0] * sb + [0.0] * (nb - sb))
    return MetricResult(
        a=pa,
        b=pb,
        n_a=na,
        n_b=nb,
        diff=pb - pa,
        ci=(ci.low, ci.high),
        p_value=two_proportion_p(sa, na, sb, nb),
        test="two_proportion",
    )


def _means(
    first: Sequence[Session], second: Sequence[Session], values: Callable[[Session], list[float]]
) -> MetricResult:
    xa = [v for s in first for v in values(s)]
    xb = [v for s in second for v in values(s)]
    if not xa or not xb:
        mean_a = sum(xa) / len(xa) if xa else None
        mean_b = sum(xb) / len(xb) if xb else None
        return _empty(len(xa), len(xb), "bootstrap", mean_a, mean_b)
    ci = bootstrap_diff_ci(xa, xb)
    # two-sided bootstrap p: twice the share of resampled differences on the far side of zero
    p = 1.0 if ci.estimate == 0.0 else min(1.0, _tail(xa, xb))
    return MetricResult(
        a=sum(xa) / len(xa),
        b=sum(xb) / len(xb),
        n_a=len(xa),
        n_b=len(xb),
        diff=ci.estimate,
        ci=(ci.low, ci.high),
        p_value=p,
        test="bootstrap",
    )


def _tail(xa: Sequence[float], xb: Sequence[float]) -> float:
    """Two-sided bootstrap p-value of the mean difference: the smallest confidence whose interval
    excludes zero, found by bisection on `bootstrap_diff_ci` (deterministic: its seed is fixed)."""
    low, high = 0.0, 0.999
    for _ in range(12):
        mid = (low + high) / 2
        ci = bootstrap_diff_ci(xa, xb, confidence=max(mid, 1e-6), resamples=500)
        low, high = (mid, high) if ci.excludes_zero() else (low, mid)
    return 1.0 - low


def _success(first: Sequence[Session], second: Sequence[Session]) -> MetricResult:
    tasks_a, tasks_b = _by_task(first), _by_task(second)
    common = tasks_a.keys() & tasks_b.keys()
    if len(common) >= PAIRED_MIN:
        paired = paired_comparison({t: tasks_a[t] for t in common}, {t: tasks_b[t] for t in common})
        return MetricResult(
            a=paired.first_rate,
            b=paired.second_rate,
            n_a=paired.tasks,
            n_b=paired.tasks,
            diff=paired.delta.estimate,
            ci=(paired.delta.low, paired.delta.high),
            p_value=paired.p_value,
            test="mcnemar",
        )
    return _proportion(first, second, _verdict)


def _by_task(sessions: Sequence[Session]) -> dict[str, float]:
    """Per task: the share of its judged sessions that succeeded."""
    verdicts: dict[str, list[bool]] = {}
    for s in sessions:
        ok = task_success(s)
        task = s.metadata.get("task_id")
        if ok is not None and isinstance(task, str):
            verdicts.setdefault(task, []).append(ok)
    return {t: sum(v) / len(v) for t, v in verdicts.items()}


def _verdict(session: Session) -> tuple[int, int]:
    ok = task_success(session)
    return (0, 0) if ok is None else (int(ok), 1)


def _tool_calls(session: Session) -> tuple[int, int]:
    calls = session.tool_calls
    return sum(c.status == CallStatus.SUCCESS for c in calls), len(calls)


def _plans(session: Session) -> tuple[int, int]:
    valid = dag_validity_rate([session])
    return (0, 0) if valid is None else (int(valid == 1.0), 1)


def _risky(session: Session) -> bool:
    flags = {FeedbackType.HALLUCINATION_PENALTY, FeedbackType.PROVENANCE_FLAG}
    refused = any(c.status == CallStatus.REFUSED for c in session.tool_calls)
    return refused or any(f.type in flags for f in session.feedback)


def _ratings(session: Session) -> list[float]:
    return [
        float(f.score)
        for f in session.feedback
        if f.type == FeedbackType.HUMAN_RATING and f.score is not None
    ]


def _coherence(table: PenaltyTable) -> Callable[[Session], list[float]]:
    judge = JudgeRunner()

    def score(session: Session) -> list[float]:
        comments = [f.comment for f in session.feedback if f.comment and f.type in COMMENTED]
        if not comments:
            return []
        penalty = sum(
            abs(table.penalty(c)) for text in comments for c in judge.judge(text, table).corrections
        )
        return [1.0 / (1.0 + penalty)]

    return score


def _empty(n_a: int, n_b: int, test: str, a: float | None, b: float | None) -> MetricResult:
    return MetricResult(a=a, b=b, n_a=n_a, n_b=n_b, diff=None, ci=None, p_value=None, test=test)
