"""Conformance checks for reward terms: run `check_reward_term` on any term before trusting it.

A term must accept `(session, ctx)`, return a `TermResult` with a finite value, finite step rewards keyed by
real call ids of the session and a short explanation, give the same result twice, and leave the session
as it was. Each check is a small function whose message says how to fix the problem.

>>> from sessionrl.rewards.terms import efficiency
>>> check_reward_term(efficiency)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from functools import partial

from sessionrl.errors import SessionRLError
from sessionrl.rewards.judge.runner import JudgeRunner
from sessionrl.rewards.judge.table import PenaltyTable, load_penalty_table
from sessionrl.rewards.terms import ScoringContext, TermFn, TermResult
from sessionrl.session.codec import digest
from sessionrl.session.events import fold
from sessionrl.session.model import Session
from sessionrl.store.synthetic import session_events

MAX_EXPLANATION = 1000


class TermCheckError(SessionRLError):
    """A reward term broke the term contract."""


def sample_sessions(n: int = 40, seed: int = 7) -> list[Session]:
    """Generated sessions with failures, retries, ratings, comments in two languages and anchored feedback."""
    return [fold(session_events(seed, i)) for i in range(n)]


def default_context(penalties: PenaltyTable | None = None) -> ScoringContext:
    """A fresh context with the (shipped) penalty table, the offline judge and known best step counts."""
    return ScoringContext(
        now=datetime(2025, 6, 1, tzinfo=UTC),
        best_steps={"clinical_triage": 3, "customer_service": 2, "finance_research": 3},
        penalties=penalties or load_penalty_table(),
        judge=JudgeRunner(),
    )


def check_reward_term(
    term: TermFn,
    sessions: Sequence[Session] | None = None,
    context: Callable[[], ScoringContext] | None = None,
) -> None:
    """Raise `TermCheckError` at the first way `term` breaks the contract, on any of `sessions`.

    `context` makes a fresh context per call (default: `default_context` around the shipped table).
    """
    name = getattr(term, "__name__", type(term).__name__)
    check_signature(term, name)
    if context is None:
        table = load_penalty_table()
        context = partial(default_context, table)
    for session in sessions if sessions is not None else sample_sessions():
        before = digest(session)
        result = call_term(term, session, context(), name)
        check_result_type(result, name)
        check_finite(result, name, session)
        check_attribution(result, name, session)
        check_explanation(result, name)
        check_unchanged(before, session, name)
        check_deterministic(result, call_term(term, session, context(), name), name, session)


def call_term(term: TermFn, session: Session, ctx: ScoringContext, name: str) -> TermResult:
    """The term's answer on one session; an exception it raises is a broken contract."""
    try:
        return term(session, ctx)
    except Exception as exc:  # a term may fail in any way; each is reported the same
        raise TermCheckError(
            f"{name} raised {type(exc).__name__}: {exc} on session {session.session_id!r}; a term must "
            "answer for any session (return TermResult(0.0, {}, 'does not apply') when nothing applies)"
        ) from exc


def check_signature(term: TermFn, name: str) -> None:
    """The term is callable with two positional arguments: the session and the context."""
    if not callable(term):
        raise TermCheckError(f"{name} is not callable; a term is a function (session, ctx) -> TermResult")
    try:
        inspect.signature(term).bind(object(), object())
    except TypeError as exc:
        raise TermCheckError(f"{name} must accept exactly (session, ctx): {exc}") from exc


def check_result_type(result: object, name: str) -> None:
    """The term returned a `TermResult`."""
    if not isinstance(result, TermResult):
        raise TermCheckError(
            f"{name} returned {type(result).__name__}; return TermResult(value, steps, explanation)"
        )


def check_finite(result: TermResult, name: str, session: Session) -> None:
    """The value and every step reward are finite floats."""
    values = [("value", result.value), *((f"steps[{k!r}]", v) for k, v in result.steps.items())]
    for label, v in values:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise TermCheckError(
                f"{name} gave {label} = {v!r} on session {session.session_id!r}; "
                "rewards must be finite numbers (guard divisions and clip before returning)"
            )


def check_attribution(result: TermResult, name: str, session: Session) -> None:
    """Step rewards are keyed by call ids the session really has."""
    unknown = set(result.steps) - session.call_ids()
    if unknown:
        raise TermCheckError(
            f"{name} credited {sorted(unknown)[:3]} on session {session.session_id!r}, which are not "
            "call ids of that session; key `steps` by ToolCall.call_id or LLMCall.call_id"
        )


def check_explanation(result: TermResult, name: str) -> None:
    """The explanation is a non-empty sentence of reasonable length."""
    if not isinstance(result.explanation, str) or not result.explanation.strip():
        raise TermCheckError(f"{name} gave no explanation; say in a few words why the value is what it is")
    if len(result.explanation) > MAX_EXPLANATION:
        raise TermCheckError(
            f"{name} gave a {len(result.explanation)}-character explanation; keep it under "
            f"{MAX_EXPLANATION} (summarise, e.g. 'fired on 3/8 calls')"
        )


def check_unchanged(before: str, session: Session, name: str) -> None:
    """The session's canonical digest is what it was before the call."""
    if digest(session) != before:
        raise TermCheckError(
            f"{name} changed session {session.session_id!r} (its params, metadata or data); "
            "terms are pure: copy anything you need to modify"
        )


def check_deterministic(first: TermResult, second: TermResult, name: str, session: Session) -> None:
    """A second call on the same session and an equal context gives an equal result."""
    if first != second:
        raise TermCheckError(
            f"{name} gave {first.value!r} then {second.value!r} on session {session.session_id!r}; "
            "terms must not depend on randomness, wall-clock time or hidden state (read time from ctx.now)"
        )
