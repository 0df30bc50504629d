"""Reward terms written outside sessionrl, imported by the tests by `module:function` like a user's."""

from __future__ import annotations

from sessionrl.rewards import PythonTerm, ScoringContext, TermKind, TermResult
from sessionrl.session import CallStatus, Session


def failed_lookups(session: Session, ctx: ScoringContext) -> TermResult:
    """-0.5 per failed `db_query` call, credited to that call."""
    steps = {
        c.call_id: -0.5
        for c in session.tool_calls
        if c.tool == "db_query" and c.status is not CallStatus.SUCCESS
    }
    return TermResult(sum(steps.values()), steps, f"{len(steps)} failed lookups")


def answered(session: Session, ctx: ScoringContext) -> TermResult:
    """+1 when the session gave a final output."""
    value = 1.0 if session.final_output is not None else 0.0
    return TermResult(value, {}, "answered" if value else "no answer")


ANSWERED = PythonTerm("answered", answered, TermKind.MODEL)
"""The same term with the kind of a model's signal (its layer in the three-layer scheme)."""


def not_a_result(session: Session, ctx: ScoringContext) -> float:
    """Breaks the term contract: a bare float instead of a TermResult."""
    return 1.0


NOT_CALLABLE = 42
